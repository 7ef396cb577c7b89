"""The GEMM template over f16 [N, K] weights and f16 rows (an fp16 export's products) at 33-64 rows (a
ragged pass of that many decode rows), standalone: each tile with the runtime's K splits, and TILE with
other row-split targets; every tile twice, alternately (the better figure), every result checked
against numpy in float64. usage (from the checkout's root): python3 tiles.py [M,M,...] [cold]; "cold": TILE
and MID_TILE only, each dispatch over another copy of the weight (copies of at least 256 MB in all,
past the L2 cache), as a model's pass reads them."""
import sys

import numpy as np

sys.path.insert(0, "results/h200/kernel_choices")
from gemm_bench import U, bind, buf, compile_pipeline, dev, spin, timed  # noqa: E402
from pte_wgpu.kernels.matmul import gemm as G  # noqa: E402
from pte_wgpu.kernels.wgsl import flat_grid  # noqa: E402

CANDIDATES = [
    ("TILE", G.TILE, None),
    ("TILE rows 512", G.TILE, 512),
    ("TILE rows 2048", G.TILE, 2048),
    ("MID (8,2,1,u)", G.MID_TILE, None),
    ("WIDE_ROW (16,1,2,u)", G.WIDE_ROW_TILE, None),
    ("64x128 (8,2,2,u)", G.Tile(8, 2, 2, True), None),
    ("TILE u", G.Tile(16, 1, 1, True), None),
    ("TILE k32", G.Tile(16, 1, 1, False, 32), None),
]


COLD = "cold" in sys.argv
if COLD:
    CANDIDATES = [c for c in CANDIDATES if c[0] in ("TILE", "MID (8,2,1,u)")]


def case(M, N, K):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K)).astype(np.float16)
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float16)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    load = G.weight_load("f16", "f16", K)
    copies = -(-(256 << 20) // w.nbytes) if COLD else 1
    xb, wbs = buf(x), [buf(w) for _ in range(copies)]
    out = dev.create_buffer(size=M * N * 4, usage=U.STORAGE | U.COPY_SRC)
    scratch = dev.create_buffer(size=max(4, 16 * M * N * 4), usage=U.STORAGE)
    reps = max(20, int(25e-3 / (2 * M * N * K / 20e12)))
    best = {}
    for name, tile, target in CANDIDATES * 2:
        saved = G.ROW_SPLIT_TARGET
        G.ROW_SPLIT_TARGET = target or saved
        splits, kspan = G.gemm_split(M, N, K, 1, tile)
        G.ROW_SPLIT_TARGET = saved
        pb = buf(np.frombuffer(G.params_bytes(M, N, K, split=(splits, kspan)), np.uint8), U.UNIFORM)
        p = compile_pipeline(dev, G.gemm_shader(load, False, "", tile=tile))
        pipes, bufs, grids = [], [], []
        r = compile_pipeline(dev, G.gemm_reduce_shader(False)) if splits > 1 else None
        for wb in wbs:
            pipes.append(p)
            bufs.append([xb, wb, out, pb, scratch])
            grids.append(G.gemm_grid("x", M, N, 1, splits, tile))
            if r is not None:
                pipes.append(r)
                bufs.append([scratch, out, pb])
                grids.append(flat_grid(M * N))
        us = timed(pipes, [bind(p, b) for p, b in zip(pipes, bufs)], grids, max(2, reps // copies), out) / copies
        got = np.frombuffer(dev.queue.read_buffer(out), np.float32).reshape(M, N)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < 1e-3, (name, M, N, K, err)
        if us < best.get(name, (1e30,))[0]:
            best[name] = (us, splits)
    base = best["TILE"][0]
    for name, (us, splits) in best.items():
        print(f"M={M:3d} N={N:6d} K={K:5d} {name:22s} splits {splits:2d}: {us:8.1f} us {2 * M * N * K / us / 1e6:5.1f} TFLOP/s "
              f"{base / us:4.2f}x TILE", flush=True)


spin()
for M in [int(m) for m in (sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "cold" else "64,48").split(",")]:
    for N, K in ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)):
        case(M, N, K)
