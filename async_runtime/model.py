"""`load` and `Model`: the shared, read-only part of a loaded program (weights, pipelines, plan)."""

import os
from collections import OrderedDict
from dataclasses import dataclass, replace

import anyio
import numpy as np
import wgpu

from pte_wgpu.kernels import adapter_class, build_node, fuse, fuse_ragged
from pte_wgpu.kernels.fusion import DQ8_LINEAR, DQ8_LINEAR_RESIDUAL
from pte_wgpu.kernels.matmul.f16_matrix import F16_MATRIX
from pte_wgpu.kernels.matmul.int8_matrix import INT8_MATRIX
from pte_wgpu.kernels.matmul.q4_linear import scales_in_row_quads
from pte_wgpu.kernels.registry import HalfUnsupported
from pte_wgpu.kernels.wgsl import elem_bytes
from pte_wgpu.resize.engine import LiveState, Plan, ResizeContext, run_all
from pte_wgpu.resize.shapes import numel_of
from pte_wgpu.resize.values import SymInt, Tensor

from .batching import Batcher, BatchedSession
from . import backend
from .backend import SUBGROUP_FEATURES
from .device import open_device
from .errors import (
    BrokenResourceError,
    ClosedResourceError,
    MemoryBudgetError,
    ModelFormatError,
    UnsupportedOperatorError,
)
from .program.graph import PRECISIONS, has_half, link, recurrent_states, widen_half
from .program.planning import carried_state, plan_memory, read_first
from .program.tables import split_constants
from .ragged import NotRagged, plan_ragged
from .pipelines import compile_pipelines, dispatch_each_once
from .program.pte import read_program
from .progress import LoadProgress
from .scheduler import Scheduler
from .session import Session
from .stats import Counters
from .storage import STORAGE_USAGE, align, constant_rows, rearranged, storage_dtype, to_storage
from .uploads import StagedUploads


@dataclass(frozen=True)
class IOSpec:
    """A method input or output: its dtype and maximum shape."""

    name: str
    dtype: str
    max_shape: tuple


READ_CHUNK = 1 << 24  # bytes per read of a file, between progress reports
DQ8_PRODUCTS = (DQ8_LINEAR, DQ8_LINEAR_RESIDUAL)  # dynamic-int8 x 4-bit products, whose prompts take f16 matrices where the device has them


async def _read_source(source, progress):
    if isinstance(source, (bytes, bytearray, memoryview)):
        progress("read", 1, 1)
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        return await anyio.to_thread.run_sync(_read_file, source, progress)
    if hasattr(source, "read"):
        data = await anyio.to_thread.run_sync(source.read)
        progress("read", 1, 1)
        return data
    raise TypeError(f"load() takes a path, bytes or a binary file object, not {type(source).__name__}")


def _read_file(path, progress):
    """The file's bytes, read in chunks with a progress report after each (a worker thread). The
    buffer is not zero-filled first (a bytearray is, holding the GIL: on an H100 host 300 ms for
    SmolLM2's 650 MB, the event loop stopped); its pages are touched by the reads, without the GIL."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data, done = np.empty(size, np.uint8), 0
        view = memoryview(data)
        progress.from_worker("read", 0, size)
        while done < size:
            n = f.readinto(view[done : done + READ_CHUNK])
            if not n:
                raise ModelFormatError(f"{path}: the file shrank to {done} bytes while it was read")
            done += n
            progress.from_worker("read", done, size)
    return data


async def load(
    source,
    method="forward",
    *,
    device=None,
    on_resize=None,
    batch_submits=True,
    memory_budget=None,
    max_batch=32,
    token_budget=None,
    kv_positions=None,
    progress=None,
    precision="auto",
    batch_invariant=True,
):
    """Load a `.pte` program and build its GPU plan.

    `device` picks an adapter by a substring of its name; `on_resize(event)` is called with each
    `InputResized` event of every session. By default concurrent sessions' ready steps share one
    submit, and when the graph allows it (a KV-cache decoder, see `async_runtime.ragged`) one
    ragged pass of up to `max_batch` sequences and `token_budget` rows (default: the export's
    maximum sequence length); `model.batching` says which ("ragged", "submits" or "off") and
    `model.batching_note` why not ragged. A ragged model keeps its sessions' KV caches in one pool
    of blocks of positions, allocated here: `kv_positions` positions (default: 32,768, or one
    context if that is more; within the memory budget), each session holding the blocks of the
    positions it has written (async_runtime.batching). `batch_submits=False` gives every step its
    own submit and pass (for comparison). `memory_budget` caps the GPU bytes of the model and all its
    sessions: past it, load or `session()` raises MemoryBudgetError before allocating anything.
    `progress(phase, done, total)` is called on the event loop's thread as the load goes through
    "read", "upload", "compile" and "warm-up" (see `async_runtime.progress`).
    `precision="auto"` stores float16 tensors as f16 where the adapter has `shader-f16` (and every
    op of the model an f16 kernel), else as f32; "f32" always widens them; "f16-sums" stores them
    as "auto" does, and a GPU's tiled products of f16 operands (an fp16 export's linears past 32
    rows) then sum each K step of 16 in f16 before adding it to their f32 sums: 1.1-1.3x faster,
    each output within about 2^-10 of the sum of its products' magnitudes (as torch's CUDA fp16
    matmuls with reduced-precision reductions allowed, its default). `model.precision` says which
    was chosen ("f16", "f16-sums" or "f32") and `model.precision_note` why f32.
    `batch_invariant=True` keeps each row of a pass of up to 16 rows (16 decode streams) bitwise
    what it gets alone, whatever the other rows; `False` lets a device with f16 tensor cores (Dawn
    on NVIDIA) run the products of more than 8 rows on them (those of K >= 2,048: 1B models and up,
    4w exports of f16 activations and fp16 exports): 16 streams 1.1-1.5x faster, a stream's
    logits within rounding of, not bitwise, what it gets alone."""
    if not isinstance(batch_invariant, bool):
        raise ValueError(f"load(): batch_invariant must be True or False, got {batch_invariant!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"load(): precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")
    for name, value in (("max_batch", max_batch), ("token_budget", token_budget), ("kv_positions", kv_positions)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"load(): {name} must be a positive int, got {value!r}")
    report = LoadProgress(progress)
    data = await _read_source(source, report)
    model = Model(on_resize, batch_submits, memory_budget, batch_invariant)
    try:
        await model._build(data, method, device, max_batch, token_budget, report, precision, kv_positions)
    except BaseException:
        model._release()  # what the failed load allocated
        raise
    return model


DEVICE_LOST = "device is lost"  # wgpu-native: "Parent device is lost", creating a buffer on a destroyed device


def is_out_of_memory(error):
    """Whether a wgpu error from creating a buffer means the device has no memory left: wgpu-native
    on NVIDIA's Vulkan driver reports it as a validation error ("Not enough memory left"), not as
    GPUOutOfMemoryError."""
    return isinstance(error, wgpu.GPUOutOfMemoryError) or "not enough memory" in str(error).lower()


class Model:
    """The shared part: weights, activations, pipelines and the plan. Streams are `session()`s;
    `execute` runs on a default session."""

    def __init__(self, on_resize=None, batch_submits=True, memory_budget=None, batch_invariant=True):
        self._closed = False
        self.memory_budget = memory_budget
        self.batch_invariant = batch_invariant  # load()'s
        self._reserved = 0  # bytes of the model and its open sessions
        self._counters = Counters()
        self._resized = OrderedDict()  # input shapes -> the LiveState the hooks computed for them
        self._sessions = set()
        self._buffers = {}  # the shared buffers, made at load (_make_buffers)
        self._batcher = None
        self._next_session_id = 0
        self._event_sinks = [on_resize] if on_resize is not None else []
        self._scheduler = Scheduler(self, batch_submits)

    # --- load ---------------------------------------------------------------------------------
    async def _build(self, data, method, device_name, max_batch=32, token_budget=None, progress=None, precision="auto", kv_positions=None):
        progress = progress or LoadProgress()
        # the graph work is Python on the CPU, tens of ms a step for a real model: worker threads,
        # so the event loop keeps running (it gets the GIL back at every switch interval)
        program = await anyio.to_thread.run_sync(read_program, data)
        relink = lambda: link(program.method(method))  # noqa: E731
        linked = await anyio.to_thread.run_sync(relink)
        self.inputs = tuple(_io_spec(linked.values[v], f"input {i}") for i, v in enumerate(linked.inputs))
        self.outputs = tuple(_io_spec(linked.values[v], f"output {i}") for i, v in enumerate(linked.outputs))
        self._adapter, self.device, info = await open_device(device_name)
        self.kernels = adapter_class(info.adapter_type)  # which kernel variants
        self.subgroups = any(f in info.features for f in SUBGROUP_FEATURES)  # variants that need subgroup operations may be built
        self.int8_matrices = INT8_MATRIX in info.subgroup_matrices  # and those of int8 products on tensor cores
        # and those of f16 products (where float16 is stored as f16, and dynamic-int8 prompts' products)
        self.f16_matrices = F16_MATRIX in info.subgroup_matrices and "shader-f16" in info.features
        self._binding_limit, self._storage_buffers = info.max_storage_binding, info.max_storage_buffers
        half = precision != "f32" and has_half(linked) and "shader-f16" in info.features
        sums = precision == "f16-sums"
        self.precision_note = "" if half else _why_f32(precision, linked, info)
        try:
            graph, nodes, ragged = await anyio.to_thread.run_sync(self._build_nodes, linked, half, max_batch, sums)
        except HalfUnsupported as e:  # the ops already built changed `linked`: link afresh
            half, self.precision_note = False, f"f32: {e}"
            linked = await anyio.to_thread.run_sync(relink)
            graph, nodes, ragged = await anyio.to_thread.run_sync(self._build_nodes, linked, half, max_batch, sums)
        self.precision = ("f16-sums" if sums else "f16") if half else "f32"
        self.f16_matrices = self.f16_matrices and (half or any(name in DQ8_PRODUCTS for name, _ in graph.calls))
        self.device_info = replace(info, precision=self.precision)
        values = graph.values
        self.plan = await anyio.to_thread.run_sync(Plan, nodes, values)
        self._data_dependent = any(n.data_dependent for n in nodes)
        # Per input, the op that keeps each of its dims within the exported maximum (None: only its
        # element count is bounded). A ragged model's inputs feed the batcher's tables, not the graph.
        if ragged is not None:
            self._input_bounds = ("ragged batching",) * len(self.inputs)
        else:
            self._input_bounds = tuple(self.plan.bounded.get(vid) for vid in graph.inputs)
        self._initial_state = await anyio.to_thread.run_sync(self._plan_at_max_shapes)

        state_vids = {w for n in nodes for w in n.writes if isinstance(values[w], Tensor) and values[w].constant is not None}
        # A copy of a constant (et_vk.prepack) that an op then writes (a KV cache behind
        # llama::update_cache, a recurrent state) is state too: each session's copy starts from the constant.
        carried = carried_state(nodes)
        self._state_copies = {
            did: d for did, d in enumerate(graph.dispatches)
            if d.shader is None and d.dst in carried and isinstance(values[d.src], Tensor) and values[d.src].constant is not None
        }
        state_vids |= {d.dst for d in self._state_copies.values()}
        # a mutable buffer of the program's own, without a constant: each session's starts zeroed
        state_vids |= {v for v in carried & read_first(nodes) if isinstance(values[v], Tensor) and v not in graph.inputs}
        # A state that a copy overwrites whole each call (a recurrent state written back, as LFM2's
        # convolution state) depends on every token fed so far, where a KV cache's positions are
        # overwritten: a new sequence starts it afresh (Session.restart; in a ragged pass a session's
        # slot of the state's pool, from position 0).
        self.recurrent_states = frozenset(ragged.states if ragged is not None else recurrent_states(graph))
        input_vids = {v for v in graph.inputs if isinstance(values[v], Tensor)}
        self._session_vids = sorted(state_vids | input_vids)  # each session has its own copy
        # Allocating and uploading weights and creating bind groups are synchronous wgpu calls that
        # take hundreds of ms for a real model: worker threads, so the event loop keeps running.
        await anyio.to_thread.run_sync(self._make_buffers, program.named_data, progress)
        self._pipelines = await compile_pipelines(self.device, graph.dispatches, progress)
        if ragged is not None:
            runner = await anyio.to_thread.run_sync(Session, self)
            self._sessions.discard(runner)  # the model's own: not a user session
            self._batcher = await anyio.to_thread.run_sync(Batcher, self, ragged, runner, token_budget, kv_positions)  # compiles the sampler
        self._default = await self.open_session()
        await self._warm_up(progress)

    def _build_nodes(self, graph, half, max_batch, sums=False):
        """The linked `graph` fused and planned ragged where it can be, and its op nodes; float16
        tensors stored as f16 (`half`; with `sums`, products of them summing in f16 within a K step)
        or widened to f32. HalfUnsupported: an op has no f16 kernel."""
        if not half:
            widen_half(graph)
        split_constants(graph, self._binding_limit)
        scales_in_row_quads(graph)
        self._input_storage = tuple(getattr(graph.values[v], "dtype", None) for v in graph.inputs)  # float16 may be widened
        self.fused = fuse(graph, self.int8_matrices)
        self.batching, self.batching_note, ragged = ("submits" if self._scheduler.batching else "off"), "", None
        if self._scheduler.batching:
            try:
                ragged = plan_ragged(graph, max_batch)
                graph, self.batching = ragged.graph, "ragged"
                self.fused += fuse_ragged(graph, self._storage_buffers)
            except NotRagged as e:
                self.batching_note = f"not ragged: {e}"
        self.graph = graph
        nodes = []
        for name, args in graph.calls:
            try:
                nodes.append(build_node(graph, name, args, self.kernels, self.subgroups, backend.MERGE_APART, self.int8_matrices, half and sums,
                                        self.f16_matrices, self.batch_invariant))
            except HalfUnsupported:
                raise
            except NotImplementedError as e:
                raise UnsupportedOperatorError([f"{name} ({e})"]) from e
            except Exception as e:  # a hostile file can break an op's argument reading in any way
                raise ModelFormatError(f"operator {name} with args {args}: {type(e).__name__}: {e}") from e
        return graph, nodes, ragged

    async def _warm_up(self, progress):
        """Every pipeline dispatched once, in a worker thread: drivers that compile shaders at first
        use do it now, off the event loop, not in the first execute. A batching model's on its
        ragged runner: what the kernels leave in its KV-cache and state pools no sequence reads (a
        block's positions are written before they are read, a state's slot is set at position 0),
        and a throwaway session of the ragged graph would make its own KV caches and bind groups
        first. Any other model's on a throwaway session, whose state tensors the kernels write."""

        def warm_up():
            if self._batcher is not None:
                dispatch_each_once(self._batcher.runner, progress)
                return
            session = Session(self)
            try:
                dispatch_each_once(session, progress)
            finally:
                session._release()

        await anyio.to_thread.run_sync(warm_up)

    def _plan_at_max_shapes(self):
        """Run every hook once with the inputs at their maximum shapes: the initial live state."""
        values = self.graph.values
        state = LiveState(len(values), len(self.graph.params), len(self.graph.dispatches))
        for vid, v in enumerate(values):
            if isinstance(v, Tensor):
                state.dims[vid] = tuple(v.dims)
            elif isinstance(v, SymInt):
                state.symints[vid] = v.initial
        host = {  # zeros at the maximum shapes, broadcast from one element: nothing is allocated
            vid: np.broadcast_to(np.zeros((), storage_dtype(values[vid].dtype)), values[vid].dims)
            for vid in self.graph.inputs
            if isinstance(values[vid], Tensor)
        }
        try:
            run_all(self.plan, ResizeContext(self.plan, state, host))
        except Exception as e:
            raise ModelFormatError(f"building the plan at maximum shapes failed: {type(e).__name__}: {e}") from e
        return state

    def _reserve(self, nbytes, what):
        """Count `nbytes` against the memory budget, or raise before anything is allocated."""
        if self.memory_budget is not None and self._reserved + nbytes > self.memory_budget:
            raise MemoryBudgetError(
                f"{what} needs {nbytes} bytes of GPU memory; {self._reserved} of the {self.memory_budget}-byte "
                "budget are in use"
            )
        self._reserved += nbytes

    def _create_buffer(self, size, usage, label=""):
        """A buffer of `size` bytes; the device running out of memory is a MemoryBudgetError that
        says what was being allocated (the caller's state stays as it was), a lost device the
        BrokenResourceError every later call gets."""
        self._counters.buffer_allocations += 1
        try:
            return self.device.create_buffer(size=max(align(size, 4), 4), usage=usage, label=label)
        except (wgpu.GPUOutOfMemoryError, wgpu.GPUValidationError) as e:
            if DEVICE_LOST in str(e):
                self._scheduler.fail(e)
                raise BrokenResourceError(f"the GPU failed: {e}") from e
            if not is_out_of_memory(e):
                raise
            raise MemoryBudgetError(
                f"the GPU ({self.device_info.name}) is out of memory: {label or 'a buffer'} needs {size} bytes, "
                f"with {self.memory()} bytes of this model's shared buffers allocated (wgpu: {e})"
            ) from e

    def _make_buffers(self, named, progress):
        values = self.graph.values
        limit = self.device_info.max_storage_binding
        for vid, v in enumerate(values):
            nbytes = numel_of(v.dims) * elem_bytes(v.dtype) if isinstance(v, Tensor) else 0
            if nbytes > limit:
                raise ModelFormatError(f"tensor {vid} {v.dtype}{list(v.dims)} needs {nbytes} bytes; the device binds at most {limit}")
        memory = plan_memory(self.graph, self.plan.nodes, set(self._session_vids))
        self._buffer_key, self._aliased = memory.keys, memory.aliased | set(self._state_copies)
        shared = {  # the session-owned values are allocated by each session
            key: size for key, size in memory.sizes.items() if not (key[0] == "value" and key[1] in self._session_vids)
        }
        self._reserve(sum(align(size, 4) for size in shared.values()), "the model's weights and activations")
        for key, size in shared.items():  # one by one: a failed load frees those made (_release)
            self._buffers[key] = self._create_buffer(size, STORAGE_USAGE, str(key))
        self._constant_data = {}  # initial contents of the session-owned constants (state tensors)
        constants = [(vid, v) for vid, v in enumerate(values) if isinstance(v, Tensor) and v.constant is not None]
        total, done = sum(numel_of(v.dims) * elem_bytes(v.dtype) for _, v in constants), 0
        progress.from_worker("upload", 0, total)
        uploads = StagedUploads(self.device)
        for vid, v in constants:
            raw = _constant_bytes(v.constant, named, f"constant tensor {vid}")
            data = to_storage(v, constant_rows(raw, v.constant.rows) if v.constant.rows else raw, f"tensor {vid}")
            if v.constant.permuted or v.constant.order:
                data = rearranged(data, v)
            copied_into = [d.dst for d in self._state_copies.values() if d.src == vid]
            if copied_into or vid in self._session_vids:  # a state's initial contents, for every session: its own bytes, not a view of the file's
                data = np.array(data)
            for dst in copied_into:
                self._constant_data[dst] = data
            if vid in self._session_vids:
                self._constant_data[vid] = data
            elif data.nbytes:
                uploads.write(self._buffers[self._buffer_key[vid]], data)
            done += numel_of(v.dims) * elem_bytes(v.dtype)
            progress.from_worker("upload", done, total)
        uploads.finish()

    def buffer(self, vid):
        return self._buffers[self._buffer_key[vid]]

    # --- public -------------------------------------------------------------------------------
    def session(self):
        """A new stream with its own live shapes, parameters, staging and state tensors.
        (Creating one makes its bind groups here; `await model.open_session()` does it in a
        worker thread for large graphs.)"""
        self._check_open()
        return self._session_class()(self)

    async def open_session(self):
        """`session()`, with the synchronous GPU object creation in a worker thread. A batching
        model's session is a slot (its block table and sampler rows), taken here on the event
        loop: more slots grow the sampler's buffers, and rebinding in a worker thread raced with
        the passes being encoded (a bind group paired with another kernel's pipeline, then
        wgpu-native's panic)."""
        self._check_open()
        if self._batcher is not None:
            return BatchedSession(self)
        return await anyio.to_thread.run_sync(Session, self)

    def _session_class(self):
        return Session if self._batcher is None else BatchedSession

    async def execute(self, *inputs):
        """Run the method on the default session; returns a list of numpy arrays."""
        return await self._default.execute(*inputs)

    @property
    def gpu_sampling(self):
        """Whether the GPU picks tokens, greedy or sampled, in bursts of decode passes
        (`BatchedSession.pick`, async_runtime/bursts.py)."""
        return self._batcher is not None and self._batcher.bursts is not None

    def describe_inputs(self):
        return ", ".join(f"{s.dtype}{list(s.max_shape)}" for s in self.inputs)

    def statistics(self):
        stats = self._counters.freeze()
        if self._batcher is None:
            return stats
        pool = self._batcher.blocks.stats()
        return replace(stats, kv_blocks=pool["blocks"], kv_blocks_used=pool["used"], kv_blocks_cached=pool["cached"],
                       prefix_cache_queries=pool["prefix_queries"], prefix_cache_hits=pool["prefix_hits"])

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
        """Bytes of GPU memory shared by every session (weights and activations); each session's
        own part is `session.memory()`."""
        return sum(b.size for b in self._buffers.values())

    async def aclose(self):
        if self._closed:
            return
        self._closed = True
        self._release()
        await anyio.lowlevel.checkpoint()

    def _release(self):
        """Free the GPU buffers of the sessions, the batcher's runner and the model."""
        for s in list(self._sessions):
            s._release()
        if self._batcher is not None:
            self._batcher.runner._release()
        for b in self._buffers.values():
            b.destroy()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    def _check_open(self):
        if self._closed:
            raise ClosedResourceError("the model is closed")
        if self._scheduler.broken is not None:
            raise BrokenResourceError("the GPU device was lost") from self._scheduler.broken


def _io_spec(v, what):
    if isinstance(v, Tensor):
        return IOSpec(what, v.dtype, tuple(v.dims))
    return IOSpec(what, "int" if isinstance(v, SymInt) else type(v).__name__, ())


def _constant_bytes(const, named, what):
    if const.key is not None:
        try:
            return named[const.key]
        except KeyError:
            raise ModelFormatError(f"{what}: named data {const.key!r} is not in the program") from None
    return const.blob[const.offset : const.offset + const.length]


def _why_f32(precision, graph, info):
    """Why a load stores float16 tensors as f32 (empty: the model has none)."""
    if not has_half(graph):
        return ""
    if precision == "f32":
        return 'f32: load(precision="f32")'
    return "f32: the adapter has no shader-f16"
