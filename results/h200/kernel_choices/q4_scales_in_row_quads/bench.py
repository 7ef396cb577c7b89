"""The 4-bit subgroup kernels alone; weights and scales cycled past the L2 cache; results checked
against numpy.

    python bench.py layouts [ROWS]   with the code before the change (bc11222, scales read as the
        file lays them, [groups, N]): that layout against scales by weight row ([N, groups]), no
        scale loads (timing only), the exponent-mask nibbles, and the last two together
    python bench.py shapes [ROWS]    with the code after (scales [N / 4, groups, 4]): the shapes
        (input rows, weight rows, groups a workgroup) at 1, 2, 4, 8 and 16 rows
    ROWS: e.g. 1,2,4,8,16
"""
import re
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
    "max-storage-buffer-binding-size": lim["max-storage-buffer-binding-size"], "max-buffer-size": lim["max-buffer-size"]})
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


MAGIC = """fn nibbles(word: u32) -> W8 {
    let v = vec4<u32>(word);
    let lo = bitcast<vec4<f32>>(((v >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) | vec4<u32>(0x4B000000u)) - vec4<f32>(8388616.0);
    let hi = bitcast<vec4<f32>>(((v >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) | vec4<u32>(0x4B000000u)) - vec4<f32>(8388616.0);
    return W8(lo, hi);
}"""
WSCALE = re.compile(r"fn wscale\(k: u32, n: u32\) -> f32 \{[^\n]*\}")


def source(shape, layout="file", magic=False, noscale=False):
    src = Q.sg_shader(False, False, False, shape, Q.Storage(), False, GS)
    assert WSCALE.search(src), src
    if layout == "by_row":
        src = WSCALE.sub(f"fn wscale(k: u32, n: u32) -> f32 {{ return f32(ws[n * q.groups + min(k / {GS}u, q.groups - 1u)]); }}", src)
    if noscale:
        src = WSCALE.sub("fn wscale(k: u32, n: u32) -> f32 { return 0.01 + f32(n & 1u) + 0.0 * f32(ws[0]); }", src)
    if magic:
        i = src.index("fn nibbles(")
        j = src.index("\n}\n", i) + 2
        src = src[:i] + MAGIC + src[j:]
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
    quads = scales.reshape(K // GS, sn // 4, 4).transpose(1, 0, 2)
    layouts = {"file": scales, "by_row": scales[:, :N].T, "quads": quads}
    sbufs = {k: [buf(a) for _ in range(copies)] for k, a in layouts.items()}
    x = rng.standard_normal((max(ms), K)).astype(np.float32)
    xb = buf(x)
    out = dev.create_buffer(size=max(ms) * N * 4, usage=U.STORAGE | U.COPY_SRC)
    OUT[:] = [out]
    lines = []
    for m in ms:
        fields = (m, N, K, K // 8, sn, K // GS, GS, K // 8) if MODE == "layouts" else (m, N, K, K // 8, K // GS, GS, K // 8)
        qb = buf(np.frombuffer(struct.pack(Q.LIN_FORMAT, *fields), np.uint8), U.UNIFORM)
        ref = x[:m].astype(np.float64) @ wdq.T
        for name, kw, fixed in variants(m):
            shape = fixed or Q4_SG_GPU_WIDE[shape_for_rows(Q4_SG_GPU_WIDE, m)]
            grid = row_groups_grid(-(-N // sg_wg_rows(shape)), m, shape[0])
            pipe = compile_pipeline(dev, source(shape, **kw))
            bgs = [dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
                {"binding": i, "resource": {"buffer": b}} for i, b in enumerate((xb, w, s, out, qb))])
                for w, s in zip(wbufs, sbufs[kw.get("layout", "file")])]
            run(pipe, bgs[:1], grid, 1)
            got = np.frombuffer(dev.queue.read_buffer(out, size=m * N * 4), np.float32).reshape(m, N)
            err = np.abs(got - ref).max() / np.abs(ref).max()
            us = run(pipe, bgs, grid, max(20, int(3e4 // (N * K / 2e6))))
            bad = "" if kw.get("noscale") or err < 1e-5 else f" ERR {err:.1e}"
            lines.append(f"{name:14s} {str(shape):12s} m={m:2d} {us:8.1f}us {N * K / 2 / us / 1e3:6.0f}GB/s {2 * m * N * K / us / 1e6:6.1f}TF{bad}")
    print(f"N={N} K={K} ({copies} copies)\n  " + "\n  ".join(lines), flush=True)


SHAPES = {1: [(1, 1, 2), (1, 2, 2), (1, 4, 2), (1, 8, 2)], 2: [(2, 2, 2), (2, 4, 2), (1, 2, 2)], 4: [(2, 2, 2), (2, 4, 2), (4, 4, 2), (4, 2, 2)],
          8: [(4, 4, 2), (4, 2, 2), (8, 4, 2), (2, 4, 2)], 16: [(4, 4, 2), (4, 2, 2), (4, 8, 2), (8, 4, 2)]}
MODE = sys.argv[1]


def variants(m):
    """(name, source's keywords, shape or None for the route's) of the mode at m rows."""
    if MODE == "shapes":
        return [("quads", {"layout": "quads"}, shape) for shape in SHAPES[m]]
    by_row = {"layout": "by_row"}
    return [("file", {}, None), ("by_row", by_row, None), ("noscale", {"noscale": True}, None),
            ("magic", {"magic": True}, None), ("by_row+magic", {**by_row, "magic": True}, None)]


ROWS = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "1,2,4,8,16").split(",")]
for N, K in [(16384, 2048), (2048, 8192), (3072, 2048), (2048, 2048), (128256, 2048)]:
    case(N, K, ROWS)
