"""The 4-bit subgroup kernels alone, each with a part taken out or changed, to see where their time
goes; weights cycled past the L2 cache; results checked against numpy (the variants that take a part
out print their error, timing only). From the checkout root on the device:

    python bench.py ROWS    e.g. 1,4,16 (ROWS from SHAPES' keys)

base: the kernel as the runtime builds it; staged: the workgroup's input rows in workgroup memory (K
at most 2,048), 8 subgroups a workgroup sharing them, laid out so that a warp's reads are consecutive
(same sums); no_x: constants in place of the input loads; x_coal: the input loads permuted so that a
warp's loads are consecutive vec4s (the same loads, other addresses); no_deq: the words' bits in
place of the nibbles' dequantization; no_xdeq: both."""
import struct
import sys
import time

import numpy as np
import wgpu

from async_runtime.pipelines import compile_pipeline
from pte_wgpu.kernels.wgsl import row_groups_grid
from pte_wgpu.kernels.matmul import q4_linear as Q
from pte_wgpu.kernels.matmul.linear import sg_wg_rows
from pte_wgpu.kernels.matmul.routes import Q4_SG_GPU_WIDE, shape_for_rows

adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
lim = adapter.limits
dev = adapter.request_device_sync(required_features=["subgroup"], required_limits={
    "max-storage-buffer-binding-size": lim["max-storage-buffer-binding-size"], "max-buffer-size": lim["max-buffer-size"],
    "max-compute-workgroup-storage-size": lim["max-compute-workgroup-storage-size"]})
print(adapter.info["device"], flush=True)
U = wgpu.BufferUsage
GS = 32
OUT = []


def buf(a, usage=U.STORAGE):
    return dev.create_buffer_with_data(data=np.ascontiguousarray(a).tobytes(), usage=usage | U.COPY_SRC)


def run(pipe, bgs, grid, reps):
    times = []
    for t in range(5):
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        n = reps if t else 1
        for i in range(n):
            cp.set_bind_group(0, bgs[i % len(bgs)])
            cp.dispatch_workgroups(*grid)
        cp.end()
        t0 = time.perf_counter()
        dev.queue.submit([enc.finish()])
        dev.queue.read_buffer(OUT[0], size=4)
        times.append((time.perf_counter() - t0) / n)
    return sorted(times[1:])[1] * 1e6



X4 = "fn x4(i: u32) -> vec4<f32> { return x[i]; }"
VARIANTS = {
    "base": [],
    "staged": [],
    "no_x": [(X4, "fn x4(i: u32) -> vec4<f32> { return vec4<f32>(f32(i & 7u)) + x[0] * 0.0; }")],
    "x_coal": [(X4, "fn x4(i: u32) -> vec4<f32> { return x[(i / 128u) * 128u + (i % 4u) * 32u + (i / 4u) % 32u]; }")],
    "no_deq": [("fn nibbles(word: u32) -> W8 {", "fn nibbles(word: u32) -> W8 { return W8(vec4<f32>(bitcast<f32>(word)), vec4<f32>(bitcast<f32>(word ^ 7u))); }\nfn nibbles_old(word: u32) -> W8 {")],
    "no_xdeq": [(X4, "fn x4(i: u32) -> vec4<f32> { return vec4<f32>(f32(i & 7u)) + x[0] * 0.0; }"),
                ("fn nibbles(word: u32) -> W8 {", "fn nibbles(word: u32) -> W8 { return W8(vec4<f32>(bitcast<f32>(word)), vec4<f32>(bitcast<f32>(word ^ 7u))); }\nfn nibbles_old(word: u32) -> W8 {")],
}


def staged(src, shape):
    """x's rows of the workgroup's row group in workgroup memory (K <= 2,048), 8 subgroups a workgroup
    sharing them, each lane's vec4s laid out so that a warp's reads are consecutive."""
    rows = shape[0]
    subs = [("@compute @workgroup_size(64)", "@compute @workgroup_size(256)"),
            (f"let nw = wg0 * {2 * shape[1]}u;", f"let nw = wg0 * {8 * shape[1]}u;"),
            ("for (var g = li / sgs; g < 2u; g = g + 64u / sgs) {",
             "for (var j = li; j < " + str(rows) + "u * kv4; j = j + 256u) {\n        let r = j / kv4; let e = j % kv4;\n"
             "        let src = " + "".join("select(" for _ in range(rows - 1)) + "x0_" + "".join(f", x{r}_, r == {r}u)" for r in range(1, rows)) + ";\n"
             "        xt[r * kv4 + (e % 4u) * (kv4 / 4u) + e / 4u] = x[src * kv4 + e];\n    }\n    workgroupBarrier();\n    { let g = li / 32u;")]
    for old, new in subs:
        assert old in src, old
        src = src.replace(old, new)
    for r in range(rows):
        for c in range(4):
            old = f"x4(x{r}_ * kv4 + v * 4u + {c}u)"
            assert old in src, old
            src = src.replace(old, f"xt[{r}u * kv4 + {c}u * (kv4 / 4u) + v]")
    return src.replace("@compute", f"var<workgroup> xt: array<vec4<f32>, {rows * 512}>;\n@compute", 1)


def source(shape, variant="base"):
    src = Q.sg_shader(False, False, False, shape, Q.Storage(), False, GS)
    if variant == "staged":
        return staged(src, shape)
    for old, new in VARIANTS[variant]:
        assert old in src, old
        src = src.replace(old, new)
    return src


def case(N, K, ms):
    rng = np.random.default_rng(1)
    nib = rng.integers(0, 16, (N, K), dtype=np.uint8)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    sn = -(-N // 4) * 4
    scales = (rng.random((K // GS, sn)).astype(np.float32) * 0.02 + 0.001)
    wdq = (nib.astype(np.float64) - 8) * np.repeat(scales[:, :N].T.astype(np.float64), GS, axis=1)
    copies = max(1, min(16, int(400e6 // packed.nbytes)))
    wbufs = [buf(packed) for _ in range(copies)]
    quads = np.ascontiguousarray(scales.reshape(K // GS, sn // 4, 4).transpose(1, 0, 2))
    sbufs = {False: [buf(quads) for _ in range(copies)]}
    x = rng.standard_normal((max(ms), K)).astype(np.float32)
    xb = buf(x)
    out = dev.create_buffer(size=max(ms) * N * 4, usage=U.STORAGE | U.COPY_SRC)
    OUT[:] = [out]
    lines = []
    for m in ms:
        qb = buf(np.frombuffer(struct.pack(Q.LIN_FORMAT, m, N, K, K // 8, K // GS, GS, K // 8), np.uint8), U.UNIFORM)
        ref = x[:m].astype(np.float64) @ wdq.T
        for name, kw, fixed in [(v, {"variant": v}, sh) for sh in SHAPES[m] for v in VARIANTS]:
            shape = fixed or Q4_SG_GPU_WIDE[shape_for_rows(Q4_SG_GPU_WIDE, m)]
            grid = row_groups_grid(-(-N // (sg_wg_rows(shape) * (4 if kw["variant"] == "staged" else 1))), m, shape[0])
            pipe = compile_pipeline(dev, source(shape, **kw))
            bgs = [dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
                {"binding": i, "resource": {"buffer": b}} for i, b in enumerate((xb, w, s, out, qb))])
                for w, s in zip(wbufs, sbufs[False])]
            run(pipe, bgs[:1], grid, 1)
            got = np.frombuffer(dev.queue.read_buffer(out, size=m * N * 4), np.float32).reshape(m, N)
            err = np.abs(got - ref).max() / np.abs(ref).max()
            us = run(pipe, bgs, grid, max(20, int(3e4 // (N * K / 2e6))))
            bad = "" if err < 1e-5 else f" (err {err:.0e})"
            lines.append(f"{name:14s} {str(shape):12s} m={m:2d} {us:8.1f}us {N * K / 2 / us / 1e3:6.0f}GB/s {2 * m * N * K / us / 1e6:6.1f}TF{bad}")
    print(f"N={N} K={K} ({copies} copies)\n  " + "\n  ".join(lines), flush=True)


SHAPES = {1: [(1, 4, 2)], 2: [(2, 4, 2)], 4: [(4, 4, 2)], 16: [(4, 4, 2)]}
ROWS = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "1,2,4,8,16").split(",")]
for N, K in [(16384, 2048), (128256, 2048), (3072, 2048), (16384, 2048)]:
    case(N, K, ROWS)
