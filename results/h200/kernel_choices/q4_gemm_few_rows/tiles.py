"""The dequantizing GEMM's tiles for ragged passes of 17 to 64 decode rows over 4-bit weights of the
1B and 8B shapes, standalone: each tile with the runtime's K splits (gemm_split, dequantizing), timed
over many dispatches after the GPU is spun up, every result checked against numpy.
usage: python tiles.py [M,M,..] [quick] [splits]"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gemm_bench import U, bind, buf, compile_pipeline, dev, q4_operands, timed  # noqa: E402

from pte_wgpu.kernels.matmul import gemm as G  # noqa: E402
from pte_wgpu.kernels.matmul.q4_linear import q4_load  # noqa: E402

QUICK = "quick" in sys.argv
ROWS = [int(m) for m in sys.argv[1].split(",")] if len(sys.argv) > 1 and sys.argv[1][0].isdigit() else [24, 32, 48, 64]
# candidates by row count: (tile, split rule) with the runtime's rule first
# a candidate: (tile, whether its K splits follow the dequantizing rule or the float products' row splits)
FEW = [(G.SMALL_TILE, True), (G.Tile(8, 1, 2, True), True), (G.Tile(4, 2, 2, True), True), (G.Tile(8, 1, 2), True)]
MORE = [(G.TILE, True), (G.Tile(8, 2, 2, True), True), (G.Tile(16, 1, 2, True), True), (G.Tile(8, 2, 2), True), (G.Tile(16, 1, 2), True)]
if "splits" in sys.argv:  # the 64 x 128 tile against the runtime's tile, each with both split rules
    MORE = [(G.TILE, True), (G.TILE, False), (G.Tile(16, 1, 2, True), True), (G.Tile(16, 1, 2, True), False)]


def case(M, N, K, reps, tiles):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K)).astype(np.float32)
    weights, extra, qb, ref = q4_operands(x, N, K, rng)
    ins = [buf(x), *weights]
    load = q4_load(False, False, 32, K)
    out = dev.create_buffer(size=M * N * 4, usage=U.STORAGE | U.COPY_SRC)
    scratch = dev.create_buffer(size=max(4, 16 * M * N) * 4, usage=U.STORAGE)
    res = []
    for tile, dequantizing in tiles + tiles:
        splits, kspan = G.gemm_split(M, N, K, 1, tile, dequantizes=dequantizing)
        pb = buf(np.frombuffer(G.params_bytes(M, N, K, split=(splits, kspan)), np.uint8), U.UNIFORM)
        p = compile_pipeline(dev, G.gemm_shader(load, False, extra, tile=tile))
        pipes, bgs, grids = [p], [bind(p, [*ins, out, pb, scratch, qb])], [G.gemm_grid("x", M, N, 1, splits, tile)]
        if splits > 1:
            r = compile_pipeline(dev, G.gemm_reduce_shader(False))
            pipes.append(r)
            bgs.append(bind(r, [scratch, out, pb]))
            grids.append(G.flat_grid(M * N))
        us = timed(pipes, bgs, grids, reps, out)
        got = np.frombuffer(dev.queue.read_buffer(out), np.float32).reshape(M, N)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < 1e-5, err
        res.append((us, (tile, dequantizing)))
        name = f"({tile.ty},{tile.rq},{tile.cq}{',u' if tile.unroll else ''}{'' if dequantizing else ',rs'})"
        print(f"M={M:3d} N={N:6d} K={K:5d} tile {tile.bm:3d}x{tile.bn:3d} {name:10s} splits {splits:2d}: {us:8.1f} us "
              f"{2 * M * N * K / us / 1e6:5.1f} TFLOP/s", flush=True)
    base = min(us for us, t in res if t == tiles[0])
    for tile in tiles[1:]:
        print(f"  {tile[0]}{'' if tile[1] else ' row splits'}: {base / min(us for us, t in res if t == tile):.2f}x the runtime's tile", flush=True)


SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048),  # the 1B: q/k/v, o, gate+up, down, head
          (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]  # the 8B
if QUICK:
    case(37, 136, 96, 2, MORE)
    case(19, 136, 96, 2, FEW)
else:
    for M in ROWS:
        for N, K in SHAPES:
            case(M, N, K, max(10, int(20e-3 / (2 * M * N * K / 15e12))), FEW if M <= 32 else MORE)
