"""Convolution: `aten.convolution` and `et_vk.conv_with_clamp` (the same plus an output clamp).

The VkGraph keeps the original arguments: the weight is the unpacked torch tensor, [Cout, Cin/g,
kh(, kw)] or, transposed, [Cin, Cout/g, kh(, kw)]. A 1-D convolution is the 2-D one with a height of
1. One invocation computes one output position for a block of 4 output channels (1 where a group
has fewer than a multiple of 4), so each input load serves 4 products. The kernel is picked once at
load by the weight and the arguments, which no live shape changes:
- pointwise (1x1, stride 1, no padding, one group): a dot product over the input channels;
- direct: any kernel, stride, dilation, padding and groups (depthwise is groups == Cin);
- transposed: each output gathers the inputs that scatter onto it, `oy + pad - ky * dil` being a
  multiple of the stride.

The kernel's height and width are WGSL constants, so the shader compiler can unroll the window's
loops. That matters on lavapipe: llvmpipe silently ends every loop of an invocation once they have
iterated 65535 times together (LP_MAX_TGSI_LOOP_ITERATIONS). With the window's loops left in, a 3x3
window cost 13 iterations per input channel, and a 3x3 convolution over 1024 input channels lost
the end of its invocations' 4th output position (an invocation computes 4, kernels/wgsl.py's
PER_INVOCATION); unrolled, it iterates once per input channel and position, 4 * Cin/g in all.
"""

import struct

from .image import OUTPUT_PIXEL, float_types, load_store, static_ints
from .registry import op
from .wgsl import FLAT_INDEX, SPREAD_MAIN, spread_grid

F32_MAX = 3.4028234663852886e38

HEADER = """
struct P {{ numel: u32, cout: u32, oh: u32, ow: u32, cin: u32, ih: u32, iw: u32, cin_g: u32,
           cout_g: u32, sh: u32, sw: u32, ph: u32, pw: u32, dh: u32, dw: u32, blocks: u32,
           wstep: u32, lo: f32, hi: f32, pad0: u32 }}
const KH = {KH}u;
const KW = {KW}u;
@group(0) @binding(0) var<storage, read> x: array<{TX}>;
@group(0) @binding(1) var<storage, read> w: array<{TW}>;
{BIAS_DECL}
@group(0) @binding({OUT}) var<storage, read_write> out: array<{TO}>;
@group(0) @binding({P}) var<uniform> p: P;
{FLAT_INDEX}
{MAIN}
{IO}
fn weights(k: u32) -> {ACC} {{ return {WEIGHTS}; }}
fn bias_of(c: u32) -> f32 {{ return {BIAS}; }}
fn element(i: u32) {{
{OUTPUT_PIXEL}
    let co = nc % p.blocks * {B}u;
    let n = nc / p.blocks;
    let g = co / p.cout_g;
    var acc = {INIT};
{BODY}
    let at = ((n * p.cout + co) * p.oh + oy) * p.ow + ox;
    acc = clamp(acc, {ACC}(p.lo), {ACC}(p.hi));
{STORE}
}}
"""

# Blocks of 4 output channels share each input load: a vec4 of the 4 channels' weights, `wstep` apart.
# Every load converts to f32 and the store back to the output's storage type (f32 or f16).
BLOCK = {
    1: {"ACC": "f32", "WEIGHTS": "f32(w[k])", "INIT": "bias_of(co)", "STORE": "    store(at, acc);"},
    4: {
        "ACC": "vec4<f32>",
        "WEIGHTS": "vec4<f32>(vec4(w[k], w[k + p.wstep], w[k + 2u * p.wstep], w[k + 3u * p.wstep]))",
        "INIT": "vec4<f32>(bias_of(co), bias_of(co + 1u), bias_of(co + 2u), bias_of(co + 3u))",
        "STORE": "    for (var j = 0u; j < 4u; j = j + 1u) { store(at + j * p.oh * p.ow, acc[j]); }",
    },
}

POINTWISE = """
    let area = p.ih * p.iw;
    let pix = oy * p.iw + ox;
    var xi = n * p.cin * area + pix;
    var wi = co * p.cin;
    for (var ci = 0u; ci < p.cin; ci = ci + 1u) {
        acc = acc + load(xi) * weights(wi);
        xi = xi + area;
        wi = wi + 1u;
    }
"""

DIRECT = """
    let iy0 = i32(oy * p.sh) - i32(p.ph);
    let ix0 = i32(ox * p.sw) - i32(p.pw);
    for (var ci = 0u; ci < p.cin_g; ci = ci + 1u) {
        let xplane = (n * p.cin + g * p.cin_g + ci) * p.ih;
        let wbase = (co * p.cin_g + ci) * KH;
        for (var ky = 0u; ky < KH; ky = ky + 1u) {
            let iy = iy0 + i32(ky * p.dh);
            if (iy < 0 || iy >= i32(p.ih)) { continue; }
            let xrow = (xplane + u32(iy)) * p.iw;
            let wrow = (wbase + ky) * KW;
            for (var kx = 0u; kx < KW; kx = kx + 1u) {
                let ix = ix0 + i32(kx * p.dw);
                if (ix < 0 || ix >= i32(p.iw)) { continue; }
                acc = acc + load(xrow + u32(ix)) * weights(wrow + kx);
            }
        }
    }
"""

TRANSPOSED = """
    let co_g = co - g * p.cout_g;
    for (var ci = 0u; ci < p.cin_g; ci = ci + 1u) {
        let c = g * p.cin_g + ci;
        let xplane = (n * p.cin + c) * p.ih;
        let wbase = (c * p.cout_g + co_g) * KH;
        for (var ky = 0u; ky < KH; ky = ky + 1u) {
            let ty = i32(oy + p.ph) - i32(ky * p.dh);
            if (ty < 0 || u32(ty) % p.sh != 0u) { continue; }
            let iy = u32(ty) / p.sh;
            if (iy >= p.ih) { continue; }
            let xrow = (xplane + iy) * p.iw;
            let wrow = (wbase + ky) * KW;
            for (var kx = 0u; kx < KW; kx = kx + 1u) {
                let tx = i32(ox + p.pw) - i32(kx * p.dw);
                if (tx < 0 || u32(tx) % p.sw != 0u) { continue; }
                let ix = u32(tx) / p.sw;
                if (ix >= p.iw) { continue; }
                acc = acc + load(xrow + ix) * weights(wrow + kx);
            }
        }
    }
"""


def conv_out_shape(x, w, stride, padding, dilation, transposed, output_padding, groups):
    """The output shape of a convolution of input shape `x` by weight shape `w` (PyTorch's formula);
    ValueError when the shapes do not fit together."""
    spatial = len(x) - 2
    if spatial not in (1, 2) or len(w) != len(x):
        raise ValueError(f"input of shape {tuple(x)} with weight {tuple(w)}: expected a 3-D or 4-D input of the weight's rank")
    cin = w[0] if transposed else w[1] * groups
    if x[1] != cin:
        raise ValueError(f"input of shape {tuple(x)} has {x[1]} channels, the weight {tuple(w)} expects {cin}")
    cout = w[1] * groups if transposed else w[0]
    sizes = []
    for d in range(spatial):
        k, s, p, dl = w[2 + d], stride[d], padding[d], dilation[d]
        if transposed:
            size = (x[2 + d] - 1) * s - 2 * p + dl * (k - 1) + output_padding[d] + 1
        else:
            size = (x[2 + d] + 2 * p - dl * (k - 1) - 1) // s + 1
        if size < 1:
            raise ValueError(f"input of shape {tuple(x)} is too small for the kernel {tuple(w[2:])}")
        sizes.append(size)
    return (x[0], cout, *sizes)


def _per_dim(items, spatial, default):
    """A stride/padding/dilation list as one value per spatial dim (a single value is repeated)."""
    items = items or (default,)
    return items * spatial if len(items) == 1 else items


@op("aten.convolution.default", "et_vk.conv_with_clamp.default", "aten::convolution.out", half=True)
def convolution(b):
    x, weight, out = b.args[0], b.args[1], b.out
    bias = None if b.is_none(2) else b.args[2]
    tx, tw, to = float_types(b, x, weight, out)
    (tb,) = float_types(b, bias) if bias is not None else ("f32",)
    w = b.tensor(1).dims
    spatial = len(w) - 2
    if spatial not in (1, 2):
        raise NotImplementedError(f"{b.name}: {spatial}-D convolution")
    stride, padding, dilation, output_padding = (
        _per_dim(static_ints(b, i), spatial, default) for i, default in ((3, 1), (4, 0), (5, 1), (7, 0))
    )
    transposed, groups = bool(b.scalar(6, False)), int(b.scalar(8, 1))
    lo, hi = -F32_MAX, F32_MAX
    if b.name == "et_vk.conv_with_clamp.default":
        lo, hi = max(float(b.scalar(9, lo)), lo), min(float(b.scalar(10, hi)), hi)
    pointwise = not transposed and groups == 1 and w[2:] == (1,) * spatial and stride == (1,) * spatial
    pointwise = pointwise and padding == (0,) * spatial
    body = TRANSPOSED if transposed else POINTWISE if pointwise else DIRECT
    cout_g = w[1] if transposed else w[0] // groups
    block = 4 if cout_g % 4 == 0 else 1
    bindings = [x, weight] + ([bias] if bias is not None else []) + [out]

    def as_2d(t, fill=1):
        """A 1-D convolution's sizes as the 2-D ones of height 1."""
        return tuple(t) if spatial == 2 else (fill, *t)

    kh, kw = as_2d(w[2:])
    shader = HEADER.format(
        KH=kh,
        KW=kw,
        TX=tx,
        TW=tw,
        TO=to,
        IO=load_store(to),
        BIAS_DECL=f"@group(0) @binding(2) var<storage, read> bias: array<{tb}>;" if bias is not None else "",
        BIAS="f32(bias[c])" if bias is not None else "0.0",
        B=block,
        **BLOCK[block],
        OUT=len(bindings) - 1,
        P=len(bindings),
        BODY=body,
        FLAT_INDEX=FLAT_INDEX,
        OUTPUT_PIXEL=OUTPUT_PIXEL,
        MAIN=SPREAD_MAIN,
    )
    params = b.params(80)
    d = b.dispatch(shader, bindings + [params])

    def resize(ctx):
        shape = ctx.dims(x)
        try:
            oshape = conv_out_shape(shape, w, stride, padding, dilation, transposed, output_padding, groups)
        except ValueError as e:
            raise ValueError(f"{b.name}: {e}") from None
        n, cin, ih, iw = shape[:2] + as_2d(shape[2:])
        _, cout, oh, ow = oshape[:2] + as_2d(oshape[2:])
        (sh, sw), (ph, pw), (dh, dw) = as_2d(stride), as_2d(padding, 0), as_2d(dilation)
        blocks = cout // block
        numel = n * blocks * oh * ow
        wstep = kh * kw if transposed else cin // groups * kh * kw
        data = struct.pack("<17I", numel, cout, oh, ow, cin, ih, iw, cin // groups, cout_g, sh, sw, ph, pw, dh, dw, blocks, wstep)
        ctx.set_params(params, data + struct.pack("<ff", lo, hi))
        ctx.set_grid(d, spread_grid(numel))
        ctx.set_dims(out, oshape)

    b.hook(resize)
