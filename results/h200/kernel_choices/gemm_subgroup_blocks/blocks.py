"""The GEMM template's tiles with each subgroup's invocations placed as rows of 16 (as built) or as
blocks of 4 x 8 and 8 x 4 (Tile.sx, from sx.diff), standalone: f32 [N, K] weights and 4-bit
weights (../gemm_bench.py's tile_tflops). usage: python blocks.py [quick]"""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gemm_bench import tile_tflops  # noqa: E402

from pte_wgpu.kernels.matmul import gemm as G  # noqa: E402

QUICK = "quick" in sys.argv


def case(kind, tile_name, tile, M, N, K):
    res = tile_tflops(kind, M, N, K, [(f"sx{sx}", dataclasses.replace(tile, sx=sx)) for sx in (16, 8, 4)], QUICK)
    print(f"{kind} {tile_name} {M}x{N}x{K}: " + "  ".join(f"{n} {v:5.1f}" for n, v in res.items()) + " TFLOP/s", flush=True)


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
