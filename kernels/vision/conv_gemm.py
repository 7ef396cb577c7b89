"""Convolution as an implicit GEMM: kernels/matmul/gemm.py's register-tiled template with an im2col tile load.

For image b of the batch, out[b] ([Cout, OH * OW], NCHW's plane order) = W @ im2col(x[b]):
- A is the weight as it is stored, [Cout, Cin, KH, KW] = row-major [M = Cout, K = Cin * KH * KW],
  shared by the batch (no repacking: its rows are what the A tile reads along K);
- B is im2col(x[b]), [K, N = OH * OW], never written out: element (k, pixel) is the input at
  channel k / (KH * KW), row oy * SH - PH + ky * DH, column ox * SW - PW + kx * DW (0 in the
  padding). Neighbouring invocations load neighbouring pixels (B's slot along N), so a stride-1
  convolution reads rows of the input plane.
The GEMM's batch is the image, its output row m one output channel: out[b * Cout * N + m * N + n]
is NCHW as it stands. Bias (per row), the clamp of `et_vk.conv_with_clamp` and the residual of
`pte_wgpu.conv_residual` (gemm.py's `added`) are the epilogue's;
split-K takes over where the tiles are few (ResNet's last stage: 512 channels of 7 x 7 pixels).

Each invocation loads the same 4 pixels of B at every K step: their first input row and column
are computed once (the template's `setup`), so a K step's load costs a division by the window's
size (a WGSL constant) and a bounds check. A 1x1 convolution of stride 1 without padding is a
plain GEMM, B the input itself ([Cin, H * W]). Kernel size, stride, padding and dilation are WGSL
constants; the input's height and width and the output's width (live) are a second uniform.

x, the weight, the bias and the output each have their own storage type (f32 or f16): the tile
loads convert to f32, the sums are f32, and gemm.py's epilogue converts to the output's type.
"""

import struct

from ..matmul.gemm import PARAMS_SIZE, GemmRoute, TileLoad, float_a_at, gemm_scratch, params_bytes
from ..wgsl import fill

GEOMETRY_SIZE = 16  # the second uniform: ih, iw, ow, unused

POINTWISE_B = """
fn b_at(off: u32, n: u32, k: u32, kend: u32) -> f32 {
    if (n < p.N && k < kend) { return f32(bm[off + k * p.N + n]); }
    return 0.0;
}
"""

IM2COL_B = """
const KH = ${KH}u;
const KW = ${KW}u;
const STRIDE = vec2<u32>(${SH}u, ${SW}u);
const PAD = vec2<i32>($PH, $PW);
const DIL = vec2<u32>(${DH}u, ${DW}u);
struct G { ih: u32, iw: u32, ow: u32, unused: u32 }
var<private> y0: vec4<i32>;  // the first input row and column of this invocation's 4 pixels
var<private> x0: vec4<i32>;
fn b_at(off: u32, n: u32, k: u32, kend: u32) -> f32 {
    if (n >= p.N || k >= kend) { return 0.0; }
    let r = k % (KH * KW);
    let iy = y0[n % 4u] + i32(r / KW * DIL.x);
    let ix = x0[n % 4u] + i32(r % KW * DIL.y);
    if (iy < 0 || ix < 0 || iy >= i32(g.ih) || ix >= i32(g.iw)) { return 0.0; }
    return f32(bm[off + (k / (KH * KW) * g.ih + u32(iy)) * g.iw + u32(ix)]);
}
"""

IM2COL_SETUP = """
    let pixels = vec4<u32>(b_col0) + vec4<u32>(0u, 1u, 2u, 3u);
    y0 = vec4<i32>(pixels / g.ow * STRIDE.x) - PAD.x;
    x0 = vec4<i32>(pixels % g.ow * STRIDE.y) - PAD.y;
"""


def is_pointwise(kernel, stride, padding):
    """1x1, stride 1, no padding: the convolution is a plain GEMM over the input."""
    return kernel == (1, 1) and stride == (1, 1) and padding == (0, 0)


def conv_load(kernel, stride, padding, dilation, weight="f32", x="f32"):
    """The TileLoad of a groups=1 convolution with 2-D `kernel`, `stride`, `padding`, `dilation`,
    its weight and x stored as WGSL types `weight` and `x`: A the weight, B im2col(x)."""
    inputs = (("a", weight), ("bm", x))
    if is_pointwise(kernel, stride, padding):
        return TileLoad(inputs, float_a_at() + POINTWISE_B, b_along_k=False)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    functions = float_a_at() + fill(IM2COL_B, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw)
    return TileLoad(inputs, functions, b_along_k=False, setup=IM2COL_SETUP)


class ConvGemm:
    """The implicit-GEMM route of one convolution (a Variant's route, kernels/variants.py): `set`
    takes the hook's ConvShape."""

    def __init__(self, b, conv):
        self.pointwise = is_pointwise(conv.kernel, conv.stride, conv.padding)
        load = conv_load(conv.kernel, conv.stride, conv.padding, conv.dilation, conv.tw, conv.tx)
        self.params = b.params(PARAMS_SIZE)
        self.geometry = None if self.pointwise else b.params(GEOMETRY_SIZE)
        n_bindings = 2 + (conv.bias is not None) + 3  # x, weight, bias, out, p, part
        extra_wgsl = "" if self.pointwise else f"@group(0) @binding({n_bindings}) var<uniform> g: G;\n"
        scratch = gemm_scratch(b, [conv.out])
        extra = () if self.pointwise else (self.geometry,)
        self.route = GemmRoute(
            b, load, [conv.weight, conv.x], conv.bias, conv.out, self.params, scratch, extra, extra_wgsl, conv.clamp, added=conv.added
        )

    def set(self, ctx, s, on):
        split = self.route.plan(s.m, s.n, s.k, s.batch, on)
        if on:
            bias = (0, 1, 0)  # one value per output channel, the GEMM's row
            ctx.set_params(self.params, params_bytes(s.m, s.n, s.k, s.batch, 0, s.cin * s.ih * s.iw, bias, split=split))
            if self.geometry is not None:
                ctx.set_params(self.geometry, struct.pack("<4I", s.ih, s.iw, s.ow, 0))
        self.route.set_grids(ctx, s.m, s.n, s.k, s.batch, split[0], on)
