"""GEMM tiles alone on f16 operands (an fp16 export's products), decode row counts.

env: SHAPES="M,N,K ..." ("M,N1+N2,K": a column group), TILES="MID_TILE MATRIX_TILE X1,4,4,2" (X: a matrix
tile of that shape), SPLITS="0,1,4" (0: the runtime's), COPIES (weight copies cycled past the L2 cache)
"""
import os
import time

import numpy as np

import async_runtime  # noqa: F401 (chooses the backend: PTE_WGPU_BACKEND=dawn)
import wgpu
from async_runtime import pipelines
from pte_wgpu.kernels.matmul import f16_matrix, gemm
from pte_wgpu.kernels.wgsl import flat_grid

U = wgpu.BufferUsage


def main():
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    print(adapter.summary, flush=True)
    keys = ("max-compute-workgroup-storage-size", "max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage")
    feats = [f for f in ("chromium-experimental-subgroup-matrix", "subgroups", "subgroup", "shader-f16") if f in adapter.features]
    d = adapter.request_device_sync(required_features=feats, required_limits={k: adapter.limits[k] for k in keys})
    shapes = [s.split(",") for s in os.environ["SHAPES"].split()]
    tiles = os.environ["TILES"].split()
    copies = int(os.environ.get("COPIES", "1"))
    rng = np.random.default_rng(0)
    for m, ns, k in shapes:
        m, k, ns = int(m), int(k), [int(x) for x in ns.split("+")]
        n = sum(ns)
        ranges = list(gemm.column_ranges(ns)) if len(ns) > 1 else [(0, n)]
        a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
        w = rng.uniform(-1, 1, (n, k)).astype(np.float16)
        want = a.astype(np.float64) @ w.T.astype(np.float64)
        ba = d.create_buffer_with_data(data=a.tobytes(), usage=U.STORAGE)
        weights = [[d.create_buffer_with_data(data=w[s:e].tobytes(), usage=U.STORAGE) for s, e in ranges] for _ in range(copies)]
        outs = [d.create_buffer(size=m * (e - s) * 2, usage=U.STORAGE | U.COPY_SRC) for s, e in ranges]
        done = d.create_buffer(size=16, usage=U.STORAGE | U.COPY_SRC)
        bs = d.create_buffer(size=16 * m * n * 4, usage=U.STORAGE)
        for name in tiles:
            base, _, step = name.partition(":s")
            f16_matrix.STEP = int(step or 32)
            f16_matrix.ROW, f16_matrix.QUADS = f16_matrix.STEP + 8, f16_matrix.STEP // 4
            tile = gemm.Tile(matrix=tuple(int(x) for x in base[1:].split(","))) if base.startswith("X") else getattr(gemm, base)
            if len(ns) == 1:
                load, store, extra = gemm.weight_load("f16", "f16", k), None, ""
            else:  # outputs past the first bound after the scratch, as GemmRoute binds them
                load, store = gemm.column_group("f16", ["f16"] * len(ns), ns, k)
                extra = "".join(f"@group(0) @binding({len(ns) + 4 + j}) var<storage, read_write> out{j + 1}: array<f16>;\n" for j in range(len(ns) - 1))
            src = gemm.gemm_shader(load, False, extra, tile=tile, out="f16", store=store)
            try:
                pipe = d.create_compute_pipeline(layout="auto", compute={"module": pipelines.shader_module(d, pipelines.wgsl_for_device(src)), "entry_point": "main"})
            except Exception as e:
                print(f"{name}: {str(e).splitlines()[0]}")
                continue
            rextra = "".join(f"@group(0) @binding({3 + j}) var<storage, read_write> out{j + 1}: array<f16>;\n" for j in range(len(ns) - 1))
            rsrc = gemm.gemm_reduce_shader(False, out="f16", store=store, extra=rextra)
            rpipe = d.create_compute_pipeline(layout="auto", compute={"module": pipelines.shader_module(d, pipelines.wgsl_for_device(rsrc)), "entry_point": "main"})
            for forced in [int(x) for x in os.environ.get("SPLITS", "0").split(",")]:
                splits, kspan = gemm.gemm_split(m, n, k, 1, tile)
                if forced:
                    kspan = -(-k // forced // 32) * 32
                    splits = -(-k // kspan)
                bp = d.create_buffer_with_data(data=gemm.params_bytes(m, n, k, split=(splits, kspan)), usage=U.UNIFORM)
                bgs = [d.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}}
                                                                                          for i, b in enumerate((ba, *ws, outs[0], bp, bs, *outs[1:]))]) for ws in weights]
                rbg = d.create_bind_group(layout=rpipe.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate((bs, outs[0], bp, *outs[1:]))])
                grid = gemm.gemm_grid(name, m, n, 1, splits, tile)

                def submit(reps):
                    enc = d.create_command_encoder()
                    cp = enc.begin_compute_pass()
                    for r in range(reps):
                        cp.set_pipeline(pipe)
                        cp.set_bind_group(0, bgs[r % len(bgs)])
                        cp.dispatch_workgroups(*grid)
                        if splits > 1:
                            cp.set_pipeline(rpipe)
                            cp.set_bind_group(0, rbg)
                            cp.dispatch_workgroups(*flat_grid(m * n))
                    cp.end()
                    d.queue.submit([enc.finish()])

                submit(1)
                got = np.concatenate([np.frombuffer(d.queue.read_buffer(o), np.float16).reshape(m, -1) for o in outs], axis=1).astype(np.float64)
                err = np.abs(got - want).max() / np.abs(want).max()
                reps = max(3 * copies, int(2e10 / (m * n * k)))
                times = []
                for _ in range(5):
                    t = time.perf_counter()
                    submit(reps)
                    d.queue.read_buffer(done)
                    times.append((time.perf_counter() - t) / reps)
                med = sorted(times)[2]
                print(f"{m}x{'+'.join(map(str, ns))}x{k} {name:12s} {tile.bm}x{tile.bn} splits {splits:2d}: rel err {err:.1e} {med * 1e6:8.1f} us "
                      f"{2 * m * n * k / med / 1e12:6.1f} TFLOP/s", flush=True)


main()
