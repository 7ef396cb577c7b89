"""`Model` (shared, read-only after load) and `Session` (one stream's mutable state)."""

import os
from dataclasses import dataclass

import anyio
import numpy as np
import wgpu

from kernels import Params, build_node
from kernels.wgsl import PACKED, elem_bytes
from resize.engine import LiveState, Plan, ResizeContext, ResizeFailure, propagate_resize, run_all
from resize.events import InputResized
from resize.shapes import numel_of
from resize.values import HOST_DTYPES, Scalar, SymInt, Tensor, ValueList

from .device import open_device
from .errors import (
    BrokenResourceError,
    BusyResourceError,
    ClosedResourceError,
    InputError,
    ModelFormatError,
    ResizeError,
    RuntimeFault,
)
from .graph import link
from .pte import read_program
from .stats import Counters, Statistics

STORAGE_NP = {"f32": np.float32, "i32": np.int32, "u32": np.uint32}
UNIFORM_ALIGN = 256  # minUniformBufferOffsetAlignment
COPY_ALIGN = 256  # spacing of outputs in the readback staging buffer
STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC


def _align(n, a):
    return -(-n // a) * a


def storage_dtype(dtype):
    from kernels.wgsl import STORAGE

    return STORAGE_NP[STORAGE[dtype]]


async def _read_source(source):
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        return await anyio.Path(source).read_bytes()
    if hasattr(source, "read"):
        return await anyio.to_thread.run_sync(source.read)
    raise TypeError(f"load() takes a path, bytes or a binary file object, not {type(source).__name__}")


def _constant_bytes(const, named, what):
    if const.key is not None:
        try:
            return named[const.key]
        except KeyError:
            raise ModelFormatError(f"{what}: named data {const.key!r} is not in the program") from None
    return const.blob[const.offset : const.offset + const.length]


def _to_storage(tensor, raw, what):
    """Bytes from the file as the GPU stores them (64-bit narrowed, bools widened, packed kept)."""
    n = numel_of(tensor.dims)
    if tensor.dtype in PACKED:
        if len(raw) < n:
            raise ModelFormatError(f"{what}: {len(raw)} bytes for {n} packed elements")
        data = np.zeros(_align(max(n, 4), 4), np.uint8)
        data[:n] = np.frombuffer(raw, np.uint8, n)
        return data
    target = storage_dtype(tensor.dtype)
    for source in (HOST_DTYPES[tensor.dtype], np.int64, np.float64, np.int32, np.float32):
        size = np.dtype(source).itemsize
        if len(raw) == n * size:
            host = np.frombuffer(raw, source, n)
            break
    else:
        if len(raw) < n * np.dtype(HOST_DTYPES[tensor.dtype]).itemsize:
            raise ModelFormatError(f"{what}: {len(raw)} bytes do not hold {n} {tensor.dtype} elements")
        host = np.frombuffer(raw, HOST_DTYPES[tensor.dtype], n)
    return host.astype(target)


@dataclass(frozen=True)
class IOSpec:
    """A method input or output: its dtype, maximum shape and which dims can change."""

    name: str
    dtype: str
    max_shape: tuple


async def load(source, method="forward", *, device=None, on_resize=None):
    """Load a `.pte` program and build its GPU plan. `device` picks an adapter by name substring;
    `on_resize(event)` is called with each `InputResized` event of every session."""
    data = await _read_source(source)
    model = Model(on_resize)
    await model._build(data, method, device)
    return model


class Model:
    """The shared part: weights, pipelines, the plan. Open streams with `session()`."""

    def __init__(self, on_resize=None):
        self._closed = False
        self._counters = Counters()
        self._sessions = set()
        self._next_session_id = 0
        self._event_sinks = []
        if on_resize is not None:
            self._event_sinks.append(on_resize)

    # --- load -------------------------------------------------------------------------------
    async def _build(self, data, method, device_name):
        program = await anyio.to_thread.run_sync(read_program, data)
        graph = link(program.method(method))
        self.graph = graph
        values = graph.values
        nodes = []
        for name, args in graph.calls:
            try:
                nodes.append(build_node(graph, name, args))
            except (TypeError, ValueError, IndexError, KeyError) as e:
                raise ModelFormatError(f"operator {name} with args {args}: {e}") from e
        self.plan = Plan(nodes, values)
        self.inputs = tuple(self._io_spec(v, f"input {i}") for i, v in enumerate(graph.inputs))
        self.outputs = tuple(self._io_spec(v, f"output {i}") for i, v in enumerate(graph.outputs))
        self._data_dependent = any(n.data_dependent for n in nodes)

        state = LiveState(len(values), len(graph.params), len(graph.dispatches))
        for vid, v in enumerate(values):
            if isinstance(v, Tensor):
                state.dims[vid] = tuple(v.dims)
            elif isinstance(v, SymInt):
                state.symints[vid] = v.initial
        host = {vid: np.zeros(values[vid].dims, storage_dtype(values[vid].dtype)) for vid in self._tensor_inputs()}
        ctx = ResizeContext(self.plan, state, host)
        try:
            run_all(self.plan, ctx)
        except (ResizeFailure, ValueError, TypeError, IndexError, KeyError) as e:
            raise ModelFormatError(f"building the plan at maximum shapes failed: {e}") from e
        self._initial_state = state

        self._adapter, self.device, self.device_info = await open_device(device_name)
        self._state_vids = sorted(
            {w for n in nodes for w in n.writes if isinstance(values[w], Tensor) and values[w].constant is not None}
        )
        self._make_buffers(program.named_data)
        self._pipelines = await self._compile_pipelines()
        self._default = Session(self)

    def _io_spec(self, vid, what):
        v = self.graph.values[vid]
        if isinstance(v, Tensor):
            return IOSpec(what, v.dtype, tuple(v.dims))
        return IOSpec(what, "int" if isinstance(v, SymInt) else type(v).__name__, ())

    def _tensor_inputs(self):
        return [v for v in self.graph.inputs if isinstance(self.graph.values[v], Tensor)]

    def _create_buffer(self, size, usage, label=""):
        self._counters.buffer_allocations += 1
        return self.device.create_buffer(size=max(_align(size, 4), 4), usage=usage, label=label)

    def _make_buffers(self, named):
        values, groups = self.graph.values, self.graph.groups
        sizes, self._buffer_key = {}, {}
        limit = self.device_info.max_storage_binding
        for vid, v in enumerate(values):
            if not isinstance(v, Tensor):
                continue
            nbytes = numel_of(v.dims) * elem_bytes(v.dtype)
            if nbytes > limit:
                raise ModelFormatError(
                    f"tensor {vid} {v.dtype}{list(v.dims)} needs {nbytes} bytes; the device binds at most {limit}"
                )
            key = groups.get(vid, ("value", vid))
            self._buffer_key[vid] = key
            sizes[key] = max(sizes.get(key, 4), nbytes)
        self._buffers = {key: self._create_buffer(size, STORAGE_USAGE, str(key)) for key, size in sizes.items()}
        self._constant_data = {}
        for vid, v in enumerate(values):
            if isinstance(v, Tensor) and v.constant is not None:
                data = _to_storage(v, _constant_bytes(v.constant, named, f"constant tensor {vid}"), f"tensor {vid}")
                if vid in self._state_vids:
                    self._constant_data[vid] = data  # sessions start their own copy from it
                if data.nbytes:
                    self.device.queue.write_buffer(self._buffers[self._buffer_key[vid]], 0, data)

    async def _compile_pipelines(self):
        pipelines = {}
        device = self.device

        def compile_one(src):
            module = device.create_shader_module(code=src)
            return device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})

        for d in self.graph.dispatches:
            if d.shader is None or d.shader in pipelines:
                continue
            try:
                pipelines[d.shader] = await anyio.to_thread.run_sync(compile_one, d.shader)
            except Exception as e:
                raise RuntimeFault(f"the kernel of {d.op} failed to compile: {e}\n--- shader ---\n{d.shader}") from e
        return pipelines

    def buffer(self, vid):
        return self._buffers[self._buffer_key[vid]]

    # --- public -----------------------------------------------------------------------------
    def session(self):
        """A new stream with its own live shapes, parameters, staging and state tensors."""
        self._check_open()
        return Session(self)

    async def execute(self, *inputs):
        """Run the method on the default session; returns a list of numpy arrays."""
        return await self._default.execute(*inputs)

    def statistics(self):
        return self._counters.freeze()

    def resize_events(self, max_buffer=256):
        """A receive stream of the `InputResized` events of every session: `async for e in it`.
        Events that find its buffer full are dropped and counted in `statistics().dropped_events`;
        close it (or leave its `with` block) to unsubscribe."""
        send, receive = anyio.create_memory_object_stream(max_buffer)
        self._event_sinks.append(send)
        return receive

    def _publish(self, events):
        for sink in list(self._event_sinks):
            for event in events:
                if callable(sink):
                    sink(event)
                    continue
                try:
                    sink.send_nowait(event)
                except anyio.WouldBlock:
                    self._counters.dropped_events += 1
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    self._event_sinks.remove(sink)
                    break

    def memory(self):
        """Bytes of GPU memory shared by every session (weights and activations)."""
        return sum(b.size for b in self._buffers.values())

    async def aclose(self):
        if self._closed:
            return
        self._closed = True
        for s in list(self._sessions):
            s._release()
        for b in self._buffers.values():
            b.destroy()
        await anyio.lowlevel.checkpoint()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    def _check_open(self):
        if self._closed:
            raise ClosedResourceError("the model is closed")


class Session:
    """One stream: live dims, SymInts, parameter uniforms, bind groups, staging, state tensors."""

    def __init__(self, model):
        self._model = model
        self.id = model._next_session_id
        model._next_session_id += 1
        self._closed = False
        self._busy = False
        self._counters = Counters()
        self.state = model._initial_state.copy()
        device, graph = model.device, model.graph
        self._state_buffers = {}
        for vid in model._state_vids:
            data = model._constant_data[vid]
            buf = model._create_buffer(data.nbytes, STORAGE_USAGE, f"state {vid}")
            device.queue.write_buffer(buf, 0, data)
            self._state_buffers[vid] = buf
        offsets, total = [], 0
        for size in graph.params:
            offsets.append(total)
            total += _align(size, UNIFORM_ALIGN)
        self._param_offsets = offsets
        self._arena = model._create_buffer(
            max(total, 16), wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST, "params"
        )
        for pid, data in enumerate(self.state.params):
            self._write_params(pid, data)
        self._bind_groups = [self._bind_group(d) if d.shader else None for d in graph.dispatches]
        self._out_offsets, total = [], 0
        for vid in graph.outputs:
            v = graph.values[vid]
            self._out_offsets.append(total)
            if isinstance(v, Tensor):
                total += _align(numel_of(v.dims) * elem_bytes(v.dtype), COPY_ALIGN)
        self._staging = model._create_buffer(
            max(total, 4), wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST, "readback"
        )
        self._commands = self._encode_list()
        model._sessions.add(self)

    def _buffer(self, vid):
        return self._state_buffers.get(vid) or self._model.buffer(vid)

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

    def _write_params(self, pid, data):
        if data:
            self._model.device.queue.write_buffer(self._arena, self._param_offsets[pid], data)

    def _encode_list(self):
        """The dispatches to encode, skipping inactive routes; rebuilt only when grids change."""
        commands, model = [], self._model
        for did, d in enumerate(model.graph.dispatches):
            grid = self.state.grids[did]
            if d.shader is not None:
                if grid[0] and grid[1] and grid[2]:
                    commands.append((model._pipelines[d.shader], self._bind_groups[did], grid))
            elif grid[0]:
                commands.append((self._buffer(d.src), self._buffer(d.dst), _align(grid[0], 4)))
        return commands

    # --- execute ----------------------------------------------------------------------------
    def _prepare(self, inputs):
        model = self._model
        graph = model.graph
        if len(inputs) != len(graph.inputs):
            raise InputError(f"expected {len(graph.inputs)} inputs ({self._describe()}), got {len(inputs)}")
        host = {}
        for i, (vid, x) in enumerate(zip(graph.inputs, inputs)):
            v = graph.values[vid]
            if not isinstance(v, Tensor):
                raise InputError(f"input {i}: non-tensor method inputs are not supported ({v})")
            try:
                arr = np.asarray(x)
            except Exception as e:
                raise InputError(f"input {i}: cannot be read as an array ({e})") from None
            kind, want = arr.dtype.kind, np.dtype(HOST_DTYPES[v.dtype]).kind
            ok = kind == want or (want in "iu" and kind in "iu") or (want == "f" and kind == "f")
            if not ok:
                raise InputError(f"input {i}: dtype {arr.dtype} given, expected {v.dtype} (shape up to {list(v.dims)})")
            if arr.ndim != len(v.dims):
                raise InputError(f"input {i}: rank {arr.ndim} (shape {list(arr.shape)}) given, expected rank {len(v.dims)} with shape up to {list(v.dims)}")
            for d, (n, m) in enumerate(zip(arr.shape, v.dims)):
                if not 1 <= n <= m:
                    raise InputError(f"input {i}: dim {d} is {n}, expected 1..{m} (shape {list(arr.shape)}, max {list(v.dims)})")
            target = storage_dtype(v.dtype)
            if want in "iu":
                if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
                    raise InputError(f"input {i}: values outside the int32 range the device stores")
            host[vid] = np.ascontiguousarray(arr, dtype=target)
        return host

    def _describe(self):
        return ", ".join(f"{s.dtype}{list(s.max_shape)}" for s in self._model.inputs)

    async def execute(self, *inputs):
        """Run one step on this session's state; returns the outputs at their live shapes."""
        if self._closed:
            raise ClosedResourceError("the session is closed")
        self._model._check_open()
        if self._busy:
            raise BusyResourceError("another execute is running on this session")
        self._busy = True
        try:
            return await self._execute(inputs)
        finally:
            self._busy = False

    async def _execute(self, inputs):
        model, plan = self._model, self._model.plan
        host = self._prepare(inputs)
        ctx = ResizeContext(plan, self.state, host)
        events = []
        for i, (vid, arr) in enumerate(host.items()):
            old = self.state.dims[vid]
            if arr.shape != old:
                events.append(InputResized(self.id, i, model.inputs[i].name, old, arr.shape))
        changed = set()
        if events or model._data_dependent:
            for vid, arr in host.items():
                ctx.set_dims(vid, arr.shape)
            changed = set(ctx.changed_values)
            try:
                await propagate_resize(plan, ctx, changed, fed=host.keys())
            except ResizeFailure as e:
                raise ResizeError(str(e)) from None
            except (ValueError, IndexError) as e:
                raise InputError(f"these inputs do not fit the model: {e}") from None
        with anyio.CancelScope(shield=True):
            outputs = await self._run_gpu(host, ctx, events)
        if events:
            model._publish(events)
        return outputs

    async def _run_gpu(self, host, ctx, events):
        model = self._model
        device, queue, graph = model.device, model.device.queue, model.graph
        for counters in (self._counters, model._counters):
            counters.executes += 1
            counters.resize_events += len(events)
            counters.hook_calls += ctx.hook_calls
        for pid in ctx.changed_params:
            self._write_params(pid, self.state.params[pid])
        if ctx.changed_grids:
            self._commands = self._encode_list()
        up = 0
        for vid, arr in host.items():
            if arr.nbytes:
                queue.write_buffer(self._buffer(vid), 0, arr)
                up += arr.nbytes
        encoder = device.create_command_encoder()
        compute = None
        for cmd in self._commands:
            if len(cmd) == 3 and not isinstance(cmd[2], int):
                if compute is None:
                    compute = encoder.begin_compute_pass()
                pipeline, bind_group, (x, y, z) = cmd
                compute.set_pipeline(pipeline)
                compute.set_bind_group(0, bind_group)
                compute.dispatch_workgroups(x, y, z)
            else:
                if compute is not None:
                    compute.end()
                    compute = None
                src, dst, nbytes = cmd
                encoder.copy_buffer_to_buffer(src, 0, dst, 0, nbytes)
        if compute is not None:
            compute.end()
        reads = []
        for vid, offset in zip(graph.outputs, self._out_offsets):
            v = graph.values[vid]
            if isinstance(v, Tensor):
                dims = self.state.dims[vid]
                nbytes = numel_of(dims) * elem_bytes(v.dtype)
                if nbytes:
                    encoder.copy_buffer_to_buffer(self._buffer(vid), 0, self._staging, offset, _align(nbytes, 4))
                reads.append((v, dims, offset, nbytes))
            else:
                reads.append((v, None, None, None))
        try:
            queue.submit([encoder.finish()])
            await self._staging.map_async("READ")
        except Exception as e:
            raise BrokenResourceError(f"the GPU failed: {e}") from e
        outputs, down = [], 0
        try:
            for v, dims, offset, nbytes in reads:
                if dims is None:
                    vid = graph.outputs[len(outputs)]
                    outputs.append(self.state.symints.get(vid, getattr(v, "value", None)))
                    continue
                raw = self._staging.read_mapped(offset, _align(nbytes, 4), copy=True) if nbytes else b""
                arr = np.frombuffer(raw, storage_dtype(v.dtype), numel_of(dims)).reshape(dims)
                outputs.append(arr.astype(HOST_DTYPES[v.dtype]))
                down += nbytes
        finally:
            self._staging.unmap()
        for counters in (self._counters, model._counters):
            counters.bytes_up += up
            counters.bytes_down += down
            counters.submits += 1
            counters.readbacks += 1
            counters.dispatches += len(self._commands)
        return outputs

    async def _read_tensor(self, vid):
        """Debugging aid: a copy of any tensor's live contents after the last execute."""
        v, dims = self._model.graph.values[vid], self.state.dims[vid]
        nbytes = _align(max(numel_of(dims) * elem_bytes(v.dtype), 4), 4)
        tmp = self._model.device.create_buffer(size=nbytes, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        encoder = self._model.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(self._buffer(vid), 0, tmp, 0, nbytes)
        self._model.device.queue.submit([encoder.finish()])
        await tmp.map_async("READ")
        raw = tmp.read_mapped(copy=True)
        tmp.unmap()
        tmp.destroy()
        if v.dtype in PACKED:
            return np.frombuffer(raw, np.uint8)
        return np.frombuffer(raw, storage_dtype(v.dtype))[: numel_of(dims)].reshape(dims)

    # --- lifetime ---------------------------------------------------------------------------
    def statistics(self):
        return self._counters.freeze()

    def memory(self):
        """Bytes of GPU memory this session owns (parameters, staging, state tensors)."""
        return self._arena.size + self._staging.size + sum(b.size for b in self._state_buffers.values())

    def _release(self):
        if self._closed:
            return
        self._closed = True
        self._model._sessions.discard(self)
        for b in (self._arena, self._staging, *self._state_buffers.values()):
            b.destroy()

    async def aclose(self):
        self._release()
        await anyio.lowlevel.checkpoint()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()
