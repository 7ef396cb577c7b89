"""Streaming-kernel bandwidth: the device's copy bandwidth, and the project's own streaming kernels
(elementwise ops, the strided copy, the M=1 GEMV of `aten.linear` with f32 and, where the adapter
has shader-f16, f16 tensors) on large tensors, in GB/s and as a share of that copy bandwidth (the
issue's target: 70% or more).

    python -m async_runtime.tools.bench.streaming [--short] [--runs N] [--only TEXT] [--json FILE]

Part of `python -m async_runtime bench` too (its "streaming" key and markdown section).

The kernels are the runtime's: each op is built through the registry (`kernels.build_node`) on a
one-op graph and its resize hook run at the tensors' shapes, so the WGSL, parameters and grids are
what a session would dispatch. Two copy references: the registry's `aten.clone` (which the runtime
runs as `copy_buffer_to_buffer`) and a minimal hand-written WGSL copy (vec4 loads and stores, 256
invocations of 4 vec4s each); the device's copy bandwidth is the better of the two. Bytes moved:
every bound tensor once (read or written). Kernels that write a known number of output elements
per invocation are checked to reach every element with their folded grid (`plan`).

Timing: each run submits `R` back-to-back dispatches (or copies), R scaled so that a run moves at
least `span_bytes` (about 20 ms on a 3 TB/s GPU), and times them two ways at once: GPU timestamps
written by the compute pass that holds all R dispatches (for copies, which are outside compute
passes: by empty passes before and after), and wall clock from the submit to an awaited map of a
4-byte buffer the same command buffer writes last. Time per dispatch = span / R, median over runs.
GB/s come from the timestamps when the two agree within 20%, else from wall clock (the table says
which). A kernel that moves fewer than `footprint` bytes per dispatch cycles through several
copies of its buffers, so a layer-sized weight is read from memory, not from the L2 cache (a
model's decode reads each layer's weights once per step). Every copy's output is sampled (first,
middle and last elements, plus scattered ones) and checked against numpy (`max_rel_err`), so a
bandwidth number cannot come from a kernel that does nothing or only part of its work.
"""

import argparse
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import anyio
import numpy as np
import wgpu

from pte_wgpu.kernels import Params, build_node
from pte_wgpu.kernels.wgsl import PER_INVOCATION, elem_bytes
from pte_wgpu.resize.engine import LiveState, Plan, ResizeContext
from pte_wgpu.resize.shapes import MAX_WORKGROUPS, fold_grid, numel_of
from pte_wgpu.resize.values import Scalar, Tensor

from ...device import open_device
from ...encoding import encode_dispatches, prepare
from ...pipelines import compile_pipeline
from ..profile import enable_timestamp_normalization
from .report import MiB, median, streaming_lines
from ...session import UNIFORM_ALIGN
from ...storage import STORAGE_USAGE, align, storage_dtype

# tensor_bytes: each elementwise tensor (clamped to what the adapter binds); span_bytes: the least a
# timed run moves (R = span_bytes / bytes per dispatch, at least `reps`); gemv: (N, K) weights,
# SmolLM2-135M's LM head, MLP and attention layers in full mode.
FULL = dict(
    tensor_bytes=1024 * MiB, footprint=256 * MiB, reps=10, span_bytes=64e9,
    gemv=((49152, 576), (1536, 576), (576, 1536), (576, 576)),
)
SHORT = dict(tensor_bytes=4 * MiB, footprint=8 * MiB, reps=2, span_bytes=16 * MiB, gemv=((2048, 576), (1536, 576)))
PATTERN = 1 << 18  # elements of the repeating input pattern (1 MiB of f32)
SAMPLE = 256  # output elements checked at the start, middle and end of every output copy
SCATTER = 64  # and single elements at random places
AGREE = 0.2  # timestamps are used when within this fraction of wall clock
COPY = "device copy (aten.clone)"
WGSL_COPY = "WGSL copy (vec4, 256 invocations x 4)"
COPIES = (COPY, WGSL_COPY)  # the denominator: the faster of these
VEC4S = 4  # vec4s per invocation of the WGSL copy
WGSL_COPY_SHADER = f"""
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
    let base = (wid.x + wid.y * nwg.x) * {256 * VEC4S}u + lid;
    let n = arrayLength(&dst);
    var v: array<vec4<f32>, {VEC4S}>;
    for (var k = 0u; k < {VEC4S}u; k++) {{ v[k] = src[min(base + k * 256u, n - 1u)]; }}
    for (var k = 0u; k < {VEC4S}u; k++) {{
        let i = base + k * 256u;
        if (i < n) {{ dst[i] = v[k]; }}
    }}
}}
"""


@dataclass(frozen=True)
class Kernel:
    label: str
    op: str  # a registry op, or None for `wgsl`
    args: tuple  # the op's values (Tensors, Scalars), output last
    ref: object  # ref(inp, idx): expected output at flat indices idx; inp(k, idx) reads input tensor k
    per_invocation: int = 0  # output elements each invocation writes (0: the grid is not checked)
    wgsl: str = None  # a hand-written kernel: bindings = the tensors in order
    rtol: float = 1e-5  # what max_rel_err may be: f32 sums; an f16 output is rounded (2^-11 relative)


F16_RTOL = 2e-3


def kernels(p, limit, f16=True):
    """The measured kernels at the sizes of `p` (FULL or SHORT); `limit`: the most bytes a tensor
    may have (the adapter's binding and buffer limits); `f16`: the GEMVs with float16 tensors too
    (the adapter has shader-f16)."""
    rows = min(p["tensor_bytes"], limit) // MiB * MiB // 4096
    x = Tensor("float32", (rows, 1024))
    copy = lambda inp, i: inp(0, i)  # noqa: E731
    out = [
        Kernel(COPY, "aten.clone.default", (x, x), copy),
        Kernel(WGSL_COPY, None, (x, x), copy, per_invocation=4 * VEC4S, wgsl=WGSL_COPY_SHADER),
        Kernel("aten.add.Tensor", "aten.add.Tensor", (x, x, x), lambda inp, i: inp(0, i) + inp(1, i), per_invocation=PER_INVOCATION),
        Kernel("aten.mul.Scalar (x * 2)", "aten.mul.Scalar", (x, Scalar(2.0), x), lambda inp, i: 2 * inp(0, i), per_invocation=PER_INVOCATION),
        Kernel(  # rows of 1,024: the strided copy's vec4 kernel, PER_INVOCATION vec4s an invocation
            "aten.slice_copy.Tensor (strided copy, all rows)", "aten.slice_copy.Tensor",
            (x, Scalar(0), Scalar(0), Scalar(rows), Scalar(1), x), copy, per_invocation=4 * PER_INVOCATION,
        ),
    ]
    for n, k in p["gemv"]:
        for dtype in ("float32", "float16")[: 1 + f16]:
            out.append(Kernel(
                f"aten.linear.default GEMV [1, {k}] x [{n}, {k}]^T" + (" f16" if dtype == "float16" else ""), "aten.linear.default",
                (Tensor(dtype, (1, k)), Tensor(dtype, (n, k)), Scalar(None), Tensor(dtype, (1, n))),
                lambda inp, i, k=k: inp(1, i[:, None] * k + np.arange(k)) @ inp(0, np.arange(k)),
                rtol=F16_RTOL if dtype == "float16" else Kernel.rtol,
            ))
    return out


def plan(kernel):
    """(values, parameter bytes, [(dispatch, grid)] of the active dispatches) as a session's resize
    sets them; no device needed. Raises if a grid exceeds the per-dimension limit or, for a kernel
    with `per_invocation`, its grid reaches fewer output elements than the output has."""
    numel = numel_of(kernel.args[-1].dims)
    if kernel.wgsl is not None:
        d = SimpleNamespace(shader=kernel.wgsl, bindings=tuple(range(len(kernel.args))))
        values, params, active = list(kernel.args), [], [(d, fold_grid(-(-numel // (256 * kernel.per_invocation))))]
    else:
        graph = SimpleNamespace(values=list(kernel.args), params=[], dispatches=[])
        node = build_node(graph, kernel.op, list(range(len(kernel.args))))
        state = LiveState(len(graph.values), len(graph.params), len(graph.dispatches))
        for vid, v in enumerate(graph.values):  # the op's tensors and any it added (split-K scratch)
            if isinstance(v, Tensor):
                state.dims[vid] = v.dims
        node.hook(ResizeContext(Plan([node], graph.values), state))
        values, params = graph.values, state.params
        active = [(d, g) for d, g in zip(graph.dispatches, state.grids) if (all(g) if d.shader is not None else g[0])]
    for d, grid in active:
        if d.shader is None:
            continue
        if max(grid) > MAX_WORKGROUPS:
            raise ValueError(f"{kernel.label}: grid {grid} exceeds {MAX_WORKGROUPS} workgroups per dimension")
        wg = math.prod(int(n) for n in re.search(r"@workgroup_size\(([\d,\s]+)\)", d.shader)[1].split(",") if n.strip())
        if kernel.per_invocation and math.prod(grid) * wg * kernel.per_invocation < numel:
            raise ValueError(f"{kernel.label}: grid {grid} x {wg} invocations reaches fewer than {numel} elements")
    return values, params, active


def _pattern(k, dtype="float32"):
    """Input k's repeating pattern, as the device stores a `dtype` tensor."""
    return np.random.default_rng(k).standard_normal(PATTERN).astype(storage_dtype(dtype))


class OneOp:
    """One kernel at fixed shapes on the device: `copies` sets of its tensors' buffers (inputs
    filled with repeating patterns), its parameters, pipelines and bind groups, encoded the way a
    session encodes its steps. Blocking wgpu calls: construct it in a worker thread."""

    def __init__(self, device, kernel, footprint):
        values, params, active = plan(kernel)
        args = [vid for vid, v in enumerate(kernel.args) if isinstance(v, Tensor)]
        self.kernel, self.device, self.inputs, self.out = kernel, device, args[:-1], args[-1]
        self.dtypes = [values[vid].dtype for vid in args]
        self.shapes = [list(values[vid].dims) for vid in args]
        self.grids = [list(g) for d, g in active if d.shader is not None]
        bound = set(args) | {b for d, _ in active for b in (d.bindings if d.shader else (d.src, d.dst)) if isinstance(b, int)}
        sizes = {vid: numel_of(values[vid].dims) * elem_bytes(values[vid].dtype) for vid in bound}
        self.bytes = sum(sizes[vid] for vid in args)
        self.copies = max(1, -(-footprint // self.bytes))
        self._buffers = []

        offsets = [k * UNIFORM_ALIGN for k in range(len(params))]
        arena = self._create(max(len(offsets) * UNIFORM_ALIGN, 16), wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        for pid, data in enumerate(params):
            device.queue.write_buffer(arena, offsets[pid], data)
        pipelines = {}
        for d, _ in active:
            if d.shader is not None and d.shader not in pipelines:
                pipelines[d.shader] = compile_pipeline(device, d.shader)
        patterns = []
        for k, dtype in enumerate(self.dtypes[:-1]):
            data = _pattern(k, dtype)
            patterns.append(self._create(data.nbytes, STORAGE_USAGE))
            device.queue.write_buffer(patterns[-1], 0, data)
        self.sets, self.commands = [], []  # per copy: {vid: buffer}; its runs, as in Session._command_list
        encoder, groups = device.create_command_encoder(), []
        for _ in range(self.copies):
            bufs = {vid: self._create(size, STORAGE_USAGE) for vid, size in sizes.items()}
            for vid, pattern in zip(self.inputs, patterns):  # inputs: the pattern repeated
                for offset in range(0, sizes[vid], pattern.size):
                    encoder.copy_buffer_to_buffer(pattern, 0, bufs[vid], offset, min(pattern.size, align(sizes[vid], 4) - offset))
            runs = []
            for d, grid in active:
                if d.shader is None:
                    runs.append(("copy", bufs[d.src], bufs[d.dst], align(grid[0], 4)))
                    continue
                entries = [
                    {"binding": i, "resource": {"buffer": arena, "offset": offsets[b.index], "size": b.size}}
                    if isinstance(b, Params) else {"binding": i, "resource": {"buffer": bufs[b], "offset": 0, "size": bufs[b].size}}
                    for i, b in enumerate(d.bindings)
                ]
                pipeline = pipelines[d.shader]
                group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
                groups.append(group)
                runs.append(("compute", [(*prepare(pipeline, group), grid)]))
            self.sets.append(bufs)
            self.commands.append(runs)
        device.queue.submit([encoder.finish()])
        self._keep = (pipelines, groups)  # `commands` holds their native handles (encoding.prepare)

    def _create(self, size, usage):
        buf = self.device.create_buffer(size=max(align(size, 4), 4), usage=usage)
        self._buffers.append(buf)
        return buf

    def encode(self, encoder, reps, query_set=None):
        """`reps` dispatches of the op, cycling over the copies; consecutive ones share a pass. With
        `query_set`, its timestamps 0 and 1 bracket them: written by the one compute pass that holds
        them all when the op is dispatches only, else by empty passes before and after."""
        runs = [run for r in range(reps) for run in self.commands[r % self.copies]]
        one_pass = query_set is not None and all(run[0] == "compute" for run in runs)
        batch = []

        def mark(**index):
            encoder.begin_compute_pass(timestamp_writes={"query_set": query_set, **index}).end()

        def flush():
            if batch:
                ts = {"query_set": query_set, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
                compute = encoder.begin_compute_pass(timestamp_writes=ts if one_pass else None)
                encode_dispatches(compute, batch)
                compute.end()
                batch.clear()

        if query_set is not None and not one_pass:
            mark(end_of_pass_write_index=0)
        for run in runs:
            if run[0] == "compute":
                batch.extend(run[1])
            else:
                flush()
                encoder.copy_buffer_to_buffer(run[1], 0, run[2], 0, run[3])
        flush()
        if query_set is not None and not one_pass:
            mark(beginning_of_pass_write_index=1)

    async def max_rel_err(self):
        """max |GPU - numpy| / max |numpy| over SAMPLE output elements at the start, middle and end
        of every copy's output and SCATTER single ones spread over it (1.0 for an output left at zero)."""
        n, eb = numel_of(self.shapes[-1]), elem_bytes(self.dtypes[-1])
        per_word = 4 // eb  # copies are in words: f16 elements two at a time (the GEMVs' N are even)
        s = min(SAMPLE, n // per_word * per_word)
        spans = [(start // per_word * per_word, s) for start in (0, (n - s) // 2, n - s)]
        spans += [(int(i) // per_word * per_word, per_word) for i in np.random.default_rng(0).integers(0, n, SCATTER)]
        idx = np.concatenate([np.arange(start, start + length) for start, length in spans])
        read = self._create(self.copies * idx.size * eb, wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

        def submit():
            encoder, offset = self.device.create_command_encoder(), 0
            for bufs in self.sets:
                for start, length in spans:
                    encoder.copy_buffer_to_buffer(bufs[self.out], start * eb, read, offset, length * eb)
                    offset += length * eb
            self.device.queue.submit([encoder.finish()])

        await anyio.to_thread.run_sync(submit)
        await read.map_async("READ")
        got = np.frombuffer(read.read_mapped(copy=True), storage_dtype(self.dtypes[-1])).reshape(self.copies, idx.size)
        read.unmap()
        patterns = [_pattern(k, dtype).astype(np.float64) for k, dtype in enumerate(self.dtypes[:-1])]
        want = self.kernel.ref(lambda k, i: patterns[k][i % PATTERN], idx)
        return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))

    def release(self):
        for buf in self._buffers:
            buf.destroy()


async def _timed_runs(device, op, reps, runs, timestamps):
    """[(GPU-timestamp seconds per dispatch or None, wall-clock seconds per dispatch)] of `runs`
    runs of `reps` dispatches each (see the module docstring). Timestamps are in ns (or 1 ns ticks)."""
    usage = wgpu.BufferUsage
    fence = device.create_buffer(size=4, usage=usage.MAP_READ | usage.COPY_DST)
    query_set = resolve = read = None
    if timestamps:
        query_set = device.create_query_set(type="timestamp", count=2)
        resolve = device.create_buffer(size=16, usage=usage.QUERY_RESOLVE | usage.COPY_SRC)
        read = device.create_buffer(size=16, usage=usage.MAP_READ | usage.COPY_DST)

    def build(n, qs):
        encoder = device.create_command_encoder()
        op.encode(encoder, n, qs)
        if qs is not None:
            encoder.resolve_query_set(qs, 0, 2, resolve, 0)
            encoder.copy_buffer_to_buffer(resolve, 0, read, 0, 16)
        encoder.copy_buffer_to_buffer(op.sets[(n - 1) % op.copies][op.out], 0, fence, 0, 4)  # after the last dispatch
        return encoder.finish()

    def submit(command):
        t0 = time.perf_counter()
        device.queue.submit([command])
        return t0

    out = []
    try:
        for j in range(runs + 1):  # the first is a warm-up (lavapipe finishes compiling a kernel at its first use)
            n = 1 if j == 0 else reps
            command = await anyio.to_thread.run_sync(build, n, query_set if j else None)
            t0 = await anyio.to_thread.run_sync(submit, command)
            await fence.map_async("READ")
            wall = (time.perf_counter() - t0) / n
            fence.unmap()
            if not j:
                continue
            gpu = None
            if timestamps:
                await read.map_async("READ")
                b, e = np.frombuffer(read.read_mapped(copy=True), np.uint64).astype(np.int64)
                read.unmap()
                gpu = (e - b) * 1e-9 / n if e > b else None
            out.append((gpu, wall))
    finally:
        for x in (fence, read, resolve, query_set):
            if x is not None:
                x.destroy()
    return out


async def measure(p, runs, units="ns", log=print, device_name=None, only=None):
    """The scenario: {device, timing, ..., copy_gb_per_s, copy_reference, kernels: {label: row}}
    (JSON-able). `units`: what `enable_timestamp_normalization()` returned before the first
    adapter request; `only`: measure only the kernels whose label contains it (and the copies)."""
    _, device, info = await open_device(device_name)
    timestamps = "timestamp-query" in info.features
    limit = min(info.max_storage_binding, info.max_buffer_size)
    res = dict(
        device=info.name, runs=runs, agree=AGREE, reps=p["reps"], span_bytes=p["span_bytes"], footprint=p["footprint"], limit_bytes=limit,
        timing=f"GPU timestamps ({units}) cross-checked by wall clock" if timestamps else "wall clock (no timestamp-query)",
        kernels={},
    )
    for kernel in kernels(p, limit, "shader-f16" in info.features):
        if only and only not in kernel.label and kernel.label not in COPIES:
            continue
        log(f"streaming: {kernel.label}")
        row = res["kernels"][kernel.label] = {"op": kernel.op or "hand-written WGSL"}
        op = None
        try:
            op = await anyio.to_thread.run_sync(OneOp, device, kernel, p["footprint"])
            reps = max(p["reps"], op.copies, math.ceil(p["span_bytes"] / op.bytes))
            timed = await _timed_runs(device, op, reps, runs, timestamps)
            gpu, wall = median([g for g, _ in timed]), median([w for _, w in timed])
            by_gpu = gpu is not None and abs(gpu - wall) <= AGREE * wall
            t = gpu if by_gpu else wall
            row.update(
                shapes=op.shapes, grids=op.grids, bytes=op.bytes, copies=op.copies, dispatches_per_run=reps,
                us_timestamps=None if gpu is None else gpu * 1e6, us_wall=wall * 1e6,
                timed_by="timestamps" if by_gpu else "wall clock", seconds=[g if by_gpu else w for g, w in timed],
                us_per_dispatch=t * 1e6, gb_per_s=op.bytes / t * 1e-9, max_rel_err=await op.max_rel_err(),
            )
        except Exception as e:  # one kernel failing (memory, limits) leaves the others' rows
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            if op is not None:
                op.release()
    best = max((c for c in COPIES if "gb_per_s" in res["kernels"][c]), key=lambda c: res["kernels"][c]["gb_per_s"], default=None)
    copy = res["kernels"][best]["gb_per_s"] if best else None
    res["copy_gb_per_s"], res["copy_reference"] = copy, best
    for row in res["kernels"].values():
        row["share_of_copy"] = row["gb_per_s"] / copy if copy and "gb_per_s" in row else None
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m async_runtime.tools.bench.streaming", description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="tiny sizes (a smoke test; numbers are not meaningful)")
    ap.add_argument("--runs", type=int, default=None, help="runs per kernel (the median is reported); default 5, 1 with --short")
    ap.add_argument("--device", help="adapter name substring (default $PTE_WGPU_ADAPTER or the preferred one)")
    ap.add_argument("--only", metavar="TEXT", help="only the kernels whose label contains TEXT (and the copies), e.g. GEMV")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = ap.parse_args(argv)
    units = enable_timestamp_normalization()  # before the first adapter request
    log = lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    runs = args.runs or (1 if args.short else 5)
    res = anyio.run(measure, SHORT if args.short else FULL, runs, units, log, args.device, args.only)
    print(f"# {res['device']}\n" + "\n".join(streaming_lines(res)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
