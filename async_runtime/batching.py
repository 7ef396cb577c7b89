"""Continuous batching: every ready step of every session of a model in one ragged pass.

For a graph that qualifies (async_runtime.ragged), the model runs one program whose token axis
holds the concatenated rows of several sessions' steps. Each session holds the blocks of the
paged KV caches its positions are in (`Batcher`); its step becomes rows of a pass: decode rows
first, then prefill rows up to the token budget, so a long prompt is split into chunks across
passes and decodes keep flowing. Sessions join and leave between passes. A session's result is the rows of its own sequence, exactly what
its own run computes (row-wise kernels; matrix products may pick another route for more rows).

A pass whose row or sequence count differs from the last one re-runs every resize hook (~1.7 per
op), which costs more than the GPU work of a decode pass. So passes are padded to power-of-two
row and sequence counts (quarter steps from 16 to 32, `_bucket`), and the shape shrinks only
after SHRINK_AFTER passes that would fit a smaller one (or at once when a quarter would do, as
after a prefill): sessions drifting in and out of step then cost no resize at all. Padding rows run at position 0 of no sequence.
"""

from dataclasses import dataclass, field

import anyio
import numpy as np
import wgpu

from pte_wgpu.kernels.attention.kv_cache import KV_BLOCK, table_entries
from pte_wgpu.kernels.wgsl import elem_bytes
from pte_wgpu.resize.events import InputResized
from pte_wgpu.resize.shapes import numel_of

from .bursts import BURST_MAX, NO_PICK, Bursts
from .encoding import Pieces
from .errors import BusyResourceError, ClosedResourceError, InputError, MemoryBudgetError
from .kv_blocks import BlockPool, OutOfBlocks
from .ragged import SEQ_BLOCKS
from .sampling import Sampling
from .scheduler import Step
from .session import SessionBase, check_inputs

COPY_USAGE = wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
PADDING_SEQ = -1  # a padding row's sequence: the cache update skips it
UNKNOWN_TOKEN = -1  # what a position a step skipped holds, for the prefix cache: no prompt's token
DEFAULT_POSITIONS = 32768  # the pool's positions by default: 16 sessions of 2,048 positions, 512 of 64
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
    the paged KV caches (one pool of blocks, kept by `blocks`) and the composition of each pass.

    The pool is sized at load and never grows, so no pass waits for memory and no buffer is
    rebound: `kv_positions` positions (default: DEFAULT_POSITIONS, or one context if that is
    more), fewer where the memory budget or the device's binding limit allows fewer. A session
    holds the blocks of the positions it wrote; a step that needs blocks when none is free fails
    alone with OutOfBlocks (the session keeps what it holds, and runs on once blocks are freed),
    so callers that know their need set it aside before they start (`BatchedSession.reserve`, as
    `ar.generate` does)."""

    def __init__(self, model, ragged, runner, token_budget=None, kv_positions=None):
        self.model, self.ragged, self.runner = model, ragged, runner
        self.budget = min(token_budget or ragged.max_rows, ragged.max_rows)
        context = ragged.context
        self.block_bytes = {vid: KV_BLOCK * (model._constant_data[vid].nbytes // context) for vid in ragged.caches}
        self.bytes_a_block = sum(self.block_bytes.values())  # every cache's block of the same positions
        blocks = self._pool_blocks(kv_positions)
        model._reserve(blocks * self.bytes_a_block, "the KV-cache pool")
        for vid, size in self.block_bytes.items():
            self.runner._rebind(vid, model._create_buffer(blocks * size, runner._own[vid].usage, f"KV-cache pool {vid}"))
        # a block copied for copy-on-write goes through here: WebGPU copies between two buffers only
        self.copying = model._create_buffer(max(self.block_bytes.values()), COPY_USAGE, "KV-cache block copy")
        self.blocks = BlockPool(blocks, KV_BLOCK, context)
        self.entries = table_entries(context)
        # a step needs the outputs of its last row only: rows whose keys are cached need not run (a
        # recurrent state holds every row fed, so a model with one runs them all)
        self.prefixes = all(kind == "seqs" for kind, _ in ragged.output_axes) and not ragged.states
        # each recurrent state's initial value (a constant's, or zeros: a buffer of the program's
        # own), the bytes of a slot in its pool (one a session)
        self.state_initial = {vid: _initial_state(model, vid) for vid in ragged.states}
        self.state_bytes = {vid: data.nbytes for vid, data in self.state_initial.items()}
        self.state_slots = 0
        self.slots, self.free = 0, []  # sessions' slots: their sampler rows, their sequences in `blocks`, their states
        self.freed = anyio.Event()  # set when a session gives its blocks back
        self.shape, self.smaller = None, 0  # (rows, sequences) of the last pass
        self.bursts = Bursts(model, ragged, runner, 1) if Bursts.fits(model, ragged) else None

    def _pool_blocks(self, kv_positions):
        """Blocks of the pool: `kv_positions` (or the default) in whole blocks, at least one,
        within the binding limit and the memory budget."""
        model, context = self.model, self.ragged.context
        want = kv_positions or max(context, DEFAULT_POSITIONS)
        blocks = -(-int(want) // KV_BLOCK)
        limit = model.device_info.max_storage_binding
        blocks = min(blocks, min(limit // size for size in self.block_bytes.values()))
        if model.memory_budget is not None and kv_positions is None:
            blocks = min(blocks, (model.memory_budget - model._reserved) // self.bytes_a_block)
        if blocks < 1:
            raise MemoryBudgetError(
                f"the KV-cache pool needs at least one block of {self.bytes_a_block} bytes; "
                f"{model._reserved} of the {model.memory_budget}-byte memory budget are taken"
            )
        return blocks

    # --- slots --------------------------------------------------------------------------------
    def acquire(self):
        """A new session's slot: its sampler rows, and its sequence in the block pool."""
        if not self.free:
            self.free.append(self.slots)
            self.slots += 1
            if self.bursts is not None and self.bursts.slots < self.slots:
                self.bursts.grow(2 * self.bursts.slots)
            if self.state_bytes and self.state_slots < self.slots:
                self._grow_states(max(4, 2 * self.state_slots))
        slot = self.free.pop()
        self.blocks.open(slot)
        return slot

    def _grow_states(self, slots):
        """Pools of the recurrent states with room for `slots` sessions (their slots kept): a copy
        submitted after every pass so far, then the runner's bind groups over the new pools."""
        model, sizes = self.model, self.state_bytes
        model._reserve((slots - self.state_slots) * sum(sizes.values()), "the recurrent states' pools")
        pools = {vid: model._create_buffer(slots * size, self.runner._own[vid].usage, f"recurrent state pool {vid}") for vid, size in sizes.items()}
        encoder = model.device.create_command_encoder()
        for vid, pool in pools.items():
            if self.state_slots:
                encoder.copy_buffer_to_buffer(self.runner._own[vid], 0, pool, 0, self.state_slots * sizes[vid])
        model.device.queue.submit([encoder.finish()])
        for vid, pool in pools.items():
            self.runner._rebind(vid, pool)
        self.state_slots = slots

    def _start_states(self, slot):
        """`slot`'s recurrent states back to their initial values: its sequence starts at position 0."""
        for vid, size in self.state_bytes.items():
            self.model.device.queue.write_buffer(self.runner._own[vid], slot * size, self.state_initial[vid])

    def release(self, slot):
        self.blocks.close(slot)
        self.free.append(slot)
        self.freed.set()
        self.freed = anyio.Event()

    def slot_memory(self, slot):
        """Bytes of the pool the session on `slot` holds."""
        return len(self.blocks.table(slot)) * self.bytes_a_block

    def _take(self, step, first, tokens):
        """The blocks for positions first .. of `step`'s session that `tokens` go to, and the
        record of what they hold. Positions a step skips read as a new cache's, zeros. On
        OutOfBlocks the session keeps its positions before `first` (those from it on, which the
        step was to overwrite, are forgotten)."""
        slot, pool = step.session.slot, self.blocks
        known = pool.length(slot)
        if first < known:  # a caller rewinding its position
            pool.truncate(slot, first)
        self._prepare(slot, min(first, known), first + len(tokens))
        if first > known:
            self._clear(slot, known, first)
        pool.extend(slot, [UNKNOWN_TOKEN] * (first - known) + tokens)  # positions skipped: no prompt shares them

    def _clear(self, slot, start, end):
        """Zero positions start .. end - 1 of `slot`'s sequence in every cache (a block may hold
        another session's keys from before): one clear a cache and block they fall in."""
        table, encoder = self.blocks.table(slot), self.model.device.create_command_encoder()
        first = start
        while first < end:
            last = min(end, (first // KV_BLOCK + 1) * KV_BLOCK)  # to the end of first's block
            at = table[first // KV_BLOCK] * KV_BLOCK + first % KV_BLOCK
            for vid, size in self.block_bytes.items():
                row = size // KV_BLOCK
                encoder.clear_buffer(self.runner._own[vid], at * row, (last - first) * row)
            first = last
        self.model.device.queue.submit([encoder.finish()])

    def _prepare(self, slot, start, end):
        """Blocks for positions start .. end - 1 of `slot`'s sequence, copying first a shared
        block it is about to write."""
        copies = self.blocks.prepare(slot, start, end)
        if copies:
            encoder = self.model.device.create_command_encoder()
            for vid, size in self.block_bytes.items():
                buf = self.runner._own[vid]
                for src, dst in copies:
                    encoder.copy_buffer_to_buffer(buf, src * size, self.copying, 0, size)
                    encoder.copy_buffer_to_buffer(self.copying, 0, buf, dst * size, size)
            self.model.device.queue.submit([encoder.finish()])

    def _share_prefix(self, step):
        """A step from position 0 starts its session's sequence afresh, sharing the cached whole
        blocks its tokens start with: its rows run from the first position they do not hold. A
        sequence that already shares them (`start_shared`, with these tokens) keeps them."""
        slot, pool = step.session.slot, self.blocks
        shared, step.session.shared = step.session.shared, None
        if shared is not None and shared[1] == pool.length(slot) and shared[0] == tuple(step.tokens.tolist()):
            step.taken = shared[1]
            return
        need = pool.need(slot)
        need = need if need is not None and need >= len(step.tokens) else None
        try:
            step.taken = self._restart(slot, step.tokens.tolist(), need, need)
        except OutOfBlocks:  # the cached blocks it would revive are wanted elsewhere
            pass

    def start_shared(self, session, prompt, positions):
        """Start `session`'s empty sequence from `prompt` now, sharing the cached whole blocks it
        starts with, and set aside the rest of `positions`: OutOfBlocks (and the sequence as it
        was) unless they are free. Its first step, on these tokens from position 0, keeps them."""
        prompt = [int(t) for t in prompt]
        slot = session.slot
        session.shared = (tuple(prompt), self._restart(slot, prompt, positions, self.blocks.need(slot)))

    def _restart(self, slot, tokens, need, fallback):
        """Start `slot`'s sequence afresh from `tokens`, sharing the cached whole blocks they start
        with, setting aside blocks for `need` positions; returns the positions it holds. On
        OutOfBlocks it is started empty, setting aside blocks for `fallback` positions (or None)."""
        pool = self.blocks
        pool.close(slot)
        try:
            return pool.open(slot, tokens, need)
        except OutOfBlocks:
            pool.open(slot, need=fallback)
            raise

    def _tables(self, pieces, seqs):
        """The block tables of the pass's `seqs` sequences (the pieces' sessions, then padding)."""
        table = np.zeros((seqs, self.entries), np.int32)
        for b, (step, _, _) in enumerate(pieces):
            held = self.blocks.table(step.session.slot)
            table[b, : len(held)] = held
        return table.reshape(-1)

    # --- passes -------------------------------------------------------------------------------
    def compose(self, ready):
        """The pieces (step, first row, rows) of the next pass, decodes first, then prefill chunks,
        each with the blocks its rows write; and the steps refused for want of blocks (their
        `error` set)."""
        budget, pieces, refused = self.budget, [], []
        for step in sorted(ready, key=lambda s: s.remaining > 1):  # stable: arrival order within each
            if budget == 0 or len(pieces) == self.ragged.max_seqs:
                break
            if self.prefixes and step.pos == step.taken == 0:
                self._share_prefix(step)
            n = min(step.remaining, budget)
            try:
                self._take(step, step.pos + step.taken, step.tokens[step.taken : step.taken + n].tolist())
            except OutOfBlocks as e:
                step.error = e
                refused.append(step)
                continue
            if step.pos + step.taken == 0:
                self._start_states(step.session.slot)
            pieces.append((step, step.taken, n))
            budget -= n
        return pieces, refused

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
            np.concatenate([np.full(n, b) for b, (_, _, n) in enumerate(pieces)] + [np.full(pad, PADDING_SEQ)]),
            np.concatenate([np.cumsum(counts) - 1, np.zeros(pad_seqs)]),
            self._tables(pieces, seqs),
        )
        if self.state_bytes:  # each sequence's slot in the states' pools; -1: a padding sequence
            tables += (np.array([step.session.slot for step, _, _ in pieces] + [-1] * pad_seqs),)
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
        # a pass of picking steps only is read back as the ids the GPU picked, not as its outputs
        read_outputs = not picking or not all(step.picks for step, _, _ in pieces)
        reads = runner._encode(submitted, tail=tail, outputs=read_outputs)
        if picking:
            self.bursts.copy_ids(submitted.encoder, len(rows))
        submitted.finish()
        model._counters.submits += 1  # a pass, whatever its pieces
        model._counters.dispatches += len(tail)
        outputs = ()
        if read_outputs:
            await unless_lost(runner._staging.map_async("READ_NOSYNC"))
            outputs = runner._read_outputs(reads)
        else:
            model._counters.readbacks += 1  # the ids'
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
                if step.picks:  # picked on the GPU, or where there is no sampler (greedy only) on the host
                    _picked(step, [int(ids[b, 0]) if picking else int(_joined(step, ragged)[0].argmax())])
                    if step.picks:
                        continue
                    step.outputs = [np.array(step.ids, np.int64)]
                else:
                    step.outputs = _joined(step, ragged)
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
        left = min(step.picks for step, _, _ in pieces)  # tokens every step still picks
        passes = 1 + self._burst_blocks(pieces, 1, min(BURST_MAX, left) - 1)  # compose took the first pass's
        ctx = await self._stage_tables(pieces)
        rows = [step.row for step, _, _ in pieces]
        staging, finished, hooks, follows = 0, [], ctx.hook_calls, False
        tail = bursts.submit(rows, passes, staging)  # the sampler's dispatches a pass
        while True:
            left -= passes
            ahead = min(BURST_MAX, left) if left and not others_wait() else 0
            if ahead:
                ahead = self._burst_blocks(pieces, passes, ahead)
            if ahead:
                self.model.device.queue.write_buffer(self.runner._own[self.ragged.graph.inputs[SEQ_BLOCKS]], 0, self._tables(pieces, len(pieces)))
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
                written = ids[b, : passes - 1].tolist()  # the burst's passes fed its ids but the last
                self.blocks.extend(step.session.slot, [int(step.tokens[0])] + written if follows else written)
                _picked(step, ids[b].tolist())
                if not step.picks:
                    step.outputs = [np.array(step.ids, np.int64)]
                    finished.append(step)
            if not ahead:
                return finished
            passes, staging, hooks, follows = ahead, 1 - staging, 0, True

    def _burst_blocks(self, pieces, first, passes):
        """Take the blocks of burst passes first .. first + passes - 1 of every piece's step (pass
        0 writes position step.pos); the passes that got them: all, or none (a step that finds no
        block then fails alone, in a pass of its own)."""
        try:
            for step, _, _ in pieces:
                self._prepare(step.session.slot, step.pos + first, step.pos + first + passes)
        except OutOfBlocks:
            return 0
        return passes


def _joined(step, ragged):
    """A finished step's outputs: its parts from the passes it ran in, joined along their row axes."""
    return [parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)
            for (_, axis), parts in zip(ragged.output_axes, step.parts)]


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


# Past QUARTER_STEPS_FROM and up to twice that, passes are padded to quarter steps of it (20, 24, 28
# and 32 rows), where the products' subgroup kernels take time by the row (an fp16 export's); past
# that to powers of two, where the GEMM's 64-row tiles cost the same for 40 rows as for 64. H200,
# Llama-3.2-1B, greedy bursts (results/h200/ragged_pass_padding/): fp16 at 20 / 24 / 28 streams
# 2,920-2,943 / 3,493-3,545 / 4,068-4,118 -> 3,609-3,643 / 3,955-3,979 / 4,267-4,327 tokens/s; 4w with
# quarter steps everywhere +2-3% at 20 / 24 / 48 streams, but 40 streams -1 to -4%.
QUARTER_STEPS_FROM = 16


def _bucket(n, most):
    """The padded count of n rows or sequences (QUARTER_STEPS_FROM), at most `most`."""
    quarter = QUARTER_STEPS_FROM // 4
    if QUARTER_STEPS_FROM < n <= 2 * QUARTER_STEPS_FROM:
        return min(-(-n // quarter) * quarter, most)
    return min(1 << (n - 1).bit_length(), most)


class BatchedSession(SessionBase):
    """A session of a model that batches across sessions: its state is a slot (its blocks of the
    paged KV caches, its sampler rows); its steps run in the model's ragged passes. Same interface
    as `Session`."""

    def __init__(self, model):
        super().__init__(model)
        self._shapes = [spec.max_shape for spec in model.inputs]  # for InputResized events
        self.shared = None  # (prompt, cached positions) its sequence started from at `reserve`, sharing cached blocks
        self.slot = model._batcher.acquire()
        model._sessions.add(self)

    async def execute(self, *inputs):
        """Run one step (see `Session.execute`); it shares a pass with other sessions' steps."""
        return await self._run(inputs, 0)

    async def reserve(self, positions, wait=True, prompt=None):
        """Wait until the KV-cache blocks this session needs to hold `positions` positions are
        free, and set them aside for it (a generation that knows its length: it then never finds
        the pool full). OutOfBlocks at once if the whole pool is smaller, or, with `wait` false,
        if they are not free now. `prompt`: the tokens a session that holds none yet will start
        from at position 0; the cached whole blocks they start with are shared at once, not set
        aside again."""
        batcher, positions = self._model._batcher, int(positions)
        need, blocks = table_entries(positions), batcher.blocks.blocks
        if need > blocks:
            raise OutOfBlocks(need, blocks, f"{positions} positions need {need} KV cache blocks; the pool has {blocks} in all (load's kv_positions)")
        while True:
            if self._closed:  # (its slot may be another session's by now)
                raise ClosedResourceError("the session is closed")
            try:
                shares = batcher.prefixes and prompt is not None and self.shared is None
                if shares and len(prompt) <= positions and batcher.blocks.length(self.slot) == 0:
                    return batcher.start_shared(self, prompt, positions)
                return batcher.blocks.reserve(self.slot, positions)
            except OutOfBlocks:
                if not wait:
                    raise
                await batcher.freed.wait()

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
        fed = model._batcher.blocks.length(self.slot)
        if ragged.states and pos not in (0, fed):
            raise InputError(
                f"a step at position {pos}: this model carries a recurrent state (model.recurrent_states) that holds every "
                f"token fed so far, so a step on this session starts at position 0 or continues at position {fed}"
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

    def restart(self):
        """Start a new sequence (see `Session.restart`): a step at position 0 starts this
        session's recurrent states from their initial values itself, so nothing is left to do."""
        if self._closed:
            raise ClosedResourceError("the session is closed")

    def memory(self):
        """Bytes of GPU memory this session holds: its blocks of the KV caches (none once closed)."""
        return 0 if self._closed else self._model._batcher.slot_memory(self.slot)

    def _release(self):
        if self._closed:
            return
        self._closed = True
        self._model._sessions.discard(self)
        if not self._busy:  # else the running step releases it when it ends
            self._model._batcher.release(self.slot)


def _initial_state(model, vid):
    """A recurrent state's value at the start of a sequence: its constant's bytes, or zeros."""
    data = model._constant_data.get(vid)
    if data is None:
        v = model.graph.values[vid]
        data = np.zeros(numel_of(v.dims) * elem_bytes(v.dtype), np.uint8)
    return data
