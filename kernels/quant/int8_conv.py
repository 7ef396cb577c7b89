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
"""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..vision.conv import conv_out_shape
from ..wgsl import fill
from .int8_elementwise import QUANT_FNS, inv, reader, word_grid, word_main, zero_point

CONV_PARAMS = "<18I2i2f"
CONV_STRUCT = """struct P { n: u32, cout: u32, oh: u32, ow: u32, cin: u32, ih: u32, iw: u32, cin_g: u32,
           cout_g: u32, kh: u32, kw: u32, sh: u32, sw: u32, ph: u32, pw: u32, dh: u32, dw: u32,
           row: u32, x_zp: i32, out_zp: i32, x_scale: f32, inv_out: f32 }"""

# Output element e at (n, co, oy, ox); $TAPS adds (xq - x_zp) * wq over its receptive field.
VALUE = """
fn value(e: u32) -> i32 {
    let ox = e % p.ow;
    let oy = (e / p.ow) % p.oh;
    let co = (e / (p.ow * p.oh)) % p.cout;
    let n = e / (p.ow * p.oh * p.cout);
    let g = co / p.cout_g;
    var acc = 0;
$TAPS
    let y = f32(acc) * p.x_scale * ws_at(co) + $BIAS;
    return quantize($ACTIVATION, p.inv_out, p.out_zp, -128, 127);
}
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
            acc = add_channels(acc, n, g, co, u32(iy), u32(ix), ky * p.kw + kx);
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
            acc = add_channels(acc, n, g, co, u32(ty) / p.sh, u32(tx) / p.sw, ky * p.kw + kx);
        }
    }
"""

ROW_WEIGHT = "co * p.row + tap * p.cin_g + ci"  # [Cout, taps x group channels (padded)]
DEPTHWISE_WEIGHT = "tap * p.row + co"  # [kh, kw, Cout]


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

    src = reader("x", "int8", 0) + reader("w", "int8", 1) + reader("ws", values[scales].dtype, 2)
    bindings = [x, weight, scales]
    if bias is not None:
        src += reader("bias", "float32", 3)
        bindings.append(bias)
    nb = len(bindings)
    src += f"@group(0) @binding({nb}) var<storage, read_write> out: array<u32>;\n"
    src += f"@group(0) @binding({nb + 1}) var<uniform> p: P;\n{CONV_STRUCT};\n" + QUANT_FNS
    src += fill(
        VALUE,
        TAPS=TRANSPOSED_TAPS if transposed else DIRECT_TAPS,
        WEIGHT=DEPTHWISE_WEIGHT if depthwise else ROW_WEIGHT,
        BIAS="bias_at(co)" if bias is not None else "0.0",
        ACTIVATION="max(y, 0.0)" if activation == "relu" else "y",
    )
    src += word_main("int8")
    params = b.params(struct.calcsize(CONV_PARAMS))
    d = b.dispatch(src, bindings + [out, params])

    def resize(ctx):
        shape = ctx.dims(x)
        if len(shape) != 4:
            b.fail(f"input of shape {shape}, expected NCHW")
        try:
            oshape = conv_out_shape(shape, torch_w, stride, padding, dilation, transposed, output_padding, groups)
        except ValueError as e:
            b.fail(f"{e}")
        n = numel_of(oshape)
        ints = (n, cout, *oshape[2:], cin, *shape[2:], cin_g, cout_g, kh, kw, *stride, *padding, *dilation, row)
        ctx.set_params(params, struct.pack(CONV_PARAMS, *ints, x_zp, out_zp, x_scale, inv(out_scale)))
        ctx.set_grid(d, word_grid(n))
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
