"""GEMM template tiles, standalone: fp32 [N,K] weights and 4-bit weights, timed over many dispatches,
checked against numpy. usage: python gemmbench.py [quick]"""
import sys

import numpy as np
from gemm_bench import U, bind, buf, compile_pipeline, dev, q4_operands, spin, timed

from pte_wgpu.kernels.matmul import gemm as G
from pte_wgpu.kernels.matmul.q4_linear import q4_load

QUICK = "quick" in sys.argv
TILES = [G.Tile(16, 1, 1), G.Tile(16, 2, 2, True), G.Tile(8, 1, 1)]
SWEEP = "sweep" in sys.argv
if SWEEP:
    TILES = [G.TILE, G.BIG_TILE, G.Tile(8, 2, 2, True), G.Tile(16, 4, 2, True), G.Tile(8, 2, 1, True), G.Tile(8, 2, 2)]
SMALLM = "smallm" in sys.argv
CNN = "cnn" in sys.argv
if CNN:
    TILES = [G.TILE, G.MID_TILE]
if SMALLM:
    TILES = [G.TILE, G.Tile(8, 2, 1, True), G.SMALL_TILE, G.Tile(4, 2, 1, True), G.Tile(8, 1, 1, True), G.Tile(8, 2, 1)]
if QUICK:
    TILES = [G.Tile(8, 4, 2, True), G.Tile(16, 2, 4, True), G.Tile(8, 2, 1, True)]
def case(kind, M, N, K, reps):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K)).astype(np.float32)
    if kind == "f32":
        w = rng.standard_normal((N, K)).astype(np.float32)
        ins = [buf(x), buf(w)]
        load, extra_wgsl = G.float_load(True), ""
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
    elif kind == "f32kn":  # B as [K, N] (mm, bmm, pointwise convolutions)
        w = rng.standard_normal((K, N)).astype(np.float32)
        ins = [buf(x), buf(w)]
        load, extra_wgsl = G.float_load(False), ""
        ref = x.astype(np.float64) @ w.astype(np.float64)
    else:
        weights, extra_wgsl, qb, ref = q4_operands(x, N, K, rng)
        ins = [buf(x), *weights]
        load = q4_load(False, False, 32, K)
    out = dev.create_buffer(size=M * N * 4, usage=U.STORAGE | U.COPY_SRC)
    scratch = dev.create_buffer(size=max(4, 8 * M * N) * 4, usage=U.STORAGE)
    res = []
    if not QUICK:
        spin()
    for tile in TILES + TILES:
        splits, kspan = G.gemm_split(M, N, K, 1, tile)
        pb = buf(np.frombuffer(G.params_bytes(M, N, K, split=(splits, kspan)), np.uint8), U.UNIFORM)
        bound = [*ins, out, pb, scratch] + ([qb] if kind == "q4" else [])
        p = compile_pipeline(dev, G.gemm_shader(load, False, extra_wgsl, tile=tile))
        pipes, bufs, grids = [p], [bound], [G.gemm_grid("x", M, N, 1, splits, tile)]
        if splits > 1:
            r = compile_pipeline(dev, G.gemm_reduce_shader(False))
            pipes.append(r)
            bufs.append([scratch, out, pb])
            grids.append(G.flat_grid(M * N))
        us = timed(pipes, [bind(p, b) for p, b in zip(pipes, bufs)], grids, reps, out)
        got = np.frombuffer(dev.queue.read_buffer(out), np.float32).reshape(M, N)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        res.append((us, tile))
        name = f"({tile.ty},{tile.rq},{tile.cq}{',u' if tile.unroll else ''})"
        print(f"{kind} M={M:5d} N={N:5d} K={K:5d} tile {tile.bm:3d}x{tile.bn:3d} {name} k16 splits {splits}: {us:9.1f} us "
              f"{2 * M * N * K / us / 1e6:6.1f} TFLOP/s err {err:.1e}", flush=True)
    best = min(res, key=lambda r: r[0])
    print(f"  best {best[1]} {res[0][0] / best[0]:.2f}x the 64x64", flush=True)


if SWEEP:
    R = lambda M, N, K: max(10, int(25e-3 / (2 * M * N * K / 30e12)))  # noqa: E731
    for M in (1576, 197):
        for N, K in ((2304, 768), (768, 768), (3072, 768), (768, 3072)):
            case("f32", M, N, K, R(M, N, K))
    for M in (512, 2047):
        for N, K in ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)):
            case("f32", M, N, K, R(M, N, K))
            case("q4", M, N, K, R(M, N, K))
    for N, K in ((2112, 576), (576, 576), (3072, 576), (576, 1536)):
        case("f32", 2047, N, K, R(2047, N, K))
        case("q4", 2047, N, K, R(2047, N, K))
    for kind in ("f32", "q4"):
        case(kind, 4096, 4096, 4096, 10)
elif CNN:  # ResNet-50's pointwise convolutions at batch 1 and 8, ViT's out-projection bmm
    R = lambda M, N, K: max(20, int(25e-3 / (2 * M * N * K / 20e12)))  # noqa: E731
    for b in (1, 8):
        for hw, shapes in ((3136, ((64, 64), (64, 256), (256, 64))), (784, ((256, 128), (128, 512), (512, 128))), (196, ((512, 256), (256, 1024), (1024, 256)))):
            for K, N in shapes:
                case("f32kn", b * hw, N, K, R(b * hw, N, K))
    case("f32kn", 197, 768, 768, 100)
elif SMALLM:
    R = lambda M, N, K: max(20, int(25e-3 / (2 * M * N * K / 15e12)))  # noqa: E731
    for M in (64, 48, 32, 24):
        for N, K in ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)):
            case("q4", M, N, K, R(M, N, K))
    for M in (64, 48):
        for N, K in ((2112, 576), (576, 576), (3072, 576), (576, 1536)):
            case("f32", M, N, K, R(M, N, K))
elif QUICK:
    case("f32", 67, 131, 96, 2)
    case("q4", 67, 136, 96, 2)
else:
    for kind in ("f32", "q4"):
        case(kind, 4096, 4096, 4096, 10)
    for N, K in ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)):
        case("f32", 2047, N, K, 20)
        case("q4", 2047, N, K, 20)
    for N, K in ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)):
        case("q4", 64, N, K, 30)
        case("q4", 32, N, K, 30)
    for M in (1576,):
        for N, K in ((2304, 768), (3072, 768), (768, 3072)):
            case("f32", M, N, K, 30)
    for N, K in ((1536, 576), (576, 1536)):
        case("q4", 2047, N, K, 30)
