"""The dequantizing GEMM's B load in parts, standalone (the 128 x 128 tile, K steps of 8): as
built; "exponent" (each nibble a float by its exponent bits, no conversion: the same values);
"deferred" (each invocation keeps its quad's word and scale from the load and dequantizes
them when it stores the quad into workgroup memory, after the step's products; the same values:
outputs bitwise as built); "no scale" (the weights times 1: wrong results, what the scale's load
costs); and the fp32 GEMM over float weights. Shapes of bench.py. usage: python load_parts.py [quick]"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gemm_bench import U, bind, buf, compile_pipeline, dev, q4_operands, timed  # noqa: E402

from pte_wgpu.kernels.matmul import gemm as G  # noqa: E402
from pte_wgpu.kernels.matmul.q4_linear import q4_load  # noqa: E402

RAW = """
fn b_raw(n: u32, k: u32, kend: u32) -> vec2<u32> {
    if (n >= p.N || k >= kend) { return vec2<u32>(0x88888888u, 0u); }
    return vec2<u32>(wq[n * q.wpr + k / 8u] >> (4u * (k % 8u)), bitcast<u32>(wscale(k, n)));
}
"""


def deferred(src):
    src = src.replace("fn b_k_quad(", RAW + "fn b_k_quad(")
    src = src.replace("var rb = b_k_quad(boff, n0 + bn, kbeg + 4u * bk4, kend);", "var rbr = b_raw(n0 + bn, kbeg + 4u * bk4, kend);")
    src = src.replace("rb = b_k_quad(boff, n0 + bn, k0 + 8u + 4u * bk4, kend);", "rbr = b_raw(n0 + bn, k0 + 8u + 4u * bk4, kend);")
    i = src.index("        Bs[(4u * bk4 + 0u)")
    src = src[:i] + "        let rb = dq4s(rbr.x, bitcast<f32>(rbr.y));\n" + src[i:]
    dq4s = ("fn dq4s(bits: u32, s: f32) -> vec4<f32> {\n"
            "    let w = vec4<f32>((vec4<u32>(bits) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - vec4<f32>(8.0);\n    return w * s;\n}\n")
    return src.replace("fn dq4(", dq4s + "fn dq4(")


def no_scale(src):
    return src.replace("    return w * wscale(k0, n);", "    if (n == 0xFFFFFFFFu) { return w * wscale(k0, n); }\n    return w;")  # the binding still used


def exponent(src):
    """Each nibble made a float by its exponent bits, 2^23 + n less 2^23 + 8 (exact: n - 8), in
    place of a conversion."""
    old = "    let w = vec4<f32>((vec4<u32>(bits) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - vec4<f32>(8.0);\n    return w * wscale"
    assert old in src
    new = ("    let w = bitcast<vec4<f32>>(((vec4<u32>(bits) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) | vec4<u32>(0x4B000000u))"
           " - vec4<f32>(8388616.0);\n    return w * wscale")
    return src.replace(old, new)


def case(M, N, K, reps):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K)).astype(np.float32)
    weights, uniform, qb, _ = q4_operands(x, N, K, rng)
    xb, wf = buf(x), buf(rng.standard_normal((N, K)).astype(np.float32))
    out = dev.create_buffer(size=M * N * 4, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
    scratch = dev.create_buffer(size=max(4, 16 * M * N) * 4, usage=U.STORAGE)
    tile = G.BIG_TILE
    splits, kspan = G.gemm_split(M, N, K, 1, tile, True)
    pb = buf(np.frombuffer(G.params_bytes(M, N, K, split=(splits, kspan)), np.uint8), U.UNIFORM)
    reduce = [compile_pipeline(dev, G.gemm_reduce_shader(False))] if splits > 1 else []
    rbind = [bind(r, [scratch, out, pb]) for r in reduce]
    grids = [G.gemm_grid("x", M, N, 1, splits, tile)] + ([G.flat_grid(M * N)] if splits > 1 else [])
    q4 = G.gemm_shader(q4_load(False, False, 32, K), False, uniform, tile=tile)
    got = {}
    for name, src in (("as built", q4), ("exponent", exponent(q4)), ("deferred", deferred(q4)), ("no scale", no_scale(q4)), ("fp32", None)):
        if src is None:
            p = compile_pipeline(dev, G.gemm_shader(G.weight_load("f32", "f32", K), False, "", tile=tile))
            bgs = [bind(p, [xb, wf, out, pb, scratch])]
        else:
            p = compile_pipeline(dev, src)
            bgs = [bind(p, [xb, *weights, out, pb, scratch, qb])]
        us = timed([p, *reduce], bgs + rbind, grids, reps, out)
        got[name] = np.frombuffer(dev.queue.read_buffer(out), np.float32).copy()
        print(f"M={M:5d} N={N:5d} K={K:5d} splits {splits} {name:9s} {us:9.1f} us {2 * M * N * K / us / 1e6:6.1f} TFLOP/s", flush=True)
    assert np.array_equal(got["as built"], got["deferred"]), "deferred: not bitwise"
    assert np.array_equal(got["as built"], got["exponent"]), "exponent: not bitwise"


if "quick" in sys.argv:
    case(131, 256, 96, 1)
else:
    R = lambda M, N, K: max(10, int(25e-3 / (2 * M * N * K / 30e12)))  # noqa: E731
    for M in (2047, 512):
        for N, K in ((16384, 2048), (2048, 8192), (3072, 2048)):
            case(M, N, K, R(M, N, K))
