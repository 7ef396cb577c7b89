"""The GEMM template over f16 rows and f16 [N, K] weights (an fp16 export's products), each tile
with its K steps summed in f32 (as the runtime sums) and in f16 (`Tile.half`: workgroup memory in
halves, each K step's products summed in f16, then added to the f32 sums), with the runtime's K
splits; every candidate twice alternately (the better figure); each result's largest error against
numpy in float64, relative to the largest output. usage (from the checkout's root): python3 tiles.py [more]"""
import dataclasses
import sys

import numpy as np

sys.path.insert(0, "results/h200/kernel_choices")
from gemm_bench import U, bind, buf, compile_pipeline, dev, spin, timed  # noqa: E402
from pte_wgpu.kernels.matmul import gemm as G  # noqa: E402
from pte_wgpu.kernels.wgsl import flat_grid  # noqa: E402

TILES = [("TILE", G.TILE), ("MID", G.MID_TILE), ("BIG", G.BIG_TILE)]
# other shapes, summed in f16 only, against the f32 tile of the same name before the colon (second call: python3 tiles.py more)
MORE = [("BIG:bk16", dataclasses.replace(G.BIG_TILE, bk=16)), ("MID:bk32", dataclasses.replace(G.MID_TILE, bk=32)),
        ("MID:128x64", G.Tile(16, 2, 1, True, b_quads=True)), ("MID:64x128", G.Tile(8, 2, 2, True, b_quads=True)),
        ("TILE:bk32", dataclasses.replace(G.TILE, bk=32)), ("MID:32x64", G.Tile(4, 2, 1, True, b_quads=True))]


def case(M, N, K, names):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K)).astype(np.float16)
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float16)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    load = G.weight_load("f16", "f16", K)
    xb, wb = buf(x), buf(w)
    out = dev.create_buffer(size=M * N * 4, usage=U.STORAGE | U.COPY_SRC)
    scratch = dev.create_buffer(size=max(4, 16 * M * N * 4), usage=U.STORAGE)
    reps = max(5, int(25e-3 / (2 * M * N * K / 30e12)))
    best = {}
    candidates = [(n + h, dataclasses.replace(t, half=bool(h))) for n, t in TILES if n in names for h in ("", " half")]
    candidates += [(n + " half", dataclasses.replace(t, half=True)) for n, t in MORE if n.split(":")[0] in names] if "more" in sys.argv else []
    for name, tile in candidates * 2:
        splits, kspan = G.gemm_split(M, N, K, 1, tile)
        pb = buf(np.frombuffer(G.params_bytes(M, N, K, split=(splits, kspan)), np.uint8), U.UNIFORM)
        p = compile_pipeline(dev, G.gemm_shader(load, False, "", tile=tile))
        pipes, bufs, grids = [p], [[xb, wb, out, pb, scratch]], [G.gemm_grid("x", M, N, 1, splits, tile)]
        if splits > 1:
            pipes.append(compile_pipeline(dev, G.gemm_reduce_shader(False)))
            bufs.append([scratch, out, pb])
            grids.append(flat_grid(M * N))
        us = timed(pipes, [bind(p, b) for p, b in zip(pipes, bufs)], grids, reps, out)
        got = np.frombuffer(dev.queue.read_buffer(out), np.float32).reshape(M, N)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < 1e-2, (name, M, N, K, err)
        if us < best.get(name, (1e30,))[0]:
            best[name] = (us, splits, err)
    for name, (us, splits, err) in best.items():
        base = best[name.split(":")[0].replace(" half", "")][0]
        print(f"M={M:4d} N={N:6d} K={K:5d} {name:9s} splits {splits:2d}: {us:8.1f} us {2 * M * N * K / us / 1e6:5.1f} TFLOP/s "
              f"{base / us:4.2f}x  error {err:.1e}", flush=True)


spin()
for M in (64, 48) if "more" not in sys.argv else (64, 32):
    for N, K in ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)):
        case(M, N, K, ("TILE", "MID"))
for M in (512, 2047):
    for N, K in ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)):
        case(M, N, K, ("MID", "BIG"))
case(4096, 4096, 4096, ("MID", "BIG"))
