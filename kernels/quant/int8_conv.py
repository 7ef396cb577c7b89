"""Convolutions over int8 activations and per-channel int8 weights: the `et_vk.q8ta_conv2d` family
(ExecuTorch's Vulkan partitioner fuses dequantize -> conv(2d) [-> relu] -> quantize into one).

Arguments: [x int8 NCHW, input_scale, input_zp, weights int8, weight_sums (unused), weight_scales
[>= Cout], output_scale, output_zp, bias float or None, kernel_size, stride, padding,
(output_padding: transposed only), dilation, groups, activation "none" | "relu", out int8].
The partitioner stores the weights reordered: one row per output channel, taps (ky, kx) outer and
the group's input channels inner, the row padded to a multiple of 4 (conv2d, conv2d_pw and
conv2d_transposed); depthwise weights as [kh, kw, Cout].

Like `q8ta_linear`, the sum of (xq - x_zp) * wq is exact in i32 (padding taps contribute nothing,
as a dequantized zero would), then scaled by x_scale * w_scale[c], biased, optionally relu'd and
requantized; the reference sums dequantized floats, so an output can sit one step away where it
lands on a rounding boundary. One invocation computes the 4 outputs of one output word.

Two routes, picked once at load:
- tiled (one group, not transposed): the integer sums as an implicit GEMM in workgroup tiles
  (kernels/quant/int8_gemm.py; on int8 subgroup matrices where the device offers them), each
  output finished (FINISH) by the product itself where it sums all of K and an output plane is
  whole words, else by a word kernel that adds the K splits' sums; the sums are the same integers
  and FINISH is the direct kernel's arithmetic, so the outputs are bitwise;
- direct, the rest (depthwise, other grouped and transposed convolutions): each output's sum a
  loop over its receptive field.
"""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..vision.conv import conv_out_shape
from ..vision.conv_gemm import is_pointwise
from ..wgsl import fill
from . import int8_gemm
from .int8_elementwise import QUANT_FNS, inv, reader, word_grid, word_main, zero_point

CONV_PARAMS = "<19I2i2f"
CONV_STRUCT = """struct P { n: u32, cout: u32, oh: u32, ow: u32, cin: u32, ih: u32, iw: u32, cin_g: u32,
           cout_g: u32, kh: u32, kw: u32, sh: u32, sw: u32, ph: u32, pw: u32, dh: u32, dw: u32,
           row: u32, splits: u32, x_zp: i32, out_zp: i32, x_scale: f32, inv_out: f32 }"""

# Output element e from its integer sum: scaled, biased, requantized
FINISH = """
fn finish(acc: i32, e: u32) -> i32 {
    let co = (e / (p.ow * p.oh)) % p.cout;
    let y = f32(acc) * p.x_scale * ws_at(co) + $BIAS;
    return quantize($ACTIVATION, p.inv_out, p.out_zp, -128, 127);
}
"""
# Output element e at (n, co, oy, ox); $SUM sums (xq - x_zp) * wq over its receptive field into acc.
VALUE = """
fn value(e: u32) -> i32 {
    let ox = e % p.ow;
    let oy = (e / p.ow) % p.oh;
    let co = (e / (p.ow * p.oh)) % p.cout;
    let n = e / (p.ow * p.oh * p.cout);
    let grp = co / p.cout_g;
    var acc = 0;
$SUM
    return finish(acc, e);
}
"""
# The direct route's sum: the taps ($TAPS) of each input channel of the group
ADD_CHANNELS = """
fn add_channels(acc: i32, n: u32, g: u32, co: u32, iy: u32, ix: u32, tap: u32) -> i32 {
    var sum = acc;
    for (var ci = 0u; ci < p.cin_g; ci = ci + 1u) {
        let xq = x_at(((n * p.cin + g * p.cin_g + ci) * p.ih + iy) * p.iw + ix);
        sum = sum + (xq - p.x_zp) * w_at($WEIGHT);
    }
    return sum;
}
"""

# Which input pixel (iy, ix) a tap (ky, kx) of output (oy, ox) reads, if any.
DIRECT_TAPS = """
    for (var ky = 0u; ky < p.kh; ky = ky + 1u) {
        let iy = i32(oy * p.sh + ky * p.dh) - i32(p.ph);
        if (iy < 0 || iy >= i32(p.ih)) { continue; }
        for (var kx = 0u; kx < p.kw; kx = kx + 1u) {
            let ix = i32(ox * p.sw + kx * p.dw) - i32(p.pw);
            if (ix < 0 || ix >= i32(p.iw)) { continue; }
            acc = add_channels(acc, n, grp, co, u32(iy), u32(ix), ky * p.kw + kx);
        }
    }
"""

# Transposed: input (iy, ix) scatters onto oy = iy * stride - pad + ky * dil, so gather those.
TRANSPOSED_TAPS = """
    for (var ky = 0u; ky < p.kh; ky = ky + 1u) {
        let ty = i32(oy + p.ph) - i32(ky * p.dh);
        if (ty < 0 || u32(ty) % p.sh != 0u || u32(ty) / p.sh >= p.ih) { continue; }
        for (var kx = 0u; kx < p.kw; kx = kx + 1u) {
            let tx = i32(ox + p.pw) - i32(kx * p.dw);
            if (tx < 0 || u32(tx) % p.sw != 0u || u32(tx) / p.sw >= p.iw) { continue; }
            acc = add_channels(acc, n, grp, co, u32(ty) / p.sh, u32(tx) / p.sw, ky * p.kw + kx);
        }
    }
"""

ROW_WEIGHT = "co * p.row + tap * p.cin_g + ci"  # [Cout, taps x group channels (padded)]
DEPTHWISE_WEIGHT = "tap * p.row + co"  # [kh, kw, Cout]

# The tiled route's sum: the K splits' integer sums of output e
SPLIT_SUMS = "    for (var s = 0u; s < p.splits; s = s + 1u) { acc = acc + parts[s * p.n + e]; }"

# The tiled route's operands (kernels/quant/int8_gemm.py): A the weight rows, B im2col(x) of image
# b, k = tap * Cin + ci as the weight rows order it, padding taps read as the zero point
OPERANDS = """
struct G { $FIELDS, cin: u32, ih: u32, iw: u32, ow: u32 }
fn x_byte(i: u32) -> u32 { return (x[i / 4u] >> (8u * (i % 4u))) & 0xFFu; }
fn part_index(b: u32, m: u32, n: u32) -> u32 { return (b * g.M + m) * g.N + n; }
"""
# B of any window, stride, padding and dilation: a K value's tap and channel followed along the 8
IM2COL_B = """
const KW = ${KW}u;
const STRIDE = vec2<u32>(${SH}u, ${SW}u);
const PAD = vec2<i32>($PH, $PW);
const DIL = vec2<u32>(${DH}u, ${DW}u);
var<private> iy0: i32;  // the first input row and column of the pixel this invocation stages
var<private> ix0: i32;
fn b_pair(b: u32, n: u32, kw: u32) -> vec2<u32> {
    var words = vec2<u32>(0u);
    let k0 = 4u * kw;
    if (n >= g.N || k0 >= g.K) { return words; }
    var tap = k0 / g.cin;
    var ci = k0 % g.cin;
    for (var j = 0u; j < 8u; j = j + 1u) {
        if (k0 + j < g.K) {
            let iy = iy0 + i32(tap / KW * DIL.x);
            let ix = ix0 + i32(tap % KW * DIL.y);
            var v = u32(g.zp) & 0xFFu;
            if (iy >= 0 && ix >= 0 && iy < i32(g.ih) && ix < i32(g.iw)) {
                v = x_byte(((b * g.cin + ci) * g.ih + u32(iy)) * g.iw + u32(ix));
            }
            words[j / 4u] = words[j / 4u] | (v << (8u * (j % 4u)));
        }
        ci = ci + 1u;
        if (ci == g.cin) { ci = 0u; tap = tap + 1u; }
    }
    return words;
}
"""
IM2COL_SETUP = """    iy0 = i32((n0 + lr) / g.ow * STRIDE.x) - PAD.x;
    ix0 = i32((n0 + lr) % g.ow * STRIDE.y) - PAD.y;"""
# B of a pointwise convolution (1x1, stride 1, no padding): pixel n of channels k .., a plane apart
POINTWISE_B = """
fn b_pair(b: u32, n: u32, kw: u32) -> vec2<u32> {
    var words = vec2<u32>(0u);
    let k0 = 4u * kw;
    if (n >= g.N || k0 >= g.K) { return words; }
    var i = (b * g.cin + k0) * g.N + n;
    for (var j = 0u; j < 8u; j = j + 1u) {
        if (k0 + j < g.K) { words[j / 4u] = words[j / 4u] | (x_byte(i) << (8u * (j % 4u))); }
        i = i + g.N;
    }
    return words;
}
"""
GEOMETRY_FORMAT = "<4I"


def epilogue(scales_dtype, has_bias, activation, first):
    """The bindings from `first` on of the weight scales (of `scales_dtype`), the bias (with
    `has_bias`), the output and the uniform P, and FINISH, whose arithmetic the word kernel and
    the product that finishes its outputs share."""
    src = reader("ws", scales_dtype, first) + (reader("bias", "float32", first + 1) if has_bias else "")
    at = first + 1 + has_bias
    src += f"@group(0) @binding({at}) var<storage, read_write> out: array<u32>;\n"
    src += f"@group(0) @binding({at + 1}) var<uniform> p: P;\n{CONV_STRUCT};\n" + QUANT_FNS
    bias = "bias_at(co)" if has_bias else "0.0"
    return src + fill(FINISH, BIAS=bias, ACTIVATION="max(y, 0.0)" if activation == "relu" else "y")


def product_shader(kernel, stride, padding, dilation, finishing, matrices=False):
    """The tiled route's product for a `kernel` (height, width) (int8_gemm.py; `matrices`: on int8
    subgroup matrices): x, the weight, the sums, the uniform G, then `finishing` (`epilogue`'s,
    from binding 4): the product finishes the outputs itself where its uniform says so."""
    head = reader("x", "int8", 0) + reader("w", "int8", 1)
    head += "@group(0) @binding(2) var<storage, read_write> parts: array<i32>;\n@group(0) @binding(3) var<uniform> g: G;\n"
    head += fill(OPERANDS, FIELDS=int8_gemm.FIELDS) + int8_gemm.WEIGHT_ROWS + finishing
    if is_pointwise(kernel, stride, padding):
        return int8_gemm.product_shader(head + POINTWISE_B, matrices=matrices, finishes=True)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    head += fill(IM2COL_B, KW=kernel[1], SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw)
    return int8_gemm.product_shader(head, IM2COL_SETUP, matrices, finishes=True)


def tiled(transposed, depthwise, groups, row):
    """Whether a convolution takes the tiled route: one group, not transposed, weight rows of
    whole words."""
    return not transposed and not depthwise and groups == 1 and int8_gemm.takes(row)


def _q8ta_conv(b, transposed=False, depthwise=False):
    values = b.graph.values
    x, weight, scales, out = b.args[0], b.args[3], b.args[5], b.out
    if values[x].dtype != "int8" or values[out].dtype != "int8" or values[weight].dtype != "int8":
        raise NotImplementedError(f"{b.name}: expected int8 input, weights and output")
    bias = None if b.is_none(8) else b.args[8]
    if bias is not None and values[bias].dtype != "float32":
        raise NotImplementedError(f"{b.name}: {values[bias].dtype} bias")
    x_scale, x_zp, out_scale, out_zp = b.scalar(1), zero_point(b, 2), b.scalar(6), zero_point(b, 7)
    kh, kw = b.int_list(9)
    stride, padding = b.int_list(10), b.int_list(11)
    output_padding = b.int_list(12) if transposed else (0, 0)
    rest = 13 if transposed else 12
    dilation, groups, activation = b.int_list(rest), int(b.scalar(rest + 1)), b.scalar(rest + 2, "none")
    if activation not in ("none", "relu"):
        b.fail(f"activation {activation!r}")
    cin, cout = values[x].dims[1], values[out].dims[1]
    cin_g, cout_g = cin // groups, cout // groups
    # the torch weight shape, for the output shape formula
    torch_w = (cin, cout_g, kh, kw) if transposed else (cout, cin_g, kh, kw)
    row = values[weight].dims[-1]
    is_tiled = tiled(transposed, depthwise, groups, row)

    # the word kernel's bindings: the direct route reads x and the weights, the tiled one the sums
    tail = [scales] + ([bias] if bias is not None else [])
    src = "" if is_tiled else reader("x", "int8", 0) + reader("w", "int8", 1)
    src += epilogue(values[scales].dtype, bias is not None, activation, 0 if is_tiled else 2)
    if is_tiled:
        parts = int8_gemm.parts_scratch(b, out)
        src += f"@group(0) @binding({len(tail) + 2}) var<storage, read> parts: array<i32>;\n"
    else:
        src += fill(ADD_CHANNELS, WEIGHT=DEPTHWISE_WEIGHT if depthwise else ROW_WEIGHT)
    src += fill(VALUE, SUM=SPLIT_SUMS if is_tiled else TRANSPOSED_TAPS if transposed else DIRECT_TAPS) + word_main("int8")
    params = b.params(struct.calcsize(CONV_PARAMS))
    if is_tiled:
        geometry = b.params(struct.calcsize(int8_gemm.FORMAT + GEOMETRY_FORMAT[1:]))
        finishing = epilogue(values[scales].dtype, bias is not None, activation, 4)
        shader = product_shader((kh, kw), stride, padding, dilation, finishing, b.int8_matrices)
        product = b.dispatch(shader, [x, weight, parts, geometry, *tail, out, params])
        d = b.dispatch(src, tail + [out, params, parts])
    else:
        d = b.dispatch(src, [x, weight, *tail, out, params])

    def resize(ctx):
        shape = ctx.dims(x)
        if len(shape) != 4:
            b.fail(f"input of shape {shape}, expected NCHW")
        try:
            oshape = conv_out_shape(shape, torch_w, stride, padding, dilation, transposed, output_padding, groups)
        except ValueError as e:
            b.fail(f"{e}")
        n = numel_of(oshape)
        splits, finished = 1, False
        if is_tiled:
            pixels, k = oshape[2] * oshape[3], kh * kw * cin
            uniform, splits, finished = int8_gemm.params(cout, pixels, k, shape[0], x_zp, row, words_along_n=True)
            ctx.set_params(geometry, uniform + struct.pack(GEOMETRY_FORMAT, cin, *shape[2:], oshape[3]))
            ctx.set_grid(product, int8_gemm.grid(cout, pixels, shape[0], splits))
        ints = (n, cout, *oshape[2:], cin, *shape[2:], cin_g, cout_g, kh, kw, *stride, *padding, *dilation, row, splits)
        ctx.set_params(params, struct.pack(CONV_PARAMS, *ints, x_zp, out_zp, x_scale, inv(out_scale)))
        ctx.set_grid(d, (0, 0, 0) if finished else word_grid(n))
        ctx.set_dims(out, oshape)

    b.hook(resize)


@op("et_vk.q8ta_conv2d.default", "et_vk.q8ta_conv2d_pw.default")
def q8ta_conv2d(b):
    _q8ta_conv(b)


@op("et_vk.q8ta_conv2d_dw.default")
def q8ta_conv2d_dw(b):
    _q8ta_conv(b, depthwise=True)


@op("et_vk.q8ta_conv2d_transposed.default")
def q8ta_conv2d_transposed(b):
    _q8ta_conv(b, transposed=True)
