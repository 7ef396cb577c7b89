"""The GEMM template's tiles on products of 32 to 64 rows (a ragged decode pass), standalone: 4-bit
weights (q4_load) and f32 [N, K] weights (weight_load), the runtime's K splits for each tile, timed
over many dispatches after a warm-up spin, every tile twice, alternately, every result checked
against numpy. usage: python tiles.py [quick]"""
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


TILES = [
    ("4x4", G.TILE),
    ("8x4", G.MID_TILE),
    ("4x8 64x128", G.WIDE_ROW_TILE),
    ("8x8 64x128", G.Tile(ty=8, rq=2, cq=2, unroll=True)),
    ("8x8 64x128 k8", G.Tile(ty=8, rq=2, cq=2, unroll=True, bk=8, b_quads=True)),
    ("4x16 64x256", G.Tile(rq=1, cq=4, unroll=True)),
    ("8x8 128x128", G.BIG_TILE),
] if "first" in sys.argv else [("4x4", G.TILE), ("8x4", G.MID_TILE), ("small 32x64", G.SMALL_TILE), ("8x4 32x64", G.Tile(ty=4, rq=2, unroll=True, b_quads=True))]


def variants(tile):
    return TILES


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
    scratch = dev.create_buffer(size=max(4, 16 * M * N * 4), usage=U.STORAGE)
    reps = 2 if QUICK else max(10, int(25e-3 / (2 * M * N * K / 30e12)))
    if not QUICK:
        spin()
    res = {}
    for name, t in variants(tile) * 2:
        splits, kspan = G.gemm_split(M, N, K, 1, t, dequantizes=kind == "q4")
        pb = buf(np.frombuffer(G.params_bytes(M, N, K, split=(splits, kspan)), np.uint8), U.UNIFORM)
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
    print(f"{kind} {M}x{N}x{K}: " + "  ".join(f"{n} {max(v):5.1f}" for n, v in res.items()) + " TFLOP/s", flush=True)


if QUICK:
    case("q4", "", None, 67, 256, 96)
    case("f32", "", None, 67, 256, 96)
elif "first" in sys.argv:
    for M in (64, 48, 32):
        for N, K in ((16384, 2048), (128256, 2048), (2048, 8192), (3072, 2048), (2048, 2048)):
            case("q4", "", None, M, N, K)
    case("f32", "", None, 64, 16384, 2048)
    for N, K in ((28672, 4096), (4096, 14336), (6144, 4096), (128256, 4096)):
        case("q4", "", None, 64, N, K)
else:  # 17 to 32 rows, where SMALL_TILE takes them, and the LM head from 33 rows
    for M in (17, 24, 32):
        for N, K in ((16384, 2048), (128256, 2048), (2048, 8192), (3072, 2048), (2048, 2048), (1536, 576), (576, 1536), (49152, 576)):
            case("q4", "", None, M, N, K)
    for M in (33, 40, 56):
        for N, K in ((128256, 2048), (16384, 2048), (49152, 576)):
            case("q4", "", None, M, N, K)
