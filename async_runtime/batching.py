"""Continuous batching: every ready step of every session of a model in one ragged pass.

For a graph that qualifies (async_runtime.ragged), the model runs one program whose token axis
holds the concatenated rows of several sessions' steps. Each session owns a slot of the pooled KV
caches; its step becomes rows of a pass: decode rows first, then prefill rows up to the token
budget, so a long prompt is split into chunks across passes and decodes keep flowing. Sessions
join and leave between passes. A session's result is the rows of its own sequence, exactly what
its own run computes (row-wise kernels; matrix products may pick another route for more rows).

A pass whose row or sequence count differs from the last one re-runs every resize hook (~1.7 per
op), which costs more than the GPU work of a decode pass. So passes are padded to power-of-two
row and sequence counts, and the shape shrinks only after SHRINK_AFTER passes that would fit a
smaller one (or at once when a quarter would do, as after a prefill): sessions drifting in and out
of step then cost no resize at all. Padding rows run at position 0 of no slot.
"""

from dataclasses import dataclass, field

import anyio
import numpy as np

from pte_wgpu.resize.events import InputResized

from .encoding import Pieces
from .errors import BusyResourceError, ClosedResourceError, InputError, MemoryBudgetError
from .bursts import BURST_MAX, NO_PICK, Bursts
from .sampling import Sampling
from .scheduler import Step
from .session import SessionBase, check_inputs
from .storage import align

STORAGE_OFFSET_ALIGN = 256  # minStorageBufferOffsetAlignment: slots start at multiples of it
PADDING_SLOT = -1  # a padding row's slot: the cache update skips it
SHRINK_AFTER = 16  # passes that would fit a smaller shape before the pass shape shrinks


@dataclass(eq=False)
class RaggedStep(Step):
    tokens: np.ndarray = None  # this step's token ids, flat
    pos: int = 0  # absolute position of its first token
    taken: int = 0  # rows already run in earlier passes
    parts: list = field(default_factory=list)  # per output: the arrays of its passes
    picks: int = 0  # tokens still to pick (BatchedSession.pick); 0: an ordinary step
    row: bytes = NO_PICK  # its sampler settings (Sampling.row)
    ids: list = field(default_factory=list)  # the tokens picked so far

    @property
    def remaining(self):
        return len(self.tokens) - self.taken


class Batcher:
    """The model's ragged runner: a session over the ragged program (its arena, staging, tables),
    the slot pool of the KV caches, and the composition of each pass."""

    def __init__(self, model, ragged, runner, token_budget=None):
        self.model, self.ragged, self.runner = model, ragged, runner
        self.budget = min(token_budget or ragged.max_rows, ragged.max_rows)
        self.slot_bytes = {vid: align(runner._own[vid].size, STORAGE_OFFSET_ALIGN) for vid in ragged.caches}
        for vid, size in self.slot_bytes.items():  # slot 0 is the runner's own buffer, realigned
            if size != runner._own[vid].size:
                self._replace(vid, size)
        # which caches start from nonzero file values: scanning a cache (94 MB a session at SmolLM2
        # size) for each new session took ~30 ms of the event loop, more than a request's decode
        self.nonzero = {vid: bool(model._constant_data[vid].any()) for vid in self.slot_bytes}
        self.capacity = 1
        self.free = [0]
        self.shape, self.smaller = None, 0  # (rows, sequences) of the last pass
        self.bursts = Bursts(model, ragged, runner, self.capacity) if Bursts.fits(model, ragged) else None

    # --- slots --------------------------------------------------------------------------------
    def acquire(self):
        if not self.free:
            self._grow()
        slot = self.free.pop()
        self._reset(slot)
        return slot

    def release(self, slot):
        self.free.append(slot)

    def slot_memory(self):
        return sum(self.slot_bytes.values())

    def _grow(self):
        """More slots: new pool buffers holding the old slots, bound in place of the old ones."""
        model, limit = self.model, self.model.device_info.max_storage_binding
        most = min(limit // size for size in self.slot_bytes.values())
        budget = model.memory_budget
        room = most if budget is None else min(most, self.capacity + (budget - model._reserved) // self.slot_memory())
        capacity = min(self.capacity * 2, room)
        if capacity <= self.capacity:
            why = f"the {budget}-byte memory budget" if room < most else f"the device's {limit}-byte binding limit"
            raise MemoryBudgetError(
                f"a new session needs a KV-cache slot of {self.slot_memory()} bytes; {self.capacity} slots are in use "
                f"and {why} allows no more"
            )
        model._reserve((capacity - self.capacity) * self.slot_memory(), "more KV-cache slots")
        encoder = model.device.create_command_encoder()
        for vid, size in self.slot_bytes.items():
            old = self.runner._own[vid]
            new = self._replace(vid, capacity * size)
            encoder.copy_buffer_to_buffer(old, 0, new, 0, self.capacity * size)
        model.device.queue.submit([encoder.finish()])
        self.free.extend(range(capacity - 1, self.capacity - 1, -1))
        self.capacity = capacity
        if self.bursts is not None:
            self.bursts.grow(capacity)

    def _replace(self, vid, size):
        new = self.model._create_buffer(size, self.runner._own[vid].usage, f"KV-cache pool {vid}")
        self.runner._rebind(vid, new)
        return new

    def _reset(self, slot):
        """A new session's slot starts from the file's values of the caches, like its own buffers would."""
        model, encoder = self.model, None
        for vid, size in self.slot_bytes.items():
            data, buf = model._constant_data[vid], self.runner._own[vid]
            if self.nonzero[vid]:
                model.device.queue.write_buffer(buf, slot * size, data)
                continue
            encoder = encoder or model.device.create_command_encoder()
            encoder.clear_buffer(buf, slot * size, align(data.nbytes, 4))
        if encoder is not None:
            model.device.queue.submit([encoder.finish()])

    # --- passes -------------------------------------------------------------------------------
    def compose(self, ready):
        """The pieces (step, first row, rows) of the next pass: decodes first, then prefill chunks."""
        budget, pieces = self.budget, []
        for step in sorted(ready, key=lambda s: s.remaining > 1):  # stable: arrival order within each
            if budget == 0 or len(pieces) == self.ragged.max_seqs:
                break
            n = min(step.remaining, budget)
            pieces.append((step, step.taken, n))
            budget -= n
        return pieces

    def _pass_shape(self, rows, seqs):
        """(rows, sequences) of the next pass: padded, and kept while smaller passes come."""
        want = (_bucket(rows, self.ragged.max_rows), _bucket(seqs, self.ragged.max_seqs))
        cur = self.shape
        if cur is not None and want[0] <= cur[0] and want[1] <= cur[1] and 4 * want[0] > cur[0]:
            self.smaller = self.smaller + 1 if want != cur else 0
            if self.smaller < SHRINK_AFTER:
                return cur
        elif cur is not None and 4 * want[0] > cur[0]:
            want = (max(want[0], cur[0]), max(want[1], cur[1]))
        self.shape, self.smaller = want, 0
        return want

    async def _stage_tables(self, pieces):
        """Write the pass's tables (tokens, row positions, row slots, sequences' last rows) and
        resize the runner to its padded shape; returns the resize context."""
        model, runner = self.model, self.runner
        counts = [n for _, _, n in pieces]
        rows, seqs = self._pass_shape(sum(counts), len(counts))
        pad, pad_seqs = rows - sum(counts), seqs - len(counts)
        tables = (
            np.concatenate([step.tokens[start : start + n] for step, start, n in pieces] + [np.zeros(pad)]).reshape(1, -1),
            np.concatenate([np.arange(step.pos + start, step.pos + start + n) for step, start, n in pieces] + [np.zeros(pad)]),
            np.concatenate([np.full(n, step.session.slot) for step, _, n in pieces] + [np.full(pad, PADDING_SLOT)]),
            np.concatenate([np.cumsum(counts) - 1, np.zeros(pad_seqs)]),
        )
        host = {vid: np.ascontiguousarray(t, dtype=np.int32) for vid, t in zip(model.graph.inputs, tables)}
        ctx = await runner._propagate(host)
        model._counters.hook_calls += ctx.hook_calls
        runner._stage(host, ctx)
        return ctx

    async def run_pass(self, pieces, unless_lost, others_wait=lambda: False):
        """Run one pass, or bursts when every piece is a picking step's single decode token
        (`others_wait()`: whether steps outside the pieces wait, which ends the bursts); returns
        the steps it finished. A picking step whose last input rows run in the pass picks its
        first token on the GPU, after the pass."""
        if self.bursts is not None and all(step.picks and n == 1 == step.remaining for step, _, n in pieces):
            return await self._run_bursts(pieces, unless_lost, others_wait)
        model, runner, ragged = self.model, self.runner, self.ragged
        rows = [step.row if step.picks and start + n == len(step.tokens) else NO_PICK for step, start, n in pieces]
        picking = self.bursts is not None and any(row is not NO_PICK for row in rows)
        ctx = await self._stage_tables(pieces)
        submitted = Pieces(model.device)
        tail = self.bursts.tail(rows) if picking else ()
        reads = runner._encode(submitted, tail=tail)
        if picking:
            self.bursts.copy_ids(submitted.encoder, len(rows))
        submitted.finish()
        model._counters.submits += 1  # a pass, whatever its pieces
        model._counters.dispatches += len(tail)
        await unless_lost(runner._staging.map_async("READ_NOSYNC"))
        outputs = runner._read_outputs(reads)
        if picking:
            await unless_lost(self.bursts.stagings[0].map_async("READ_NOSYNC"))
            ids = self.bursts.read(len(rows), 1)
        finished, first = [], 0
        for b, (step, start, n) in enumerate(pieces):
            for k, ((kind, axis), arr) in enumerate(zip(ragged.output_axes, outputs)):
                if len(step.parts) <= k:
                    step.parts.append([])
                # views of the pass's output (each step's own rows), no copies
                at = (slice(None),) * axis
                if kind == "seqs":  # only the last chunk's row counts
                    step.parts[k] = [arr[(*at, slice(b, b + 1))]]
                else:
                    step.parts[k].append(arr[(*at, slice(first, first + n))])
            first += n
            step.taken += n
            _count(step, ctx.hook_calls, runner._dispatch_count)
            if step.remaining == 0:
                result = [
                    parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)
                    for (_, axis), parts in zip(ragged.output_axes, step.parts)
                ]
                if step.picks:  # picked on the GPU, or where there is no sampler (greedy only) on the host
                    _picked(step, [int(ids[b, 0]) if picking else int(result[0].argmax())])
                    if step.picks:
                        continue
                    result = [np.array(step.ids, np.int64)]
                step.outputs = result
                finished.append(step)
        return finished

    async def _run_bursts(self, pieces, unless_lost, others_wait):
        """Bursts of up to BURST_MAX decode passes of these single-token picking steps, one readback
        each. While every step picks more after a burst and no other step waits to join, the next
        burst is submitted before this one's readback (into the other staging buffer), so the GPU
        runs on through it: on an H100 a burst's readback and the next one's first encoding left
        it idle ~2.5 ms per 32 passes. The next burst's passes start from the tables the GPU
        advanced, as the passes of one burst do."""
        model, bursts = self.model, self.bursts
        ctx = await self._stage_tables(pieces)
        rows = [step.row for step, _, _ in pieces]
        left = min(step.picks for step, _, _ in pieces)  # tokens every step still picks
        passes, staging, finished, hooks = min(BURST_MAX, left), 0, [], ctx.hook_calls
        tail = bursts.submit(rows, passes, staging)  # the sampler's dispatches a pass
        while True:
            left -= passes
            ahead = min(BURST_MAX, left) if left and not others_wait() else 0
            if ahead:
                bursts.submit(rows, ahead, 1 - staging)
            dispatches = passes * (self.runner._dispatch_count + tail)
            model._counters.submits += passes
            model._counters.readbacks += 1
            model._counters.dispatches += dispatches
            await unless_lost(bursts.stagings[staging].map_async("READ_NOSYNC"))
            ids = bursts.read(len(pieces), passes, staging)
            for b, (step, _, _) in enumerate(pieces):
                step.taken += 1
                _count(step, hooks, dispatches)
                _picked(step, ids[b].tolist())
                if not step.picks:
                    step.outputs = [np.array(step.ids, np.int64)]
                    finished.append(step)
            if not ahead:
                return finished
            passes, staging, hooks = ahead, 1 - staging, 0


def _count(step, hook_calls, dispatches):
    c = step.session._counters
    c.submits, c.readbacks, c.dispatches = c.submits + 1, c.readbacks + 1, c.dispatches + dispatches
    c.hook_calls += hook_calls  # the pass's resize served every session in it


def _picked(step, ids):
    """A picking step took these tokens: the last is its next input, at the position after."""
    step.ids.extend(ids)
    step.picks -= len(ids)
    step.pos += step.taken + len(ids) - 1
    step.tokens, step.taken, step.parts = np.array(ids[-1:], np.int64), 0, []


def _bucket(n, most):
    """The power of two at or above n, at most `most`."""
    return min(1 << (n - 1).bit_length(), most)


class BatchedSession(SessionBase):
    """A session of a model that batches across sessions: its state is a KV-cache slot; its steps
    run in the model's ragged passes. Same interface as `Session`."""

    def __init__(self, model):
        super().__init__(model)
        self._shapes = [spec.max_shape for spec in model.inputs]  # for InputResized events
        self.slot = model._batcher.acquire()
        model._sessions.add(self)

    async def execute(self, *inputs):
        """Run one step (see `Session.execute`); it shares a pass with other sessions' steps."""
        return await self._run(inputs, 0)

    async def greedy(self, *inputs, n):
        """`pick` with greedy choice: the ids a host loop of `execute` and `logits.argmax()` would
        pick, bitwise."""
        return await self.pick(*inputs, n=n)

    async def pick(self, *inputs, n, sampling=None, history=None):
        """Feed these inputs (tokens [1, S] at input_pos, as `execute`), then pick `n` tokens with
        `sampling` (a `Sampling`; None: greedy), feeding each but the last: the ids [n] (int64).
        The GPU picks them where the model allows (`model.gpu_sampling`): decode passes run in
        bursts, several passes a submit, reading back ids only. `history` (the prompt's ids) starts
        a generation: the session's token counts for the penalties start from it. After it, the
        KV cache holds the inputs and the first n - 1 ids."""
        if int(n) < 1:
            raise InputError(f"pick needs n >= 1 tokens to pick, got {n}")
        bursts = self._model._batcher.bursts
        sampling = sampling or Sampling()
        if bursts is None and not (sampling.greedy and not sampling.adjusts):
            raise InputError("this model picks tokens on the GPU only greedily: it has no GPU sampler (model.gpu_sampling)")
        if bursts is not None:
            sampling.check_vocab(bursts.vocab)
            if history is not None:
                bursts.start(self.slot, sampling, history)
        return (await self._run(inputs, int(n), sampling.row(self.slot, bursts.vocab if bursts else 0)))[0]

    async def _run(self, inputs, picks, row=NO_PICK):
        await anyio.lowlevel.checkpoint_if_cancelled()
        model = self._model
        if self._closed:
            raise ClosedResourceError("the session is closed")
        model._check_open()
        if self._busy:
            raise BusyResourceError("another execute is running on this session")
        ragged = model._batcher.ragged
        arrays = self._prepare(inputs)
        tokens, pos = arrays[ragged.tokens_input], int(arrays[ragged.pos_input].reshape(-1)[0])
        n = tokens.shape[1] + max(picks - 1, 0)  # the positions this call fills
        if pos < 0 or pos + n > ragged.context:
            raise InputError(
                f"these inputs do not fit the model: positions {pos}..{pos + n - 1} "
                f"do not fit the KV cache of {ragged.context} positions"
            )
        events = [
            InputResized(self.id, i, model.inputs[i].name, tuple(old), arr.shape)
            for i, (old, arr) in enumerate(zip(self._shapes, arrays))
            if tuple(old) != arr.shape
        ]
        self._busy = True
        try:
            step = RaggedStep(self, tokens=tokens.reshape(-1), pos=pos, picks=picks, row=row)
            outputs = await model._scheduler.run(step)
        finally:
            self._busy = False
            if self._closed:
                model._batcher.release(self.slot)
        self._shapes = [a.shape for a in arrays]
        for counters in (self._counters, model._counters):
            counters.executes += 1
            counters.resize_events += len(events)
        if events:
            model._publish(events)
        return outputs

    def _prepare(self, inputs):
        return check_inputs(self._model, inputs)

    def memory(self):
        """Bytes of GPU memory this session owns: its slot of the KV caches."""
        return self._model._batcher.slot_memory()

    def _release(self):
        if self._closed:
            return
        self._closed = True
        self._model._sessions.discard(self)
        if not self._busy:  # else the running step releases it when it ends
            self._model._batcher.release(self.slot)
