"""The GEMM template's big tile in variants of its K step and A load, standalone: fp32 [N, K]
weights and 4-bit weights, timed over many dispatches after a warm-up spin, every result checked
against numpy. usage: python variants.py [quick]"""
import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gemm_bench import U, bind, buf, compile_pipeline, dev, q4_operands, spin, timed  # noqa: E402

from pte_wgpu.kernels.matmul import gemm as G  # noqa: E402
from pte_wgpu.kernels.matmul.q4_linear import q4_load  # noqa: E402

QUICK = "quick" in sys.argv
BIG = G.Tile(rq=2, cq=2, unroll=True)  # the 128 x 128 tile as it was: K steps of 16
MID = G.Tile(ty=8, rq=2, unroll=True)
# (name, tile, A 4 of K a load, B 4 of K a load (fp32 weights))
ROUND = int(next((a[len("round="):] for a in sys.argv if a.startswith("round=")), "3"))
K8 = dict(bk=8)
VARIANTS = [
    ("big", BIG, False, False),
    ("big a4", BIG, True, False),
    ("big k32", dataclasses.replace(BIG, bk=32), False, False),
    ("big k8 a4", dataclasses.replace(BIG, **K8), True, False),
    ("mid", MID, False, False),
    ("mid a4", MID, True, False),
] if ROUND == 1 else [
    ("big", BIG, False, False),
    ("big k8", dataclasses.replace(BIG, **K8), False, False),
    ("big k8 a4", dataclasses.replace(BIG, **K8), True, False),
    ("big k8 a4 b4", dataclasses.replace(BIG, **K8), True, True),
    ("256x128 k8 a4", G.Tile(16, 4, 2, True, **K8), True, False),
    ("128x256 k8 a4", G.Tile(16, 2, 4, True, **K8), True, False),
    ("mid", MID, False, False),
    ("mid k8 a4", dataclasses.replace(MID, **K8), True, False),
    ("tile", G.TILE, False, False),
    ("tile a4", G.TILE, True, False),
] if ROUND == 2 else [
    ("big", BIG, False, False),
    ("big k8 a4", dataclasses.replace(BIG, **K8), True, False),
    ("big k8 a4 b4", dataclasses.replace(BIG, **K8), True, True),
    ("mid", MID, False, False),
    ("mid a4", MID, True, False),
    ("mid a4 b4", MID, True, True),
    ("tile", G.TILE, False, False),
    ("tile a4", G.TILE, True, False),
    ("tile a4 b4", G.TILE, True, True),
    ("small", G.SMALL_TILE, False, False),
    ("small a4", G.SMALL_TILE, True, False),
]


def with_a4(load, binding):
    """`load` reading A (binding `binding`, f32) 4 of K a load."""
    inputs = tuple((name, "vec4<f32>") if name == binding else (name, t) for name, t in load.inputs)
    return dataclasses.replace(load, inputs=inputs, functions=load.functions.replace(G.float_a_at(binding), G.float_a_k_quad(binding)), a_k_quads=True)


def case(kind, M, N, K, reps):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K)).astype(np.float32)
    extra_wgsl, more = "", []
    if kind == "f32":
        w = rng.standard_normal((N, K)).astype(np.float32)
        ins, a_name = [buf(x), buf(w)], "a"
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
    else:
        weights, extra_wgsl, qb, ref = q4_operands(x, N, K, rng)
        ins, a_name, more = [buf(x), *weights], "x", [qb]
    out = dev.create_buffer(size=M * N * 4, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
    scratch = dev.create_buffer(size=max(4, 16 * M * N) * 4, usage=U.STORAGE)
    if not QUICK:
        spin()
    for name, tile, a4, b4 in VARIANTS + VARIANTS:
        if kind != "f32" and b4:
            continue
        # K 1 in q4_load: its activations one k a load, which with_a4 turns into 4 where asked
        load = G.float_load(True, k_quads=b4) if kind == "f32" else q4_load(False, False, 32, 1)
        load = with_a4(load, a_name) if a4 else load
        splits, kspan = G.gemm_split(M, N, K, 1, tile)
        pb = buf(np.frombuffer(G.params_bytes(M, N, K, split=(splits, kspan)), np.uint8), U.UNIFORM)
        pipes = [compile_pipeline(dev, G.gemm_shader(load, False, extra_wgsl, tile=tile))]
        bgs, grids = [bind(pipes[0], [*ins, out, pb, scratch, *more])], [G.gemm_grid("x", M, N, 1, splits, tile)]
        if splits > 1:
            pipes.append(compile_pipeline(dev, G.gemm_reduce_shader(False)))
            bgs.append(bind(pipes[1], [scratch, out, pb]))
            grids.append(G.flat_grid(M * N))
        dev.queue.write_buffer(out, 0, np.zeros(M * N, np.float32).tobytes())
        us = timed(pipes, bgs, grids, reps, out)
        got = np.frombuffer(dev.queue.read_buffer(out), np.float32).reshape(M, N)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        print(f"{kind:3s} M={M:5d} N={N:5d} K={K:5d} {name:14s} splits {splits}: {us:9.1f} us {2 * M * N * K / us / 1e6:6.1f} TFLOP/s err {err:.1e}", flush=True)
        assert err < 1e-4, err


if QUICK:
    case("f32", 131, 136, 100, 1)
    case("q4", 131, 136, 96, 1)
elif ROUND == 1:
    R = lambda M, N, K: max(10, int(25e-3 / (2 * M * N * K / 30e12)))  # noqa: E731
    for kind in ("f32", "q4"):
        case(kind, 4096, 4096, 4096, 10)
    for N, K in ((16384, 2048), (2048, 8192), (3072, 2048)):
        for kind in ("f32", "q4"):
            case(kind, 2047, N, K, R(2047, N, K))
    case("q4", 512, 16384, 2048, R(512, 16384, 2048))
    case("f32", 1576, 3072, 768, R(1576, 3072, 768))
else:  # the shapes each tile takes today: 128 x 128 (4096^3, the 1B's), 8 x 4 (ViT's, SmolLM2's), 4 x 4 (few rows)
    R = lambda M, N, K: max(10, int(25e-3 / (2 * M * N * K / 30e12)))  # noqa: E731
    for kind in ("f32", "q4"):
        case(kind, 4096, 4096, 4096, 10)
        for M, N, K in ((2047, 16384, 2048), (512, 2048, 8192), (512, 3072, 2048), (128, 8192, 2048), (64, 16384, 2048), (32, 2048, 2048), (24, 8192, 2048)):
            case(kind, M, N, K, R(M, N, K))
    for M, N, K in ((1576, 2304, 768), (1576, 768, 768), (1576, 3072, 768), (1576, 768, 3072), (197, 2304, 768), (197, 768, 3072), (2047, 2112, 576), (2047, 576, 1536)):
        case("f32", M, N, K, R(M, N, K))
    for M, N, K in ((2047, 2112, 576), (2047, 576, 1536), (512, 1536, 576)):
        case("q4", M, N, K, R(M, N, K))
