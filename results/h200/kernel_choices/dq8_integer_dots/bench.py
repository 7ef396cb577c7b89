"""8da4w products of 1 to 16 rows: the runtime's 4-bit subgroup kernel over the float rows that
pte_wgpu.quantized_rows writes (base) against the same kernel shape summing the int8 rows with
dot4I8Packed (dots): each lane's step of 16 weights as 4 dot4I8Packed of the nibbles (0..15) with
the row's int8 values (packed by the nibbles' order: the even elements of 8, then the odd ones),
corrected to (nibble - 8) * (q - zp) exactly in i32, then times the group's scale into f32 sums,
times the row's scale at the end. Weights cycled past the L2 cache; both checked against numpy.
From the checkout root on the device:  python bench.py ROWS   (e.g. 1,2,4,8,16)"""
import os
import struct
import sys
import time

import numpy as np
import wgpu

from async_runtime.pipelines import compile_pipeline
from pte_wgpu.kernels.wgsl import row_groups_grid
from pte_wgpu.kernels.matmul import q4_linear as Q
from pte_wgpu.kernels.matmul.linear import sg_wg_rows
from pte_wgpu.kernels.matmul.routes import Q4_SG_GPU_WIDE, Q4_SG_GPU_WIDE_SPLIT, q4_splits_k, shape_for_rows

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


DOTS_HEAD = """struct Q { M: u32, N: u32, K: u32, wpr: u32, groups: u32, gs: u32, kw: u32 };
@group(0) @binding(0) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> wq: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read> ws: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> q: Q;
@group(0) @binding(5) var<storage, read> xs: array<f32>;
@group(0) @binding(6) var<storage, read> xz: array<i32>;
const LOW = 0x0F0F0F0Fu;
const ONES = 0x01010101u;
fn wscale(k: u32, n: u32) -> f32 { return ws[((n >> 2u) * q.groups + min(k / 32u, q.groups - 1u)) * 4u + (n & 3u)]; }
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sgs: u32) {
    let groups = (q.M + ROWSu - 1u) / ROWSu;
    let flat = wid.x + wid.y * nwg.x;
    let r0 = (flat % groups) * ROWSu;
    let wg0 = flat / groups;
    let rows = min(ROWSu, q.M - r0);
    let kv = q.K / 16u;
    let wprv = q.wpr / 2u;
    let nw = wg0 * NWu;
"""


def dots_source(shape):
    """`shape` of three elements; its third 1: the workgroup's 64 invocations split K for one group
    of 4 weight rows (the runtime's Q4_SG_GPU_WIDE_SPLIT), the subgroups' sums added in order."""
    rows, split = shape[0], shape[2] == 1
    walker, stride = ("li", "64u") if split else ("lane", "sgs")
    L = [f"let x{r}_ = min(r0 + {r}u, q.M - 1u); let zp{r} = xz[x{r}_];" for r in range(rows)]
    L += ["{", "let n0 = nw;"] if split else ["for (var g = li / sgs; g < 2u; g = g + 64u / sgs) {", "let n0 = nw + g * 4u;"]
    L += [f"let c{i} = min(n0 + {i}u, q.N - 1u);" for i in range(4)]
    L += [f"var acc{i}_{r} = 0.0;" for i in range(4) for r in range(rows)]
    pre = rows <= 2
    if pre:
        L += ["let vlast = max(q.K / 16u, 1u) - 1u;", f"let vfirst = min({walker}, vlast);"]
        L += [f"var wnext{i} = wq[c{i} * wprv + vfirst]; var snext{i} = wscale(vfirst * 16u, c{i});" for i in range(4)]
    L += [f"for (var v = {walker}; v < q.K / 16u; v = v + {stride}) {{"]
    if pre:
        L += [f"let vnext = min(v + {stride}, vlast);"]
        L += [f"let w{i} = wnext{i}; let s{i} = snext{i}; wnext{i} = wq[c{i} * wprv + vnext]; snext{i} = wscale(vnext * 16u, c{i});" for i in range(4)]
    else:
        L += [f"let w{i} = wq[c{i} * wprv + v]; let s{i} = wscale(v * 16u, c{i});" for i in range(4)]
    for r in range(rows):
        L += [f"let xv{r} = x[x{r}_ * kv + v];",
              f"let xsum{r} = 8 * (dot4I8Packed(xv{r}.x, ONES) + dot4I8Packed(xv{r}.y, ONES) + dot4I8Packed(xv{r}.z, ONES) + dot4I8Packed(xv{r}.w, ONES));"]
    for i in range(4):
        L += [f"let la{i} = w{i}.x & LOW; let ha{i} = (w{i}.x >> 4u) & LOW; let lb{i} = w{i}.y & LOW; let hb{i} = (w{i}.y >> 4u) & LOW;",
              f"let nsum{i} = i32(dot4U8Packed(la{i} + ha{i} + lb{i} + hb{i}, ONES)) - 128;"]
        for r in range(rows):
            L += [f"let p{i}_{r} = dot4I8Packed(la{i}, xv{r}.x) + dot4I8Packed(ha{i}, xv{r}.y) + dot4I8Packed(lb{i}, xv{r}.z) + dot4I8Packed(hb{i}, xv{r}.w);",
                  f"acc{i}_{r} = acc{i}_{r} + f32(p{i}_{r} - xsum{r} - zp{r} * nsum{i}) * s{i};"]
    L += ["}"]
    sums = [(i, r) for r in range(rows) for i in range(4)]
    if split:
        L += [f"let t{k} = subgroupAdd(acc{i}_{r});" for k, (i, r) in enumerate(sums)]
        L += ["if (lane == 0u) { " + " ".join(f"parts[li / sgs * {len(sums)}u + {k}u] = t{k};" for k in range(len(sums))) + " }", "workgroupBarrier();", "if (li == 0u) {"]
        L += [f"var c{k} = parts[{k}u];" for k in range(len(sums))]
        L += ["for (var s = 1u; s < 64u / sgs; s = s + 1u) { " + " ".join(f"c{k} = c{k} + parts[s * {len(sums)}u + {k}u];" for k in range(len(sums))) + " }"]
        L += [f"{{ let n = n0 + {i}u; if (n < q.N && {r}u < rows) {{ out[(r0 + {r}u) * q.N + n] = c{k} * xs[r0 + {r}u]; }} }}" for k, (i, r) in enumerate(sums)]
        L += ["}"]
    else:
        L += [f"{{ let t = subgroupAdd(acc{i}_{r}); let n = n0 + {i}u; if (lane == 0u && n < q.N && {r}u < rows) {{ out[(r0 + {r}u) * q.N + n] = t * xs[r0 + {r}u]; }} }}" for i, r in sums]
    L += ["}", "}"]
    parts = f"var<workgroup> parts: array<f32, {64 * len(sums)}>;\n" if split else ""
    return parts + DOTS_HEAD.replace("ROWSu", f"{rows}u").replace("NWu", f"{4 if split else 8}u") + "    " + "\n    ".join(L) + "\n"


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
    sbufs = [buf(quads) for _ in range(copies)]
    m_all = max(ms)
    xq = rng.integers(-128, 128, (m_all, K)).astype(np.int8)
    zp = rng.integers(-20, 20, m_all).astype(np.int32)
    xs = (rng.random(m_all) * 0.05 + 0.01).astype(np.float32)
    xf = ((xq.astype(np.float32) - zp[:, None]) * xs[:, None]).astype(np.float32)  # the float rows quantized_rows writes
    if os.environ.get("XDATA") == "normal":
        xf = rng.standard_normal((m_all, K)).astype(np.float32)
    order = xq.reshape(m_all, K // 8, 8)[:, :, [0, 2, 4, 6, 1, 3, 5, 7]].reshape(m_all, K)
    xbf, xbi, xsb, xzb = buf(xf), buf(order), buf(xs), buf(zp)
    out = dev.create_buffer(size=m_all * N * 4, usage=U.STORAGE | U.COPY_SRC)
    OUT[:] = [out]
    lines = []
    for m in ms:
        qb = buf(np.frombuffer(struct.pack(Q.LIN_FORMAT, m, N, K, K // 8, K // GS, GS, K // 8), np.uint8), U.UNIFORM)
        ref = xf[:m].astype(np.float64) @ wdq.T
        shape = Q4_SG_GPU_WIDE[shape_for_rows(Q4_SG_GPU_WIDE, m)]
        names = ("base", "split", "dots", "dots_split") if q4_splits_k(N) else ("base", "dots")
        for name in names:
            if name in ("base", "split"):
                sh = Q4_SG_GPU_WIDE_SPLIT[shape_for_rows(Q4_SG_GPU_WIDE_SPLIT, m)] if name == "split" else shape
                src, extra, xb = Q.sg_shader(False, False, False, sh, Q.Storage(), False, GS), (), xbf
                grid = row_groups_grid(-(-N // sg_wg_rows(sh)), m, sh[0])
            else:
                sh = Q4_SG_GPU_WIDE_SPLIT[shape_for_rows(Q4_SG_GPU_WIDE_SPLIT, m)] if name == "dots_split" else shape
                grid = row_groups_grid(-(-N // sg_wg_rows(sh)), m, sh[0])
                src, extra, xb = dots_source(sh), (xsb, xzb), xbi
            pipe = compile_pipeline(dev, src)
            bgs = [dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
                {"binding": i, "resource": {"buffer": b}} for i, b in enumerate((xb, w, s, out, qb, *extra))])
                for w, s in zip(wbufs, sbufs)]
            run(pipe, bgs[:1], grid, 1)
            got = np.frombuffer(dev.queue.read_buffer(out, size=m * N * 4), np.float32).reshape(m, N)
            err = np.abs(got - ref).max() / np.abs(ref).max()
            us = run(pipe, bgs, grid, int(os.environ.get("REPS", 0)) or max(20, int(3e4 // (N * K / 2e6))))
            lines.append(f"{name:10s} {str(sh):10s} m={m:2d} {us:8.1f}us {N * K / 2 / us / 1e3:6.0f}GB/s {2 * m * N * K / us / 1e6:6.1f}TF err {err:.1e}")
    print(f"N={N} K={K} ({copies} copies)\n  " + "\n  ".join(lines), flush=True)


ROWS = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "1,2,4,8,16").split(",")]
for N, K in [(int(a), int(b)) for a, b in (s.split("x") for s in (sys.argv[2] if len(sys.argv) > 2 else "16384x2048,2048x8192,3072x2048,128256x2048").split(","))]:
    case(N, K, ROWS)
