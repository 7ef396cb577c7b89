"""One-row 4-bit product variants: R weight rows a subgroup, D steps of loads in flight, S subgroups splitting K."""
import struct, sys, time
import numpy as np
import wgpu
from async_runtime.pipelines import compile_pipeline
from pte_wgpu.resize.shapes import fold_grid
from pte_wgpu.kernels.matmul import q4_linear as Q

adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
lim = adapter.limits
dev = adapter.request_device_sync(required_features=["subgroup"], required_limits={
    "max-storage-buffer-binding-size": lim["max-storage-buffer-binding-size"], "max-buffer-size": lim["max-buffer-size"]})
U = wgpu.BufferUsage
GS = 32

import os
W = int(os.environ.get('LANES', 32))
def gen(R, D, S, G=2):
    head = Q.sg_shader(False, False, False, (1, 4, 2), Q.Storage(), False, 32)
    head = head[: head.index("@compute")]
    L = [f"var<workgroup> part: array<f32, {S * G * R}>;" if S > 1 else "",
         f"@compute @workgroup_size({W * S * G})",
         "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {",
         "let flat = wid.x + wid.y * nwg.x;", f"let sg = li / {W}u;", f"let g = sg / {S}u;", f"let s = sg % {S}u;",
         f"let n0 = (flat * {G}u + g) * {R}u;", "let kv4 = q.K / 4u;", "let wprv = q.wpr / 2u;",
         "let steps = q.K / 16u;", f"let per = (steps + {S - 1}u) / {S}u;", "let vbeg = s * per;", "let vend = min(vbeg + per, steps);",
         "let vlast = max(vend, 1u) - 1u;"]
    L += [f"let c{i} = min(n0 + {i}u, q.N - 1u); var acc{i} = vec2<f32>(0.0);" for i in range(R)]
    L += ["var v = vbeg + lane;"]
    for d in range(D):
        L += [f"var w{d}_{i} = wq[c{i} * wprv + min(v + {W * d}u, vlast)]; var s{d}_{i} = wscale(min(v + {W * d}u, vlast) * 16u, c{i});" for i in range(R)]
    L += ["while (v < vend) {", f"  let vn = v + {W * D}u;"]
    for d in range(D):
        L += [f"  let nw{d}_{i} = wq[c{i} * wprv + min(vn + {W * d}u, vlast)]; let ns{d}_{i} = wscale(min(vn + {W * d}u, vlast) * 16u, c{i});" for i in range(R)]
    for d in range(D):
        L += [f"  if (v + {W * d}u < vend) {{", f"    let vv = v + {W * d}u;"]
        for c in range(2):
            L += [f"    {{ let x0a = x4(vv * 4u + {2 * c}u); let x0b = x4(vv * 4u + {2 * c + 1}u);"]
            for i in range(R):
                L += [f"      let d{i} = nibbles(w{d}_{i}.{'xy'[c]}); let a{i} = d{i}.a * s{d}_{i}; let b{i} = d{i}.b * s{d}_{i};",
                      f"      acc{i} = acc{i} + x0a.xy * a{i}.xy + x0a.zw * a{i}.zw + x0b.xy * b{i}.xy + x0b.zw * b{i}.zw;"]
            L += ["    }"]
        L += ["  }"]
    for d in range(D):
        L += [f"  w{d}_{i} = nw{d}_{i}; s{d}_{i} = ns{d}_{i};" for i in range(R)]
    L += ["  v = vn;", "}"]
    L += [f"let t{i} = subgroupAdd(acc{i}.x + acc{i}.y);" for i in range(R)]
    if S == 1:
        L += [f"if (lane == 0u && n0 + {i}u < q.N) {{ out[n0 + {i}u] = t{i}; }}" for i in range(R)]
    else:
        L += [f"if (lane == 0u) {{ part[sg * {R}u + {i}u] = t{i}; }}" for i in range(R)]
        L += ["workgroupBarrier();", f"if (li < {G * R}u) {{", f"  let gg = li / {R}u; let i = li % {R}u; let n = (flat * {G}u + gg) * {R}u + i;",
              f"  var t = part[gg * {S * R}u + i];"]
        L += [f"  t = t + part[(gg * {S}u + {s}u) * {R}u + i];" for s in range(1, S)]
        L += ["  if (n < q.N) { out[n] = t; }", "}"]
    L += ["}"]
    return head + "\n".join(L) + "\n"

def buf(a, usage=U.STORAGE):
    return dev.create_buffer_with_data(data=np.ascontiguousarray(a).tobytes(), usage=usage | U.COPY_SRC)

def run(pipe, bgs, grid, reps, out):
    times = []
    for t in range(4):
        enc = dev.create_command_encoder(); cp = enc.begin_compute_pass(); cp.set_pipeline(pipe)
        n = reps if t else 1
        for i in range(n):
            cp.set_bind_group(0, bgs[i % len(bgs)]); cp.dispatch_workgroups(*grid)
        cp.end(); t0 = time.perf_counter(); dev.queue.submit([enc.finish()]); dev.queue.read_buffer(out, size=4)
        times.append((time.perf_counter() - t0) / n)
    return min(times[1:]) * 1e6

VARIANTS = [tuple(int(a) for a in v.split(":")) for v in sys.argv[1].split(",")]
SHAPES = [tuple(int(v) for v in nk.split("x")) for nk in sys.argv[2].split(",")]
for N, K in SHAPES:
    rng = np.random.default_rng(1)
    nib = rng.integers(0, 16, (N, K), dtype=np.uint8)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    sn = -(-N // 4) * 4
    scales = rng.random((K // GS, sn)).astype(np.float32) * 0.02 + 0.001
    copies = 1 if 'small' in sys.argv else max(1, min(16, int(400e6 // packed.nbytes)))
    wbufs = [buf(packed) for _ in range(copies)]
    sbuf = buf(scales)
    x = rng.standard_normal((1, K)).astype(np.float32)
    xb = buf(x)
    out = dev.create_buffer(size=N * 4, usage=U.STORAGE | U.COPY_SRC)
    qb = buf(np.frombuffer(struct.pack(Q.LIN_FORMAT, 1, N, K, K // 8, sn, K // GS, GS, K // 8), np.uint8), U.UNIFORM)
    ref = None
    line = []
    for R, D, S in VARIANTS:
        if R == 0:
            pipe = compile_pipeline(dev, Q.sg_shader(False, False, False, (1, 4, 2), Q.Storage(), False, 32))
            grid = fold_grid(-(-N // 8))[:2] + (1,)
        else:
            pipe = compile_pipeline(dev, gen(R, D, S))
            grid = fold_grid(-(-N // (2 * R)))[:2] + (1,)
        bgs = [dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": i, "resource": {"buffer": b}} for i, b in enumerate((xb, w, sbuf, out, qb))]) for w in wbufs]
        run(pipe, bgs[:1], grid, 1, out)
        got = np.frombuffer(dev.queue.read_buffer(out, size=N * 4), np.float32).copy()
        if ref is None:
            ref = got
            wd = (nib.astype(np.float64) - 8) * np.repeat(scales[:, :N].T.astype(np.float64), GS, axis=1)
            print('vs numpy', np.abs(got - x[0] @ wd.T).max() / np.abs(x[0] @ wd.T).max())
        same = "bitwise" if np.array_equal(got, ref) else f"rel {np.abs(got - ref).max() / np.abs(ref).max():.1e}"
        us = run(pipe, bgs, grid, 2 if 'small' in sys.argv else max(20, int(3e4 // (N * K / 2e6))), out)
        line.append(f"R{R} D{D} S{S} {us:8.1f}us {N * K * 0.625 / us / 1e3:6.0f}GB/s {same}")
    print(f"N={N} K={K}\n  " + "\n  ".join(line), flush=True)
