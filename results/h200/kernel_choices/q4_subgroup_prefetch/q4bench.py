"""The 4-bit subgroup kernels alone (plain products at Q4_SG_GPU_WIDE's shapes or given ones), weights
cycled over copies past the L2 cache, each result checked against numpy (ERR past 1e-5).

    python q4bench.py ROWS [MODE] [NxK,..] [small]
    ROWS: row counts, e.g. 1,4,8,16. MODE: cur (the installed code), shapes (other shapes at one
    row; noscale: no scale loads, wrong results, timing only), magic (nibbles by an exponent mask),
    rows16 (shapes and prefetching every shape), inter (a weight's row groups side by side in the
    grid), stage / s2 (shapes of 4 and 8 rows), n2 (17-64-row shapes, one word a step), mix (timing
    only: cur, noscale, magic, no dequantization, neither; at m = 16 on two weights after the
    others). small: tiny products, one weight copy (lavapipe)."""
import struct
import sys
import time

import numpy as np
import wgpu

from async_runtime.pipelines import compile_pipeline
from pte_wgpu.resize.shapes import fold_grid
from pte_wgpu.kernels.matmul import q4_linear as Q
from pte_wgpu.kernels.matmul.linear import sg_wg_rows
from pte_wgpu.kernels.matmul.routes import Q4_SG_GPU_WIDE, shape_for_rows

adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
lim = adapter.limits
dev = adapter.request_device_sync(required_features=["subgroup"], required_limits={
    "max-storage-buffer-binding-size": lim["max-storage-buffer-binding-size"], "max-buffer-size": lim["max-buffer-size"]})
print(adapter.info["device"], flush=True)
U = wgpu.BufferUsage
GS = 32


def buf(a, usage=U.STORAGE):
    return dev.create_buffer_with_data(data=np.ascontiguousarray(a).tobytes(), usage=usage | U.COPY_SRC)


def run(pipe, bgs, grid, reps):
    times = []
    for t in range(4):
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
        dev.queue.read_buffer(OUTS[0], size=4)
        times.append((time.perf_counter() - t0) / n)
    return min(times[1:]) * 1e6


OUTS = []


def case(N, K, ms, pipes):
    rng = np.random.default_rng(1)
    nib = rng.integers(0, 16, (N, K), dtype=np.uint8)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    sn = -(-N // 4) * 4
    scales = (rng.random((K // GS, sn)).astype(np.float32) * 0.02 + 0.001)
    wdq = (nib.astype(np.float64) - 8) * np.repeat(scales[:, :N].T.astype(np.float64), GS, axis=1)
    copies = 1 if "small" in sys.argv else max(1, min(16, int(400e6 // packed.nbytes)))
    wbufs = [buf(packed) for _ in range(copies)]
    sbuf = buf(scales)
    mmax = max(ms)
    x = rng.standard_normal((mmax, K)).astype(np.float32)
    xb = buf(x)
    out = dev.create_buffer(size=mmax * N * 4, usage=U.STORAGE | U.COPY_SRC)
    OUTS[:] = [out]
    line = []
    for m in ms:
        qb = buf(np.frombuffer(struct.pack(Q.LIN_FORMAT, m, N, K, K // 8, sn, K // GS, GS, K // 8), np.uint8), U.UNIFORM)
        for name, make, fixed in pipes:
            shape = fixed or Q4_SG_GPU_WIDE[shape_for_rows(Q4_SG_GPU_WIDE, m)]
            grid = fold_grid(-(-N // sg_wg_rows(shape)))[:2] + (-(-m // shape[0]),)
            if name.startswith("inter"):
                grid = fold_grid(-(-N // sg_wg_rows(shape)) * -(-m // shape[0]))
            pipe = make(shape)
            bgs = [dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
                {"binding": i, "resource": {"buffer": b}} for i, b in enumerate((xb, w, sbuf, out, qb))]) for w in wbufs]
            run(pipe, bgs[:1], grid, 1)
            got = np.frombuffer(dev.queue.read_buffer(out, size=m * N * 4), np.float32).reshape(m, N)
            ref = x[:m].astype(np.float64) @ wdq.T
            err = np.abs(got - ref).max() / np.abs(ref).max()
            us = run(pipe, bgs, grid, 3 if "small" in sys.argv else max(20, int(3e4 // (N * K / 2e6))))
            gbs = N * K / 2 / us / 1e3
            line.append(f"{name} m={m} {us:8.1f}us {gbs:6.0f}GB/s {2 * m * N * K / us / 1e6:6.1f}TF{' ERR %.1e' % err if err > 1e-5 else ''}")
    print(f"N={N} K={K} ({copies} copies)\n  " + "\n  ".join(line), flush=True)


def default(shape):
    return compile_pipeline(dev, Q.sg_shader(False, False, False, shape, Q.Storage(), False))


def noscale(shape):
    src = Q.sg_shader(False, False, False, shape, Q.Storage(), False)
    import re
    src = re.sub(r"fn wscale\(k: u32, n: u32\) -> f32 \{[^\n]*\}", "fn wscale(k: u32, n: u32) -> f32 { return 0.01 + f32(n & 1u) + 0.0 * f32(ws[0]); }", src)
    return compile_pipeline(dev, src)


MAGIC = """fn nibbles(word: u32) -> W8 {
    let v = vec4<u32>(word);
    let lo = bitcast<vec4<f32>>(((v >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) | vec4<u32>(0x4B000000u)) - vec4<f32>(8388616.0);
    let hi = bitcast<vec4<f32>>(((v >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) | vec4<u32>(0x4B000000u)) - vec4<f32>(8388616.0);
    return W8(lo, hi);
}"""


def magic(shape):
    src = Q.sg_shader(False, False, False, shape, Q.Storage(), False)
    i = src.index("fn nibbles(")
    j = src.index("\n}\n", i) + 2
    return compile_pipeline(dev, src[:i] + MAGIC + src[j:])


MODE = sys.argv[2] if len(sys.argv) > 2 else "cur"
PIPES = [("cur", default, None)]
if MODE == "shapes":
    PIPES = [(str(sh), default, sh) for sh in [(1, 4, 2), (2, 4, 2), (1, 4, 1), (1, 2, 2), (1, 8, 2), (1, 4, 4), (4, 4, 2)]] + [("noscale", noscale, (1, 4, 2))]
if MODE == "magic":
    PIPES = [("cur", default, None), ("magic", magic, None)] + [(f"magic{sh}", magic, sh) for sh in [(8, 4, 2), (8, 2, 2), (4, 8, 2), (16, 2, 2), (4, 2, 2)]]
def pref(shape):
    rows, Q.PREFETCH_ROWS = Q.PREFETCH_ROWS, 99
    try:
        return default(shape)
    finally:
        Q.PREFETCH_ROWS = rows


def inter(shape):
    src = Q.sg_shader(False, False, False, shape, Q.Storage(), False)
    R = shape[0]
    a = f"let r0 = wid.z * {R}u;"
    assert a in src
    src = src.replace(a, f"let rgs = (q.M + {R - 1}u) / {R}u; let flat = wid.x + wid.y * nwg.x; let r0 = (flat % rgs) * {R}u;")
    b = "let wg0 = wid.x + wid.y * nwg.x;"
    assert b in src
    src = src.replace(b, "let wg0 = flat / rgs;")
    return compile_pipeline(dev, src)


if MODE == "inter":
    PIPES = [("cur", default, None), ("inter", inter, None)]
if MODE == "rows16":
    PIPES = [(f"{sh}", default, sh) for sh in [(4, 4, 2), (4, 8, 2), (2, 8, 2), (4, 8, 1), (4, 4, 1), (2, 16, 2)]]
    PIPES += [(f"pref{sh}", pref, sh) for sh in [(4, 4, 2), (4, 8, 2), (1, 4, 2), (2, 4, 2)]]
if MODE == "stage":
    PIPES = [("cur", default, None)] + [(f"{sh}", default, sh) for sh in [(4, 4, 4), (4, 4, 8), (4, 8, 2), (4, 8, 4), (8, 4, 2), (8, 4, 4)]]
if MODE == "narrow":
    PIPES = [(f"{sh}", default, sh) for sh in [(4, 4, 2, 1), (4, 4, 4, 1), (4, 4, 8, 1), (8, 4, 4, 1), (4, 8, 4, 1)]]
if MODE == "s2":
    PIPES = [("cur", default, None)] + [(f"{sh}", default, sh) for sh in [(8, 4, 4), (8, 4, 8), (8, 8, 4), (8, 2, 8)]]
if MODE == "n2":
    PIPES = [(f"{sh}", default, sh) for sh in [(4, 4, 2, 1), (8, 4, 4, 1), (8, 4, 2, 1), (8, 8, 4, 1), (16, 4, 4, 1), (16, 4, 2, 1)]]
ROWS = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "1,4,8,16").split(",")]
SHAPES = [(256, 2048), (64, 512)] if "small" in sys.argv else [(16384, 2048), (2048, 8192), (3072, 2048), (128256, 2048)]
if len(sys.argv) > 3:
    SHAPES = [tuple(int(v) for v in nk.split("x")) for nk in sys.argv[3].split(",")]
for N, K in SHAPES:
    case(N, K, ROWS, PIPES)
NODQ = """fn nibbles(word: u32) -> W8 {
    let f = bitcast<f32>(word);
    return W8(vec4<f32>(f), vec4<f32>(f));
}"""


def swap_nibbles(src, body):
    i = src.index("fn nibbles(")
    j = src.index("\n}\n", i) + 2
    return src[:i] + body + src[j:]


def nodq(shape):
    return compile_pipeline(dev, swap_nibbles(Q.sg_shader(False, False, False, shape, Q.Storage(), False), NODQ))


def nodq_noscale(shape):
    import re
    src = swap_nibbles(Q.sg_shader(False, False, False, shape, Q.Storage(), False), NODQ)
    src = re.sub(r"fn wscale\(k: u32, n: u32\) -> f32 \{[^\n]*\}", "fn wscale(k: u32, n: u32) -> f32 { return 0.01 + f32(n & 1u) + 0.0 * f32(ws[0]); }", src)
    return compile_pipeline(dev, src)


if MODE == "mix":
    PIPES = []
    for sh in [(4, 4, 2), (8, 4, 4)]:
        PIPES += [(f"cur{sh}", default, sh), (f"noscale{sh}", noscale, sh), (f"magic{sh}", magic, sh), (f"nodq{sh}", nodq, sh), (f"nodq_noscale{sh}", nodq_noscale, sh)]
    for m, N, K in [(16, 16384, 2048), (16, 2048, 8192)]:
        case(N, K, [m], PIPES)
