"""Convolution: `aten.convolution`, `et_vk.conv_with_clamp` (the same plus an output clamp) and
`pte_wgpu.conv_residual` (kernels/fusion.py's: a tensor added before the clamp, on the GEMM route).

The VkGraph keeps the original arguments: the weight is the unpacked torch tensor, [Cout, Cin/g,
kh(, kw)] or, transposed, [Cin, Cout/g, kh(, kw)]. A 1-D convolution is the 2-D one with a height of
1. Two routes (kernels/variants.py), chosen in the hook by the live shape:
- gemm (one group, not transposed, at least GEMM_MIN_COUT output channels): an implicit GEMM,
  kernels/vision/conv_gemm.py;
- direct, every other convolution (depthwise and grouped, transposed, few output channels).
Both read and write f32 or f16 storage, each tensor its own type (half=True): loads convert to f32,
sums are f32 and the store converts to the output's type.
The direct kernels: one invocation computes one output position for a block of 4 output channels
(1 where a group has fewer than a multiple of 4), so each input load serves 4 products. Which one
is picked once at load by the weight and the arguments:
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

import math
import struct
from dataclasses import dataclass

from ..registry import op
from ..variants import ANY, Routes, Variant
from ..wgsl import FLAT_INDEX, SPREAD_MAIN, clamped, fill, spread_grid
from .conv_gemm import ConvGemm
from .pixels import OUTPUT_PIXEL, load_store

F32_MAX = 3.4028234663852886e38

HEADER = """
struct P { numel: u32, cout: u32, oh: u32, ow: u32, cin: u32, ih: u32, iw: u32, cin_g: u32,
           cout_g: u32, sh: u32, sw: u32, ph: u32, pw: u32, dh: u32, dw: u32, blocks: u32,
           wstep: u32, lo: f32, hi: f32, pad0: u32 }
const KH = ${KH}u;
const KW = ${KW}u;
@group(0) @binding(0) var<storage, read> x: array<$TX>;
@group(0) @binding(1) var<storage, read> w: array<$TW>;
$BIAS_DECL
@group(0) @binding($OUT_BINDING) var<storage, read_write> out: array<$TO>;
@group(0) @binding($P_BINDING) var<uniform> p: P;
$FLAT_INDEX
$MAIN
$IO
fn weights(k: u32) -> $ACC { return $WEIGHTS; }
fn bias_of(c: u32) -> f32 { return $BIAS; }
fn element(i: u32) {
$OUTPUT_PIXEL
    let co = nc % p.blocks * ${B}u;
    let n = nc / p.blocks;
    let g = co / p.cout_g;
    var acc = $INIT;
$BODY
    let at = ((n * p.cout + co) * p.oh + oy) * p.ow + ox;
    acc = $CLAMPED;
$STORE
}
"""

# Blocks of 4 output channels share each input load: a vec4 of the 4 channels' weights, `wstep` apart.
# Every load converts to f32 and the store back to the output's storage type (f32 or f16).
BLOCK = {
    1: {"ACC": "f32", "WEIGHTS": "f32(w[k])", "INIT": "bias_of(co)", "STORE": "    store(at, acc);",
        "CLAMPED": clamped("acc", "p.lo", "p.hi")},
    4: {
        "ACC": "vec4<f32>",
        "WEIGHTS": "vec4<f32>(vec4(w[k], w[k + p.wstep], w[k + 2u * p.wstep], w[k + 3u * p.wstep]))",
        "INIT": "vec4<f32>(bias_of(co), bias_of(co + 1u), bias_of(co + 2u), bias_of(co + 3u))",
        "STORE": "    for (var j = 0u; j < 4u; j = j + 1u) { store(at + j * p.oh * p.ow, acc[j]); }",
        "CLAMPED": clamped("acc", "vec4<f32>(p.lo)", "vec4<f32>(p.hi)", lanes=4),
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


@dataclass(frozen=True)
class Conv:
    """What a variant's build needs of one convolution: its value ids, and its arguments as 2-D
    sizes (a 1-D convolution has height 1); `clamp` (lo, hi) for et_vk.conv_with_clamp, else None;
    `tx`, `tw`, `tb`, `to` the WGSL storage types (f32 or f16) of x, weight, bias and out; `added`
    a tensor shaped as the output added before the clamp (pte_wgpu.conv_residual), else None."""

    x: int
    weight: int
    bias: int | None
    out: int
    w: tuple
    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    transposed: bool
    groups: int
    clamp: tuple | None
    tx: str
    tw: str
    tb: str
    to: str
    added: int | None = None

    @property
    def bindings(self):
        return [self.x, self.weight] + ([self.bias] if self.bias is not None else []) + [self.out]


@dataclass(frozen=True)
class ConvShape:
    """A convolution's live sizes (2-D), and its product's as the GEMM sees it: m output channels,
    n output pixels, k = input channels x window, over `batch` images."""

    batch: int
    cin: int
    ih: int
    iw: int
    cout: int
    oh: int
    ow: int
    k: int

    @property
    def m(self):
        return self.cout

    @property
    def n(self):
        return self.oh * self.ow


class Direct:
    """The direct kernels' route (pointwise, direct or transposed, picked at build)."""

    def __init__(self, b, conv):
        self.conv = conv
        w = conv.w
        pointwise = not conv.transposed and conv.groups == 1 and conv.kernel == (1, 1) and conv.stride == (1, 1)
        pointwise = pointwise and conv.padding == (0, 0)
        body = TRANSPOSED if conv.transposed else POINTWISE if pointwise else DIRECT
        self.cout_g = w[1] if conv.transposed else w[0] // conv.groups
        self.block = 4 if self.cout_g % 4 == 0 else 1
        bindings = conv.bindings
        shader = fill(
            HEADER,
            KH=conv.kernel[0],
            KW=conv.kernel[1],
            TX=conv.tx,
            TW=conv.tw,
            TO=conv.to,
            IO=load_store(conv.to),
            BIAS_DECL=f"@group(0) @binding(2) var<storage, read> bias: array<{conv.tb}>;" if conv.bias is not None else "",
            BIAS="f32(bias[c])" if conv.bias is not None else "0.0",
            B=self.block,
            **BLOCK[self.block],
            OUT_BINDING=len(bindings) - 1,
            P_BINDING=len(bindings),
            BODY=body,
            FLAT_INDEX=FLAT_INDEX,
            OUTPUT_PIXEL=OUTPUT_PIXEL,
            MAIN=SPREAD_MAIN,
        )
        self.params = b.params(80)
        self.dispatch = b.dispatch(shader, bindings + [self.params])

    def set(self, ctx, s, on):
        c = self.conv
        if not on:
            ctx.set_grid(self.dispatch, (0, 0, 0))
            return
        kh, kw = c.kernel
        blocks = s.cout // self.block
        numel = s.batch * blocks * s.oh * s.ow
        wstep = kh * kw if c.transposed else s.cin // c.groups * kh * kw
        lo, hi = c.clamp or (-math.inf, math.inf)
        fields = (numel, s.cout, s.oh, s.ow, s.cin, s.ih, s.iw, s.cin // c.groups, self.cout_g, *c.stride, *c.padding, *c.dilation)
        ctx.set_params(self.params, struct.pack("<17I", *fields, blocks, wstep) + struct.pack("<ff", lo, hi))
        ctx.set_grid(self.dispatch, spread_grid(numel))


def _gemm(b, conv):
    return None if conv.transposed or conv.groups != 1 else ConvGemm(b, conv)


# The GEMM's tiles are 64 output channels high: below this many, the direct kernel (4 channels an
# invocation) wastes less. Side by side on lavapipe, 3x3 over 64 channels at 64 x 64, the GEMM took
# 3.3x the direct kernel's time at 3 output channels, 1.3x at 16, 0.52x at 64
# (examples/bench_conv_routes.py); in ResNet-50 (64 to 2048) it was faster at all but a few layers,
# by less than the noise.
GEMM_MIN_COUT = 32
# lavapipe ends an invocation's loops once they have iterated 65535 times together (ARCHITECTURE.md):
# the GEMM's K loop runs K / 16 steps of 16 (17 iterations a step if the inner loop is not unrolled).
GEMM_MAX_K = 16 * (65535 // 17)

# The routes of a convolution, first match wins (kernels/variants.py).
CONV_VARIANTS = (
    Variant("gemm", ANY, lambda s: s.cout >= GEMM_MIN_COUT and s.k <= GEMM_MAX_K and s.batch * s.n > 0, _gemm),
    Variant("direct", ANY, lambda s: True, Direct),
)
CONV_RESIDUAL = "pte_wgpu.conv_residual"
RESIDUAL_VARIANTS = (Variant("gemm", ANY, lambda s: s.batch * s.n > 0, _gemm),)  # the GEMM's epilogue adds it


def takes_residual(w, transposed, groups):
    """Whether a convolution of weight dims `w` always runs as the implicit GEMM (whose epilogue
    pte_wgpu.conv_residual adds to)."""
    return not transposed and groups == 1 and w[0] >= GEMM_MIN_COUT and math.prod(w[1:]) <= GEMM_MAX_K


@op("aten.convolution.default", "et_vk.conv_with_clamp.default", "aten::convolution.out", CONV_RESIDUAL, half=True)
def convolution(b):
    """`pte_wgpu.conv_residual` (kernels/fusion.py): et_vk.conv_with_clamp's arguments, then a
    tensor of the output's shape added before the clamp (a residual block's add and ReLU)."""
    x, weight, out = b.args[0], b.args[1], b.out
    bias = None if b.is_none(2) else b.args[2]
    added = b.args[11] if b.name == CONV_RESIDUAL else None
    tx, tw, to, tb = b.float_storage(x, weight, out, bias if bias is not None else out)
    w = b.tensor(1).dims
    spatial = len(w) - 2
    if spatial not in (1, 2):
        raise NotImplementedError(f"{b.name}: {spatial}-D convolution")
    stride, padding, dilation, output_padding = (
        _per_dim(b.int_list(i), spatial, default) for i, default in ((3, 1), (4, 0), (5, 1), (7, 0))
    )
    transposed, groups = bool(b.scalar(6, False)), int(b.scalar(8, 1))
    clamp = None
    if b.name in ("et_vk.conv_with_clamp.default", CONV_RESIDUAL):
        # a bound past f32's range (ExecuTorch gives a ReLU's upper bound as the largest double) is open
        clamp = tuple(v if abs(v) <= F32_MAX else math.copysign(math.inf, v) for v in (float(b.scalar(9, -math.inf)), float(b.scalar(10, math.inf))))
    if added is not None:
        b.float_storage(added)
        if not takes_residual(w, transposed, groups):
            b.fail(f"a residual added to a convolution of weight {tuple(w)}, transposed {transposed}, groups {groups}: only the implicit GEMM takes one")

    def as_2d(t, fill=1):
        """A 1-D convolution's sizes as the 2-D ones of height 1."""
        return tuple(t) if spatial == 2 else (fill, *t)

    conv = Conv(
        x, weight, bias, out, w, as_2d(w[2:]), as_2d(stride), as_2d(padding, 0), as_2d(dilation), transposed, groups, clamp,
        tx, tw, tb, to, added,
    )  # fmt: skip
    routes = Routes(CONV_VARIANTS if added is None else RESIDUAL_VARIANTS, b, conv)

    def resize(ctx):
        shape = ctx.dims(x)
        try:
            oshape = conv_out_shape(shape, w, stride, padding, dilation, transposed, output_padding, groups)
        except ValueError as e:
            b.fail(f"{e}")
        n, cin, ih, iw = shape[:2] + as_2d(shape[2:])
        _, cout, oh, ow = oshape[:2] + as_2d(oshape[2:])
        if added is not None and tuple(ctx.dims(added)) != tuple(oshape):
            b.fail(f"a residual of shape {tuple(ctx.dims(added))} for an output of shape {tuple(oshape)}")
        routes.set(ctx, ConvShape(n, cin, ih, iw, cout, oh, ow, cin // groups * conv.kernel[0] * conv.kernel[1]))
        ctx.set_dims(out, oshape)

    b.hook(resize)
