"""The GEMM template's tiles with each subgroup's invocations placed as rows of 16 (as built) or as
blocks of 4 x 8 and 8 x 4 (Tile.sx), standalone: f32 [N, K] weights (the runtime's weight_load)
and 4-bit weights (q4_load), timed over many dispatches after a warm-up spin, every variant twice,
alternately, every result checked against numpy. usage: python blocks.py [quick]"""
import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gemm_bench import U, bind, buf, compile_pipeline, dev, q4_operands, timed  # noqa: E402

from pte_wgpu.kernels.matmul import gemm as G  # noqa: E402
from pte_wgpu.kernels.matmul.q4_linear import q4_load  # noqa: E402
from pte_wgpu.kernels.wgsl import flat_grid  # noqa: E402

QUICK = "quick" in sys.argv


def variants(tile):
    return [(f"sx{sx}", dataclasses.replace(tile, sx=sx)) for sx in (16, 8, 4)]


def spin():
    """~0.3 s of GPU work first, so that clocks are up before a case's first variant."""
    n = 2048
    a, w = buf(np.ones((n, n), np.float32)), buf(np.ones((n, n), np.float32))
    out = dev.create_buffer(size=n * n * 4, usage=U.STORAGE | U.COPY_SRC)
    pb = buf(np.frombuffer(G.params_bytes(n, n, n), np.uint8), U.UNIFORM)
    p = compile_pipeline(dev, G.gemm_shader(G.float_load(True), False, "", tile=G.TILE))
    timed([p], [bind(p, [a, w, out, pb, out])], [G.gemm_grid("x", n, n, 1, 1, G.TILE)], 300, out)


def case(kind, tile_name, tile, M, N, K):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K)).astype(np.float32)
    extra_wgsl, more = "", []
    if kind == "f32":
        w = rng.standard_normal((N, K)).astype(np.float32)
        ins = [buf(x), buf(w)]
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
        load = G.weight_load("f32", "f32", K)
    else:
        weights, extra_wgsl, qb, ref = q4_operands(x, N, K, rng)
        ins, more = [buf(x), *weights], [qb]
        load = q4_load(False, False, 32, K)
    out = dev.create_buffer(size=M * N * 4, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
    splits, kspan = G.gemm_split(M, N, K, 1, tile, dequantizes=kind == "q4")
    scratch = dev.create_buffer(size=max(4, splits * M * N * 4), usage=U.STORAGE)
    pb = buf(np.frombuffer(G.params_bytes(M, N, K, split=(splits, kspan)), np.uint8), U.UNIFORM)
    reps = 2 if QUICK else max(10, int(25e-3 / (2 * M * N * K / 30e12)))
    if not QUICK:
        spin()
    res = {}
    for name, t in variants(tile) * 2:
        p = compile_pipeline(dev, G.gemm_shader(load, False, extra_wgsl, tile=t))
        pipes, bufs, grids = [p], [[*ins, out, pb, scratch, *more]], [G.gemm_grid("x", M, N, 1, splits, t)]
        if splits > 1:
            r = compile_pipeline(dev, G.gemm_reduce_shader(False))
            pipes.append(r)
            bufs.append([scratch, out, pb])
            grids.append(flat_grid(M * N))
        dev.queue.write_buffer(out, 0, np.zeros(M * N, np.float32).tobytes())
        us = timed(pipes, [bind(p, b) for p, b in zip(pipes, bufs)], grids, reps, out)
        got = np.frombuffer(dev.queue.read_buffer(out), np.float32).reshape(M, N)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < 1e-4, (kind, M, N, K, name, err)
        res.setdefault(name, []).append(2 * M * N * K / us / 1e6)
    print(f"{kind} {tile_name} {M}x{N}x{K} splits {splits}: " + "  ".join(f"{n} {max(v):5.1f}" for n, v in res.items()) + " TFLOP/s", flush=True)


if QUICK:
    case("f32", "big", G.BIG_TILE, 67, 136, 96)
    case("q4", "tile", G.TILE, 67, 136, 96)
    case("f32", "mid", G.MID_TILE, 67, 136, 96)
else:
    for M, N, K in ((4096, 4096, 4096), (2047, 16384, 2048), (2047, 2048, 8192), (2047, 3072, 2048), (2047, 2048, 2048), (512, 16384, 2048)):
        case("f32", "big", G.BIG_TILE, M, N, K)
    for M, N, K in ((64, 16384, 2048), (64, 128256, 2048), (64, 2048, 8192), (64, 3072, 2048), (64, 2048, 2048), (32, 16384, 2048)):
        case("q4", "tile", G.TILE, M, N, K)
    for M, N, K in ((1576, 2304, 768), (1576, 3072, 768), (2047, 3072, 576), (2047, 2112, 576)):
        case("f32", "mid", G.MID_TILE, M, N, K)
    case("f32", "tile", G.TILE, 64, 16384, 2048)
    case("q4", "big", G.BIG_TILE, 4096, 4096, 4096)
