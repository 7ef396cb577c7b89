"""One row, the 4-bit subgroup kernels alone, with the code of the scales in quads (fac350e): the (1, R, 2)
kernel against a prototype splitting K over KS subgroups of a workgroup (the same R weight rows, the
partial sums added through workgroup memory); weights and scales cycled past the L2 cache; timing and
a numpy check. (The kept kernel, q4_linear.py's sg_body at routes.py's Q4_SG_GPU_WIDE_SPLIT, is KS = 2
at R = 4 with a workgroup of 64.)"""
import re
import struct
import time

import numpy as np
import wgpu

from async_runtime.pipelines import compile_pipeline
from pte_wgpu.kernels.wgsl import row_groups_grid
from pte_wgpu.kernels.matmul import q4_linear as Q

adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
lim = adapter.limits
dev = adapter.request_device_sync(required_features=["subgroup"], required_limits={
    "max-storage-buffer-binding-size": lim["max-storage-buffer-binding-size"], "max-buffer-size": lim["max-buffer-size"]})
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


def ksplit(R, ks):
    src = Q.sg_shader(False, False, False, (1, R, 2), Q.Storage(), False, GS)
    if ks == 1:
        return src
    def sub(old, new):
        nonlocal src
        assert old in src, old
        src = src.replace(old, new)
    sub(f"let nw = wg0 * {2 * R}u;", f"let nw = wg0 * {R}u;")
    sub("for (var g = li / sgs; g < 2u; g = g + 64u / sgs) {", "let part = li / sgs; {")
    sub(f"let n0 = nw + g * {R}u;", "let n0 = nw;")
    sub("let vfirst = min(lane, vlast);", "let vfirst = min(lane + part * sgs, vlast);")
    sub("for (var v = lane; v < q.K / 16u; v = v + sgs) {", f"for (var v = lane + part * sgs; v < q.K / 16u; v = v + {ks}u * sgs) {{")
    sub("let vnext = min(v + sgs, vlast);", f"let vnext = min(v + {ks}u * sgs, vlast);")
    sub("@workgroup_size(64)", f"@workgroup_size({32 * ks})")
    pat = re.compile(r"\{ let v0 = subgroupAdd\((.*?)\); let n = n0 \+ (\d+)u; if \(lane == 0u && n < q.N && 0u < rows\) \{ (.*?) \} \}")
    found = pat.findall(src)
    assert len(found) == R, len(found)
    lines = [f"let t{i} = subgroupAdd({e});" for e, i, _ in found]
    lines.append("if (lane == 0u && part > 0u) { " + " ".join(f"parts[(part - 1u) * {R}u + {i}u] = t{i};" for _, i, _ in found) + " }")
    lines.append("workgroupBarrier();")
    body = []
    for e, i, store in found:
        adds = " ".join(f"v0 = v0 + parts[{p * R + int(i)}u];" for p in range(ks - 1))
        body.append(f"{{ var v0 = t{i}; {adds} let n = n0 + {i}u; if (n < q.N && 0u < rows) {{ {store} }} }}")
    lines.append("if (lane == 0u && part == 0u) { " + " ".join(body) + " }")
    start = src.index(found[0][0]) - len("{ let v0 = subgroupAdd(")
    end = list(pat.finditer(src))[-1].end()
    src = src[:start] + "\n    ".join(lines) + src[end:]
    src = src.replace("@compute", f"var<workgroup> parts: array<f32, {(ks - 1) * R}>;\n@compute", 1)
    return src


def case(N, K, variants):
    rng = np.random.default_rng(1)
    nib = rng.integers(0, 16, (N, K), dtype=np.uint8)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    sn = -(-N // 4) * 4
    scales = (rng.random((K // GS, sn)).astype(np.float32) * 0.02 + 0.001)
    wdq = (nib.astype(np.float64) - 8) * np.repeat(scales[:, :N].T.astype(np.float64), GS, axis=1)
    copies = max(1, min(16, int(400e6 // packed.nbytes)))
    wbufs = [buf(packed) for _ in range(copies)]
    quads = scales.reshape(K // GS, sn // 4, 4).transpose(1, 0, 2)
    sbufs = [buf(quads) for _ in range(copies)]
    x = rng.standard_normal((1, K)).astype(np.float32)
    xb = buf(x)
    out = dev.create_buffer(size=N * 4, usage=U.STORAGE | U.COPY_SRC)
    OUT[:] = [out]
    qb = buf(np.frombuffer(struct.pack(Q.LIN_FORMAT, 1, N, K, K // 8, K // GS, GS, K // 8), np.uint8), U.UNIFORM)
    ref = x.astype(np.float64) @ wdq.T
    lines = []
    for R, ks in variants:
        grid = row_groups_grid(-(-N // (R * (2 if ks == 1 else 1))), 1, 1)
        pipe = compile_pipeline(dev, ksplit(R, ks))
        bgs = [dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": i, "resource": {"buffer": b}} for i, b in enumerate((xb, w, s, out, qb))]) for w, s in zip(wbufs, sbufs)]
        run(pipe, bgs[:1], grid, 1)
        got = np.frombuffer(dev.queue.read_buffer(out, size=N * 4), np.float32).reshape(1, N)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        us = run(pipe, bgs, grid, max(20, int(3e4 // (N * K / 2e6))))
        bad = "" if err < 1e-5 else f" ERR {err:.1e}"
        lines.append(f"R={R} KS={ks}  {us:8.1f}us {N * K / 2 / us / 1e3:6.0f}GB/s{bad}")
    print(f"N={N} K={K} ({copies} copies)\n  " + "\n  ".join(lines), flush=True)


print(adapter.info["device"], flush=True)
V = [(4, 1), (4, 2), (4, 4), (2, 2), (2, 4), (8, 2)]
for rep in range(2):
    for N, K in [(16384, 2048), (2048, 8192), (3072, 2048), (2048, 2048), (128256, 2048)]:
        case(N, K, V)
