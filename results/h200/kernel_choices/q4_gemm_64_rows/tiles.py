"""The GEMM template's tiles on products of 17 to 64 rows (a ragged decode pass), standalone: 4-bit
weights and f32 [N, K] weights (../gemm_bench.py's tile_tflops). usage: python tiles.py [first] [quick]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gemm_bench import tile_tflops  # noqa: E402

from pte_wgpu.kernels.matmul import gemm as G  # noqa: E402

QUICK = "quick" in sys.argv
FIRST = "first" in sys.argv
TILES = [
    ("4x4", G.TILE),
    ("8x4", G.MID_TILE),
    ("4x8 64x128", G.WIDE_ROW_TILE),
    ("8x8 64x128", G.Tile(ty=8, rq=2, cq=2, unroll=True)),
    ("8x8 64x128 k8", G.Tile(ty=8, rq=2, cq=2, unroll=True, bk=8, b_quads=True)),
    ("4x16 64x256", G.Tile(rq=1, cq=4, unroll=True)),
    ("8x8 128x128", G.BIG_TILE),
] if FIRST else [("4x4", G.TILE), ("8x4", G.MID_TILE), ("small 32x64", G.SMALL_TILE), ("8x4 32x64", G.Tile(ty=4, rq=2, unroll=True, b_quads=True))]


def case(kind, M, N, K):
    res = tile_tflops(kind, M, N, K, TILES, QUICK)
    print(f"{kind} {M}x{N}x{K}: " + "  ".join(f"{n} {v:5.1f}" for n, v in res.items()) + " TFLOP/s", flush=True)


if QUICK:
    case("q4", 67, 256, 96)
    case("f32", 67, 256, 96)
elif FIRST:
    for M in (64, 48, 32):
        for N, K in ((16384, 2048), (128256, 2048), (2048, 8192), (3072, 2048), (2048, 2048)):
            case("q4", M, N, K)
    case("f32", 64, 16384, 2048)
    for N, K in ((28672, 4096), (4096, 14336), (6144, 4096), (128256, 4096)):
        case("q4", 64, N, K)
else:  # 17 to 32 rows, where SMALL_TILE takes a 1B's products, and heads past 32 rows
    for M in (17, 24, 32):
        for N, K in ((16384, 2048), (128256, 2048), (2048, 8192), (3072, 2048), (2048, 2048), (1536, 576), (576, 1536), (49152, 576)):
            case("q4", M, N, K)
    for M in (33, 40, 56):
        for N, K in ((128256, 2048), (16384, 2048), (49152, 576)):
            case("q4", M, N, K)
