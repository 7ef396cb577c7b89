"""A prompt's 4-bit products two ways, standalone: the dequantizing GEMM (the 4-bit weights turned
into floats as each tile is staged), against one pass writing the whole weight as floats into a
scratch buffer and the fp32 GEMM over it, at the same tile and split (so the same sums: the outputs
are compared bit for bit). Llama-3.2-1B's products (SwiGLU's gate and up as one, q/k/v as one, the
output and down products) at prompt rows. usage: python bench.py [quick]"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gemm_bench import U, bind, buf, compile_pipeline, dev, q4_operands, timed  # noqa: E402

from pte_wgpu.kernels.matmul import gemm as G  # noqa: E402
from pte_wgpu.kernels.matmul.q4_linear import LIN_STRUCT, _dequant, q4_load  # noqa: E402
from pte_wgpu.kernels.wgsl import fill  # noqa: E402

QUICK = "quick" in sys.argv
# one invocation a weight word: its 8 weights (nibble - 8) * scale, as the GEMM's dequantizing load
# computes them (dq4: the 4 weights of a half word times the word's scale), into a row of K floats
DEQUANTIZE = """
@group(0) @binding(0) var<storage, read> wq: array<u32>;
@group(0) @binding(1) var<storage, read> ws: array<f32>;
@group(0) @binding(2) var<storage, read_write> w: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> q: Q;
$FUNCTIONS
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= q.N * q.wpr) { return; }
    let n = i / q.wpr;
    let u = i % q.wpr;
    let word = wq[i];
    w[(n * q.K + 8u * u) / 4u] = dq4(word, 8u * u, n);
    w[(n * q.K + 8u * u) / 4u + 1u] = dq4(word >> 16u, 8u * u + 4u, n);
}
"""


def case(M, N, K, reps):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K)).astype(np.float32)
    weights, uniform, qb, ref = q4_operands(x, N, K, rng)
    xb = buf(x)
    out = dev.create_buffer(size=M * N * 4, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
    scratch = dev.create_buffer(size=max(4, 16 * M * N) * 4, usage=U.STORAGE)
    wf = dev.create_buffer(size=N * K * 4, usage=U.STORAGE | U.COPY_SRC)
    tile = G.BIG_TILE if G.takes_big_tile(M, N, K) else G.MID_TILE
    splits, kspan = G.gemm_split(M, N, K, 1, tile, True)  # the 4-bit product's plan, for both
    pb = buf(np.frombuffer(G.params_bytes(M, N, K, split=(splits, kspan)), np.uint8), U.UNIFORM)
    reduce = [compile_pipeline(dev, G.gemm_reduce_shader(False))] if splits > 1 else []
    rgrid = [G.flat_grid(M * N)] if splits > 1 else []
    q4 = compile_pipeline(dev, G.gemm_shader(q4_load(False, False, 32, K), False, uniform, tile=tile))
    f32 = compile_pipeline(dev, G.gemm_shader(G.weight_load("f32", "f32", K), False, "", tile=tile))
    deq = compile_pipeline(dev, LIN_STRUCT + ";\n" + fill(DEQUANTIZE, FUNCTIONS=_dequant(False, False, 32)))
    grid = G.gemm_grid("x", M, N, 1, splits, tile)
    words = N * (K // 8)
    dgrid = (min(words // 256 + 1, 65535), -(-(words // 256 + 1) // 65535), 1)
    results = {}
    for name, pipes, bgs, grids in (
        ("4-bit GEMM", [q4, *reduce], [bind(q4, [xb, *weights, out, pb, scratch, qb]), *(bind(r, [scratch, out, pb]) for r in reduce)], [grid, *rgrid]),
        ("floats, then fp32 GEMM", [deq, f32, *reduce], [bind(deq, [*weights, wf, qb]), bind(f32, [xb, wf, out, pb, scratch]), *(bind(r, [scratch, out, pb]) for r in reduce)],
         [dgrid, grid, *rgrid]),
        ("the floats alone", [deq], [bind(deq, [*weights, wf, qb])], [dgrid]),
    ):
        dev.queue.write_buffer(out, 0, np.zeros(M * N, np.float32).tobytes())
        us = timed(pipes, bgs, grids, reps, out)
        got = np.frombuffer(dev.queue.read_buffer(out), np.float32).reshape(M, N)
        results[name] = got
        tf = f"{2 * M * N * K / us / 1e6:6.1f} TFLOP/s" if "GEMM" in name else ""
        print(f"M={M:5d} N={N:5d} K={K:5d} splits {splits} {name:24s} {us:9.1f} us {tf}", flush=True)
    err = np.abs(results["4-bit GEMM"] - ref).max() / np.abs(ref).max()
    assert err < 1e-4, err
    assert np.array_equal(results["4-bit GEMM"], results["floats, then fp32 GEMM"]), "not bitwise"


if QUICK:
    case(131, 136, 96, 1)
else:
    R = lambda M, N, K: max(10, int(25e-3 / (2 * M * N * K / 30e12)))  # noqa: E731
    for M in (2047, 512, 128):
        for N, K in ((16384, 2048), (3072, 2048), (2048, 2048), (2048, 8192)):
            case(M, N, K, R(M, N, K))
