"""Linear layers over per-channel quantized weights: int8 (`_weight_int8pack_mm`, the q8ta
family) and 4-bit (`et_vk.linear_qcs4w`).

- `aten._weight_int8pack_mm(x, w int8 [N, K], scales [N])`: x @ w.T * scales (weight-only).
- `et_vk.linear_qcs4w(x, w uint8 [N, Kp/2], scales [N])`: the same with 4-bit weights, two per
  byte, the even k in the high nibble, each stored as q + 8.
- `et_vk.linear_q8ta_q8csw`: x (float) quantized per tensor, times int8 weights, float out.
- `et_vk.q8ta_linear` / `q8ta_linear_gemv`: int8 in, int8 out (optionally through relu).

The q8ta ops accumulate (xq - x_zp) * wq exactly in i32, then scale by x_scale * w_scale[n], add
the bias and requantize; the reference dequantizes both operands and sums in f32, so an output
can differ from it by one quantization step where it lands on a rounding boundary.

One invocation computes the 4 outputs of one output word (kernels/quant/int8_elementwise.py), each a dot product
over K in f32 or i32 (float16 activations, scales and biases read as f32): a plain kernel for the
small layers quantized PT2E graphs have; the q4gsw kernels (kernels/matmul/q4_linear.py) are the tuned
path for LLM weights. The q8ta ops' integer sums run as a tiled product instead where the weight
rows are whole words (kernels/quant/int8_gemm.py), the word kernel adding its K splits' sums:
the same integers, so the same outputs.
"""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..wgsl import fill, wgsl_type
from . import int8_gemm
from .int8_elementwise import QUANT_FNS, inv, reader, word_grid, word_main, zero_point

LIN_PARAMS = "<5I12x4f4i"  # outputs, N, K, weight row length, K splits; then (at 32) 4 floats and 4 ints of constants
LIN_STRUCT = "struct P { n: u32, N: u32, K: u32, row: u32, splits: u32, f: vec4<f32>, k: vec4<i32> }"

# A 4-bit weight: byte k / 2 of row n, the even k in the high nibble, stored as q + 8.
NIBBLE_READER = """@group(0) @binding($BINDING) var<storage, read> w: array<u32>;
fn w_at(i: u32) -> i32 {
    let byte = (w[i / 8u] >> (8u * ((i / 2u) % 4u))) & 0xFFu;
    return i32(select(byte & 15u, byte >> 4u, i % 2u == 0u)) - 8;
}
"""

DOT = """
fn value(e: u32) -> $OUT {
    let m = e / p.N;
    let n = e % p.N;
    var acc = $ACC(0);
    $SUM
    $EPILOGUE
}
"""
LOOP = "for (var k = 0u; k < p.K; k = k + 1u) { acc = acc + $TERM; }"
SPLIT_SUMS = "for (var s = 0u; s < p.splits; s = s + 1u) { acc = acc + parts[s * p.n + e]; }"

# The tiled product's B (int8_gemm.py): row n of x, read as int8 ($BYTE of element i), zeros past K
INPUT_ROWS = """
struct G { $FIELDS, inv: f32 }
fn b_pair(b: u32, n: u32, kw: u32) -> vec2<u32> {
    var words = vec2<u32>(0u);
    for (var j = 0u; j < 8u; j = j + 1u) {
        let k = 4u * kw + j;
        if (n < g.N && k < g.K) {
            let i = n * g.K + k;
            words[j / 4u] = words[j / 4u] | ((u32($BYTE) & 0xFFu) << (8u * (j % 4u)));
        }
    }
    return words;
}
fn part_index(b: u32, m: u32, n: u32) -> u32 { return n * g.M + m; }
"""


def product_shader(x_dtype, x_byte, matrices=False):
    """The tiled product of a q8ta linear (int8_gemm.py; `matrices`: on int8 subgroup matrices):
    x of `x_dtype` read as int8 by `x_byte`, the weight, the sums, the uniform G."""
    head = reader("x", x_dtype, 0) + reader("w", "int8", 1) + QUANT_FNS
    head += "@group(0) @binding(2) var<storage, read_write> parts: array<i32>;\n@group(0) @binding(3) var<uniform> g: G;\n"
    head += fill(INPUT_ROWS, FIELDS=int8_gemm.FIELDS, BYTE=x_byte) + int8_gemm.WEIGHT_ROWS
    return int8_gemm.product_shader(head, matrices=matrices)


# The q8ta ops' x as int8 in the tiled product: read as it is, or quantized as linear_q8ta_q8csw does
Q8TA_X, Q8CSW_X = "x_at(i)", "quantize(x_at(i), g.inv, g.zp, -128, 127)"


def _add_linear(b, x, weight, scales, bias, term, epilogue, consts, integer=False, four_bit=False, x_byte=None):
    """Record out[m, n] = epilogue(sum over k of `term`, in i32 if `integer`), for x [..., K] and
    weight rows n (an epilogue reads the bias as `bias_at(n)`: `_bias`); `consts` fill the
    uniform's p.f and p.k. With `x_byte` (WGSL: the int8 value of x's element i, from `g.zp` and
    `g.inv`), an integer sum whose weight rows are whole words runs as the tiled product."""
    values = b.graph.values
    xt, wt, out = values[x], values[weight], values[b.out]
    n_out = wt.dims[0]
    row = wt.dims[1] * 2 if four_bit else wt.dims[1]
    tiled = x_byte is not None and int8_gemm.takes(row)
    # the word kernel's bindings: the direct route reads x and the weights, the tiled one the sums
    bindings = ([] if tiled else [x, weight]) + [scales] + ([bias] if bias is not None else [])
    src = "" if tiled else reader("x", xt.dtype, 0) + (fill(NIBBLE_READER, BINDING=1) if four_bit else reader("w", wt.dtype, 1))
    first = bindings.index(scales)
    src += reader("ws", values[scales].dtype, first)
    src += reader("bias", values[bias].dtype, first + 1) if bias is not None else ""
    nb = len(bindings)
    src += f"@group(0) @binding({nb}) var<storage, read_write> out: array<{wgsl_type(out.dtype)}>;\n"
    src += f"@group(0) @binding({nb + 1}) var<uniform> p: P;\n{LIN_STRUCT};\n" + QUANT_FNS
    if tiled:
        parts = int8_gemm.parts_scratch(b, b.out)
        src += f"@group(0) @binding({nb + 2}) var<storage, read> parts: array<i32>;\n"
    out_type = "i32" if out.dtype in ("int8", "uint8") else "f32"
    sum_ = SPLIT_SUMS if tiled else fill(LOOP, TERM=term)
    src += fill(DOT, OUT=out_type, ACC="i32" if integer else "f32", SUM=sum_, EPILOGUE=epilogue)
    src += word_main(out.dtype)
    params = b.params(struct.calcsize(LIN_PARAMS))
    if tiled:
        geometry = b.params(struct.calcsize(int8_gemm.FORMAT + "f"))
        product = b.dispatch(product_shader(xt.dtype, x_byte, b.int8_matrices), [x, weight, parts, geometry])
        d = b.dispatch(src, bindings + [b.out, params, parts])
    else:
        d = b.dispatch(src, bindings + [b.out, params])

    def resize(ctx):
        dims = ctx.dims(x)
        k = dims[-1]
        if k > row:
            b.fail(f"input {dims} has K={k}, the weight rows {row}")
        shape = tuple(dims[:-1]) + (n_out,)
        n = numel_of(shape)
        splits = 1
        if tiled:
            rows = n // n_out
            uniform, splits, _ = int8_gemm.params(n_out, rows, k, 1, consts[1][0], row)
            ctx.set_params(geometry, uniform + struct.pack("<f", consts[0][1]))
            ctx.set_grid(product, int8_gemm.grid(n_out, rows, 1, splits))
        ctx.set_params(params, struct.pack(LIN_PARAMS, n, n_out, k, row, splits, *consts[0], *consts[1]))
        ctx.set_grid(d, word_grid(n))
        ctx.set_dims(b.out, shape)

    b.hook(resize)


WEIGHT_ONLY_TERM = "x_at(m * p.K + k) * f32(w_at(n * p.row + k))"


@op("aten._weight_int8pack_mm.default", half=True)
def weight_int8pack_mm(b):
    """[x [M, K], weight int8 [N, K], scales [N], out [M, N]]."""
    _add_linear(b, b.args[0], b.args[1], b.args[2], None, WEIGHT_ONLY_TERM, "return acc * ws_at(n);", ((0.0,) * 4, (0,) * 4))


@op("et_vk.linear_qcs4w.default", half=True)
def linear_qcs4w(b):
    """[x [..., K], weight uint8 [N, Kp/2], scales [N], out [..., N]]."""
    _add_linear(b, b.args[0], b.args[1], b.args[2], None, WEIGHT_ONLY_TERM, "return acc * ws_at(n);", ((0.0,) * 4, (0,) * 4), four_bit=True)


# (x_q - x_zp) * w_q; x_q ($XQ) read as int8 (q8ta_linear) or quantized on the fly (linear_q8ta_q8csw)
Q8_TERM = "($XQ - p.k.x) * w_at(n * p.row + k)"
SCALED = "f32(acc) * p.f.x * ws_at(n) + $BIAS"


def _bias(bias):
    """The bias term of output n: `bias_at(n)` (a bias binding), or 0.0 for none."""
    return "bias_at(n)" if bias is not None else "0.0"


@op("et_vk.linear_q8ta_q8csw.default")
def linear_q8ta_q8csw(b):
    """[x float [..., K], input_scale, input_zp, weight int8 [N, K], weight_sums (unused),
    weight_scales [>= N], bias or None, out float]."""
    scale, zp = b.scalar(1), zero_point(b, 2)
    bias = None if b.is_none(6) else b.args[6]
    xq = "quantize(x_at(m * p.K + k), p.f.y, p.k.x, -128, 127)"
    consts = ((scale, inv(scale), 0.0, 0.0), (zp, 0, 0, 0))
    epilogue = f"return {fill(SCALED, BIAS=_bias(bias))};"
    _add_linear(b, b.args[0], b.args[3], b.args[5], bias, fill(Q8_TERM, XQ=xq), epilogue, consts, integer=True, x_byte=Q8CSW_X)


@op("et_vk.q8ta_linear.default", "et_vk.q8ta_linear_gemv.default", half=True)
def q8ta_linear(b):
    """[x int8 [..., K], input_scale, input_zp, weight int8 [N, K], weight_sums (unused),
    weight_scales [>= N], output_scale, output_zp, bias or None, activation Str, out int8]."""
    scale, zp, out_scale, out_zp = b.scalar(1), zero_point(b, 2), b.scalar(6), zero_point(b, 7)
    bias = None if b.is_none(8) else b.args[8]
    activation = b.scalar(9, "none")
    if activation not in ("none", "relu"):
        b.fail(f"activation {activation!r}")
    scaled = fill(SCALED, BIAS=_bias(bias))
    y = f"max({scaled}, 0.0)" if activation == "relu" else scaled
    epilogue = f"return quantize({y}, p.f.y, p.k.y, -128, 127);"
    consts = ((scale, inv(out_scale), 0.0, 0.0), (zp, out_zp, 0, 0))
    _add_linear(b, b.args[0], b.args[3], b.args[5], bias, fill(Q8_TERM, XQ="x_at(m * p.K + k)"), epilogue, consts, integer=True, x_byte=Q8TA_X)
