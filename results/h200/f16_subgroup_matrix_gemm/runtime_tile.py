"""The runtime's GEMM tiles alone on Dawn: MATRIX_TILE (f16 subgroup matrices) against the f32 tiles
(MID_TILE, BIG_TILE) of the same f16 operands, an fp16 export's products at prompt rows (Llama-3.2-1B's
shapes), the runtime's K splits; each result checked against float64 of the same halves.

python3 runtime_tile.py   env: SHAPES="M,N,K ...", TILES="MATRIX_TILE MID_TILE BIG_TILE"
"""
import os
import time

import numpy as np

import async_runtime  # noqa: F401 (chooses the backend: PTE_WGPU_BACKEND=dawn)
import wgpu
from async_runtime import pipelines
from pte_wgpu.kernels.matmul import gemm
from pte_wgpu.kernels.wgsl import flat_grid


RAW = """
fn a_raw(off: u32, m: u32, k: u32, kend: u32) -> vec2<u32> { return a[(off + m * p.K + k) / 4u]; }
fn b_raw(off: u32, n: u32, k: u32, kend: u32) -> vec2<u32> { return $B; }
"""

GROUP_B = "w0[(off + n * p.K + k) / 4u] | (w1[0] & vec2<u32>(0u))"  # the second weight still bound


def edit(src, edits):
    """Variants of MATRIX_TILE's kernel for timing (results not checked): "raw", its operands loaded
    without bounds (a column group's B from its first weight); "noepi", its results stored straight into the scratch."""
    if "noepi" in edits:
        head, _, tail = src.partition("    let total = p.batch * p.M * p.N;")
        stores = "".join(f"    subgroupMatrixStore<row_major>(&part, (m0 + a_at + {16 * i}u) * p.N + n0 + b_at + {16 * j}u, c{i}_{j}, p.N);\n"
                         for i in range(4) for j in range(4))
        src = head + stores + "}\n"
    if "raw" in edits:  # a column group's B read from its first weight alone
        src = src.replace("= a_k_halves(", "= a_raw(").replace("= b_k_halves(", "= b_raw(") + RAW.replace("$B", GROUP_B if "w1:" in src else "bm[(off + n * p.K + k) / 4u]")
    return src


def main():
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    print(adapter.summary, flush=True)
    keys = ("max-compute-workgroup-storage-size", "max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage")
    d = adapter.request_device_sync(required_features=[f for f in ("chromium-experimental-subgroup-matrix", "subgroups", "subgroup", "shader-f16")
                                                       if f in adapter.features], required_limits={k: adapter.limits[k] for k in keys})
    # "M,N,K", or "M,N1+N2+..,K": a column group of weights of N1, N2, .. rows (q/k/v, gate/up)
    shapes = [s.split(",") for s in os.environ.get("SHAPES", "2047,3072,2048 2047,2048,2048 2047,16384,2048 2047,2048,8192 512,16384,2048").split()]
    tiles = os.environ.get("TILES", "MATRIX_TILE MID_TILE BIG_TILE").split()
    rng = np.random.default_rng(0)
    for m, ns, k in shapes:
        m, k, ns = int(m), int(k), [int(x) for x in ns.split("+")]
        n = sum(ns)
        a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
        w = rng.uniform(-1, 1, (n, k)).astype(np.float16)
        rows = rng.choice(m, 16, replace=False)
        want = a[rows].astype(np.float64) @ w.T.astype(np.float64)
        ba = d.create_buffer_with_data(data=a.tobytes(), usage=wgpu.BufferUsage.STORAGE)
        bw = d.create_buffer_with_data(data=w.tobytes(), usage=wgpu.BufferUsage.STORAGE)
        bo = d.create_buffer(size=m * n * 2, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        parts = [d.create_buffer_with_data(data=w[s:e].tobytes(), usage=wgpu.BufferUsage.STORAGE) for s, e in gemm.column_ranges(ns)]
        outs = [bo] + [d.create_buffer(size=m * nj * 2, usage=wgpu.BufferUsage.STORAGE) for nj in ns[1:]]
        done = d.create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        bs = d.create_buffer(size=max(16, 8 * m * n * 4), usage=wgpu.BufferUsage.STORAGE)
        for name in tiles:
            tile = getattr(gemm, name.split(":")[0])
            if len(ns) == 1:
                load, store, extra, buffers = gemm.weight_load("f16", "f16", k), None, "", (ba, bw, bo)
            else:  # outputs past the first bound after the scratch, as GemmRoute binds them
                load, store = gemm.column_group("f16", ["f16"] * len(ns), ns, k)
                extra = "".join(f"@group(0) @binding({len(ns) + 4 + j}) var<storage, read_write> out{j + 1}: array<f16>;\n" for j in range(len(ns) - 1))
                buffers = (ba, *parts, bo)
            src = edit(gemm.gemm_shader(load, False, extra, tile=tile, out="f16", store=store), name.split(":")[1:])
            pipe = d.create_compute_pipeline(layout="auto", compute={"module": pipelines.shader_module(d, pipelines.wgsl_for_device(src)), "entry_point": "main"})
            splits, kspan = gemm.gemm_split(m, n, k, 1, tile)
            bp = d.create_buffer_with_data(data=gemm.params_bytes(m, n, k, split=(splits, kspan)), usage=wgpu.BufferUsage.UNIFORM)
            bg = d.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate((*buffers, bp, bs, *outs[1:]))])
            grid = gemm.gemm_grid(name, m, n, 1, splits, tile)
            rsrc = gemm.gemm_reduce_shader(False, out="f16")
            rpipe = d.create_compute_pipeline(layout="auto", compute={"module": pipelines.shader_module(d, pipelines.wgsl_for_device(rsrc)), "entry_point": "main"})
            rbg = d.create_bind_group(layout=rpipe.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate((bs, bo, bp))])

            def submit(reps):
                enc = d.create_command_encoder()
                cp = enc.begin_compute_pass()
                for _ in range(reps):
                    cp.set_pipeline(pipe)
                    cp.set_bind_group(0, bg)
                    cp.dispatch_workgroups(*grid)
                    if splits > 1:
                        cp.set_pipeline(rpipe)
                        cp.set_bind_group(0, rbg)
                        cp.dispatch_workgroups(*flat_grid(m * n))
                cp.end()
                d.queue.submit([enc.finish()])

            submit(1)
            got = np.frombuffer(d.queue.read_buffer(bo), np.float16)[:m * ns[0]].reshape(m, ns[0])[rows].astype(np.float64)
            want_first = want[:, :ns[0]]
            err = np.abs(got[:, :ns[0]] - want_first).max() / np.abs(want_first).max()
            reps = max(3, int(2e10 / (m * n * k)))
            times = []
            for _ in range(5):
                t = time.perf_counter()
                submit(reps)
                d.queue.read_buffer(done)
                times.append((time.perf_counter() - t) / reps)
            med = sorted(times)[2]
            print(f"{m}x{'+'.join(map(str, ns))}x{k} {name:12s} splits {splits}: rel err {err:.1e} {med * 1e6:9.1f} us {2 * m * n * k / med / 1e12:6.1f} TFLOP/s", flush=True)


main()
