"""`Session`: one stream's mutable state over a shared `Model`.

A session owns its live dims and SymInts, a uniform arena with every op's parameters, the bind
groups that point at them, its own input and state-tensor buffers (KV caches start from the
file's values), and a readback staging buffer. Weights, activations and pipelines are the model's.
"""

import anyio
import numpy as np
import wgpu

from pte_wgpu.kernels import Params
from pte_wgpu.kernels.wgsl import PACKED, elem_bytes
from pte_wgpu.resize.engine import ResizeContext, ResizeFailure, ShapeOverflow, check_fits, propagate_resize
from pte_wgpu.resize.events import InputResized
from pte_wgpu.resize.shapes import numel_of
from pte_wgpu.resize.values import HOST_DTYPES, Tensor

from .encoding import encode_dispatches, prepare
from .errors import BrokenResourceError, BusyResourceError, ClosedResourceError, InputError, ResizeError
from .scheduler import Step
from .stats import Counters
from .storage import STORAGE_USAGE, align, input_words, storage_dtype

RESIZED_KEPT = 64  # live states kept per model, by input shapes (the least recently used goes)
UNIFORM_ALIGN = 256  # minUniformBufferOffsetAlignment
COPY_ALIGN = 256  # spacing of outputs in the readback staging buffer


def check_inputs(model, inputs):
    """Validate a call's inputs against the method's (`model.inputs`); returns them as arrays in
    the device's storage types. A shape fits when it has the input's rank and at most its exported
    element count (ExecuTorch's capacity rule); an input read by an op that is not capacity-safe
    also keeps each dim within its exported maximum (`model._input_bounds`)."""
    specs = model.inputs
    if len(inputs) != len(specs):
        raise InputError(f"expected {len(specs)} inputs ({model.describe_inputs()}), got {len(inputs)}")
    arrays = []
    for i, (spec, device_dtype, bounded_by, x) in enumerate(zip(specs, model._input_storage, model._input_bounds, inputs)):
        if spec.dtype not in HOST_DTYPES:
            raise InputError(f"input {i}: non-tensor method inputs are not supported ({spec.dtype})")
        try:
            arr = np.asarray(x)
        except Exception as e:
            raise InputError(f"input {i}: cannot be read as an array ({e})") from None
        kind, want = arr.dtype.kind, np.dtype(HOST_DTYPES[spec.dtype]).kind
        limit = list(spec.max_shape)
        if not (kind == want or (want in "iu" and kind in "iu")):
            raise InputError(f"input {i}: dtype {arr.dtype} given, expected {spec.dtype} (exported shape {limit})")
        if arr.ndim != len(limit):
            raise InputError(
                f"input {i}: rank {arr.ndim} (shape {list(arr.shape)}) given, expected rank {len(limit)} (exported shape {limit})"
            )
        try:
            check_fits(arr.shape, limit, bounded_by, f"input {i}")
        except ResizeFailure as e:
            raise InputError(str(e)) from None
        stored = np.dtype(HOST_DTYPES[spec.dtype] if spec.dtype in PACKED else storage_dtype(device_dtype))
        if want in "iu" and arr.size and (arr.min() < np.iinfo(stored).min or arr.max() > np.iinfo(stored).max):
            raise InputError(f"input {i}: values outside the {stored} range the device stores")
        if want == "f":  # a float input's values are those of its own dtype, whatever the device stores
            arr = arr.astype(HOST_DTYPES[spec.dtype], copy=False)
        arrays.append(np.ascontiguousarray(arr, dtype=stored))
    return arrays


def _shapes(host):
    """The inputs' shapes for an error message: 'input 0 [3, 14, 15, 9], input 1 [2]'."""
    return ", ".join(f"input {i} {list(arr.shape)}" for i, arr in enumerate(host.values()))


class SessionBase:
    """What every kind of session shares: an id, counters, `aclose` and `async with`."""

    def __init__(self, model):
        self._model = model
        self.id = model._next_session_id
        model._next_session_id += 1
        self._closed = False
        self._busy = False
        self._counters = Counters()
        self.sequence_end = None  # the position after the last token ar.generate fed (where a recurrent state stands)

    def statistics(self):
        return self._counters.freeze()

    async def aclose(self):
        self._release()
        await anyio.lowlevel.checkpoint()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()


class Session(SessionBase):
    """One stream: `await session.execute(...)`; `async with model.session() as s:`."""

    profiler = None  # an async_runtime.tools.profile.Profiler set here encodes this session's steps (GPU timestamps)

    def __init__(self, model):
        super().__init__(model)
        self.state = model._initial_state.copy()
        graph, queue = model.graph, model.device.queue
        own_sizes = {vid: numel_of(graph.values[vid].dims) * elem_bytes(graph.values[vid].dtype) for vid in model._session_vids}
        offsets, total = [], 0
        for size in graph.params:
            offsets.append(total)
            total += align(size, UNIFORM_ALIGN)
        self._param_offsets = offsets
        arena_size = max(total, 16)
        self._out_offsets, total = [], 0
        for vid in graph.outputs:
            v = graph.values[vid]
            self._out_offsets.append(total)
            if isinstance(v, Tensor):
                total += align(numel_of(v.dims) * elem_bytes(v.dtype), COPY_ALIGN)
        staging_size = max(total, 4)
        self._reserved = sum(align(max(n, 4), 4) for n in own_sizes.values()) + arena_size + staging_size
        model._reserve(self._reserved, "a new session")
        self._own = {}  # value id -> this session's buffer (inputs, state tensors)
        for vid, nbytes in own_sizes.items():
            buf = model._create_buffer(nbytes, STORAGE_USAGE, f"session {vid}")
            if vid in model._constant_data:
                queue.write_buffer(buf, 0, model._constant_data[vid])
            self._own[vid] = buf
        self._arena = model._create_buffer(arena_size, wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST, "params")
        self._arena_host = bytearray(arena_size)  # what the arena holds, for span writes
        self._write_params(range(len(graph.params)))
        self._bind_groups = [self._bind_group(d) if d.shader else None for d in graph.dispatches]
        self._staging = model._create_buffer(staging_size, wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST, "readback")
        self._commands = self._command_list()
        model._sessions.add(self)

    # --- GPU objects ------------------------------------------------------------------------
    def _buffer(self, vid):
        return self._own.get(vid) or self._model.buffer(vid)

    def _bind_group(self, d):
        entries = []
        for i, b in enumerate(d.bindings):
            if isinstance(b, Params):
                resource = {"buffer": self._arena, "offset": self._param_offsets[b.index], "size": b.size}
            else:
                buf = self._buffer(b)
                resource = {"buffer": buf, "offset": 0, "size": buf.size}
            entries.append({"binding": i, "resource": resource})
        layout = self._model._pipelines[d.shader].get_bind_group_layout(0)
        return self._model.device.create_bind_group(layout=layout, entries=entries)

    def _rebind(self, vid, buf):
        """Point value `vid` at another buffer of this session's (a grown KV-cache pool)."""
        self._own[vid] = buf
        for did, d in enumerate(self._model.graph.dispatches):
            if d.shader is not None and vid in d.bindings:
                self._bind_groups[did] = self._bind_group(d)
        self._commands = self._command_list()

    def _write_params(self, pids):
        """Write these parameters as one span of the arena: a resize changes hundreds, and one
        `write_buffer` each cost more than the hooks that computed them (cProfile, SmolLM2)."""
        host, offsets, params = self._arena_host, self._param_offsets, self.state.params
        lo, hi = len(host), 0
        for pid in pids:
            data = params[pid]
            if data:
                at = offsets[pid]
                host[at : at + len(data)] = data
                lo, hi = min(lo, at), max(hi, at + len(data))
        if lo < hi:
            self._model.device.queue.write_buffer(self._arena, lo, memoryview(host)[lo:hi])

    def _command_list(self):
        """The step as runs: ("compute", [dispatch, ...]) and ("copy", src, dst, nbytes), skipping
        inactive routes and aliased copies; rebuilt only when a grid changes."""
        runs, model = [], self._model
        for did, d in enumerate(model.graph.dispatches):
            grid = self.state.grids[did]
            if d.shader is not None:
                if grid[0] and grid[1] and grid[2]:
                    if not runs or runs[-1][0] != "compute":
                        runs.append(("compute", []))
                    runs[-1][1].append((*prepare(model._pipelines[d.shader], self._bind_groups[did]), grid))
            elif grid[0] and did not in model._aliased:
                runs.append(("copy", self._buffer(d.src), self._buffer(d.dst), align(grid[0], 4)))
        self._dispatch_count = sum(len(r[1]) if r[0] == "compute" else 1 for r in runs)
        return runs

    # --- one step -----------------------------------------------------------------------------
    async def execute(self, *inputs):
        """Run one step on this session's state; returns the outputs (numpy arrays at their live
        shapes). Inputs are anything numpy.asarray takes, CPU torch tensors included.

        Cancellation: a call cancelled before its step reaches the GPU leaves the session exactly
        as it was; once the step is handed over it completes and the call returns normally."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self._closed:
            raise ClosedResourceError("the session is closed")
        self._model._check_open()
        if self._busy:
            raise BusyResourceError("another execute is running on this session")
        self._busy = True
        try:
            host = self._prepare(inputs)
            ctx, events = await self._resize(host)
            try:
                self._stage(host, ctx)
            except Exception as e:  # writes to a lost device
                self._model._scheduler.fail(e)
                raise BrokenResourceError(f"the GPU failed: {e}") from e
            outputs = await self._model._scheduler.run(Step(self))
        finally:
            self._busy = False
        if events:
            self._model._publish(events)
        return outputs

    def restart(self):
        """Start a new sequence: the model's recurrent states (`model.recurrent_states`) back to the
        file's values (zeros for a mutable buffer without any). KV caches need no reset: a new sequence's positions overwrite them."""
        if self._closed:
            raise ClosedResourceError("the session is closed")
        if self._busy:
            raise BusyResourceError("an execute is running on this session")
        model = self._model
        for vid in model.recurrent_states:
            buf = self._own[vid]
            model.device.queue.write_buffer(buf, 0, model._constant_data.get(vid, bytes(buf.size)))

    def _prepare(self, inputs):
        """Validate the inputs; value id -> array in the device's storage type."""
        return dict(zip(self._model.graph.inputs, check_inputs(self._model, inputs)))

    async def _resize(self, host):
        """Set the inputs' live dims and propagate; on failure the state is as before."""
        model = self._model
        events = [
            InputResized(self.id, i, model.inputs[i].name, self.state.dims[vid], arr.shape)
            for i, (vid, arr) in enumerate(host.items())
            if arr.shape != self.state.dims[vid]
        ]
        ctx = await self._propagate(host)
        for counters in (self._counters, model._counters):
            counters.executes += 1
            counters.resize_events += len(events)
            counters.hook_calls += ctx.hook_calls
        return ctx, events

    async def _propagate(self, host):
        """The resize sweep for new host inputs: only when a shape changed or hooks read host data.
        Without data-dependent hooks the live state is a function of the input shapes alone, so a
        shape set seen before (by any session of the model) is restored without running a hook:
        a server's prompts and a ragged batch's padded pass shapes come back again and again."""
        model = self._model
        ctx = ResizeContext(model.plan, self.state, host)
        if model._data_dependent or any(arr.shape != self.state.dims[vid] for vid, arr in host.items()):
            key = None if model._data_dependent else tuple(arr.shape for arr in host.values())
            known = model._resized.get(key)
            if known is not None:
                model._resized.move_to_end(key)
                ctx.restore(known)
                for counters in (self._counters, model._counters):
                    counters.resize_reuses += 1
                return ctx
            for vid, arr in host.items():  # check_inputs made sure they fit
                ctx.set_dims(vid, arr.shape)
            try:
                await propagate_resize(model.plan, ctx, set(ctx.changed_values), fed=host.keys())
            except ShapeOverflow as e:
                raise InputError(f"these inputs ({_shapes(host)}) do not fit the model: {e}") from None
            except ResizeFailure as e:
                raise ResizeError(str(e)) from None
            except (ValueError, IndexError) as e:
                raise InputError(f"these inputs do not fit the model: {e}") from None
            if key is not None:
                model._resized[key] = self.state.copy()
                if len(model._resized) > RESIZED_KEPT:
                    model._resized.popitem(last=False)
        return ctx

    def _stage(self, host, ctx):
        """Write changed parameters and the inputs' live bytes (this session's own buffers)."""
        queue = self._model.device.queue
        self._write_params(ctx.changed_params)
        if ctx.changed_grids:
            self._commands = self._command_list()
        up = 0
        for vid, arr in host.items():
            if arr.nbytes:
                arr = input_words(arr)
                queue.write_buffer(self._own[vid], 0, arr)
                up += arr.nbytes
        for counters in (self._counters, self._model._counters):
            counters.bytes_up += up

    def _encode(self, pieces, tail=(), outputs=True):
        """Encode this step into `pieces` (an encoding.Pieces, submitted as it goes), then `tail`
        (as `_encode_commands`), then, unless `outputs` is false, the outputs' live bytes into
        staging. Returns what `_read_outputs` needs."""
        self._encode_commands(pieces.encoder, tail=tail, pieces=pieces)
        encoder, graph, reads = pieces.encoder, self._model.graph, []
        for counters in (self._counters, self._model._counters):
            counters.dispatches += self._dispatch_count
        if not outputs:
            return reads
        for vid, offset in zip(graph.outputs, self._out_offsets):
            v = graph.values[vid]
            if not isinstance(v, Tensor):
                reads.append((vid, None, None, 0))
                continue
            dims = self.state.dims[vid]
            nbytes = numel_of(dims) * elem_bytes(v.dtype)
            if nbytes:
                encoder.copy_buffer_to_buffer(self._buffer(vid), 0, self._staging, offset, align(nbytes, 4))
            reads.append((vid, dims, offset, nbytes))
        return reads

    def _encode_commands(self, encoder, tail=(), pieces=None):
        """The graph's dispatches and copies: many dispatches per compute pass; then `tail`,
        dispatches (as `encode_dispatches` takes them) after the graph's. With `pieces` (an
        encoding.Pieces whose encoder is `encoder`), submitted in pieces as they are encoded; the
        caller goes on in `pieces.encoder`."""
        if self.profiler is not None:  # profiling: timestamped passes (profile.py), the tail its own
            self.profiler.encode(self, encoder)
            return self._encode_runs(encoder, tail=tail, commands=())
        self._encode_runs(encoder, tail=tail, pieces=pieces)

    def _encode_runs(self, encoder, timestamps=None, tail=(), commands=None, pieces=None):
        """`_commands` (or `commands`) into `encoder`, then the `tail` dispatches in the last
        compute pass (in one of their own if the step ends with a copy: a pass less to start on
        the GPU); with a `timestamps` query set, the first compute pass writes its beginning at
        index 0 and the last its end at index 1 (a whole step's GPU time); with `pieces`, as
        `_encode_commands`. Returns whether the step has a compute pass."""
        commands = self._commands if commands is None else commands
        if tail and (not commands or commands[-1][0] != "compute"):
            commands = [*commands, ("compute", ())]  # the tail's own pass
        first = last = None
        if timestamps is not None:
            computes = [i for i, run in enumerate(commands) if run[0] == "compute"]
            first, last = (computes[0], computes[-1]) if computes else (None, None)
        for i, run in enumerate(commands):
            if run[0] == "compute":
                writes = {}
                if i == first:
                    writes["beginning_of_pass_write_index"] = 0
                if i == last:
                    writes["end_of_pass_write_index"] = 1
                compute = encoder.begin_compute_pass(timestamp_writes={"query_set": timestamps, **writes} if writes else None)
                at = 0
                for cut in pieces.cuts(len(run[1])) if pieces is not None else ():
                    encode_dispatches(compute, run[1][at:cut])
                    compute.end()
                    pieces.submit()
                    encoder, at = pieces.encoder, cut
                    compute = encoder.begin_compute_pass()
                encode_dispatches(compute, run[1][at:])
                if i == len(commands) - 1:
                    encode_dispatches(compute, tail)
                compute.end()
            else:
                _, src, dst, nbytes = run
                encoder.copy_buffer_to_buffer(src, 0, dst, 0, nbytes)
        return first is not None

    def _read_outputs(self, reads):
        """Copy the outputs out of the mapped staging buffer, then unmap it."""
        graph, outputs, down = self._model.graph, [], 0
        try:
            for spec, (vid, dims, offset, nbytes) in zip(self._model.outputs, reads):
                v = graph.values[vid]
                if dims is None:
                    outputs.append(self.state.symints.get(vid, getattr(v, "value", None)))
                    continue
                # a copy: no view of the mapped memory outlives the unmap (Dawn frees that memory,
                # and a view kept by a traceback crashed the collector after a device loss)
                raw = self._staging.read_mapped(offset, align(nbytes, 4), copy=True) if nbytes else b""
                stored = HOST_DTYPES[v.dtype] if v.dtype in PACKED else storage_dtype(v.dtype)
                arr = np.frombuffer(raw, stored, numel_of(dims)).reshape(dims)
                host = HOST_DTYPES[spec.dtype]  # float16 may be stored widened
                outputs.append(arr if arr.dtype == host else arr.astype(host))
                down += nbytes
        finally:
            self._staging.unmap()
        for counters in (self._counters, self._model._counters):
            counters.bytes_down += down
            counters.readbacks += 1
        return outputs

    async def _read_tensor(self, vid):
        """Debugging aid: a copy of any tensor's live contents after the last execute."""
        model = self._model
        v, dims = model.graph.values[vid], self.state.dims[vid]
        nbytes = align(max(numel_of(dims) * elem_bytes(v.dtype), 4), 4)
        tmp = model.device.create_buffer(size=nbytes, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        encoder = model.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(self._buffer(vid), 0, tmp, 0, nbytes)
        model.device.queue.submit([encoder.finish()])
        await tmp.map_async("READ")
        raw = tmp.read_mapped(copy=True)
        tmp.unmap()
        tmp.destroy()
        if v.dtype in PACKED:
            return np.frombuffer(raw, np.uint8)
        return np.frombuffer(raw, storage_dtype(v.dtype))[: numel_of(dims)].reshape(dims)

    # --- lifetime -----------------------------------------------------------------------------
    def memory(self):
        """Bytes of GPU memory this session owns (parameters, staging, inputs, state tensors)."""
        return self._arena.size + self._staging.size + sum(b.size for b in self._own.values())

    def _release(self):
        if self._closed:
            return
        self._closed = True
        self._model._sessions.discard(self)
        self._model._reserved -= self._reserved
        for b in (self._arena, self._staging, *self._own.values()):
            b.destroy()
