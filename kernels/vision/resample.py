"""Resampling: upsample_nearest2d and upsample_bilinear2d (output sizes or scale factors, either
align_corners; bilinear also antialiased), grid_sampler_2d and et_vk.grid_priors. One invocation
per output element.

The source coordinates follow torch's CPU kernels in f32: nearest reads `min(floor(dst * scale),
in - 1)`; bilinear reads `dst * (in - 1) / (out - 1)` with align_corners and otherwise
`max((dst + 0.5) * scale - 0.5, 0)`, where `scale` is 1 / the given scale factor, or in / out.
float16 inputs, grids and outputs load as f32 and convert back at the store.
"""

import math
import struct

import numpy as np
from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..wgsl import FLAT_INDEX, SPREAD_MAIN, fill, spread_grid
from .pixels import OUTPUT_PIXEL, load_store

UPSAMPLE = """
struct P { numel: u32, oh: u32, ow: u32, ih: u32, iw: u32, align: u32, scale_h: f32, scale_w: f32 }
@group(0) @binding(0) var<storage, read> x: array<$TX>;
@group(0) @binding(1) var<storage, read_write> out: array<$TO>;
@group(0) @binding(2) var<uniform> p: P;
$FLAT_INDEX
$MAIN
$IO
fn element(i: u32) {
$OUTPUT_PIXEL
$BODY
}
"""

NEAREST = """
    let iy = min(u32(floor(f32(oy) * p.scale_h)), p.ih - 1u);
    let ix = min(u32(floor(f32(ox) * p.scale_w)), p.iw - 1u);
    store(i, load(plane + iy * p.iw + ix));
"""

BILINEAR = """
    var sy = f32(oy) * p.scale_h;
    var sx = f32(ox) * p.scale_w;
    if (p.align == 0u) {
        sy = max((f32(oy) + 0.5) * p.scale_h - 0.5, 0.0);
        sx = max((f32(ox) + 0.5) * p.scale_w - 0.5, 0.0);
    }
    let y0 = min(u32(sy), p.ih - 1u);
    let x0 = min(u32(sx), p.iw - 1u);
    let y1 = min(y0 + 1u, p.ih - 1u);
    let x1 = min(x0 + 1u, p.iw - 1u);
    let ly = sy - f32(y0);
    let lx = sx - f32(x0);
    let top = (1.0 - lx) * load(plane + y0 * p.iw + x0) + lx * load(plane + y0 * p.iw + x1);
    let bottom = (1.0 - lx) * load(plane + y1 * p.iw + x0) + lx * load(plane + y1 * p.iw + x1);
    store(i, (1.0 - ly) * top + ly * bottom);
"""


def _f32(v):
    return float(np.float32(v))


def source_scale(size_in, size_out, scale_factor, align_corners):
    """The f32 step between source coordinates of neighbouring outputs (torch's area_pixel_compute_scale)."""
    if align_corners:
        return _f32(np.float32(size_in - 1) / np.float32(size_out - 1)) if size_out > 1 else 0.0
    if scale_factor:
        return _f32(1.0 / scale_factor)
    return _f32(np.float32(size_in) / np.float32(size_out))


def upsample_out_size(shape, output_size, scale_factors):
    """The (height, width) an upsample of `shape` gives: `output_size`, or the sizes scaled and floored."""
    if len(shape) != 4:
        raise ValueError(f"input of shape {shape}: expected 4-D")
    if output_size is not None:
        if len(output_size) != 2:
            raise ValueError(f"output size {list(output_size)}: expected 2 sizes")
        size = tuple(output_size)
    elif scale_factors is not None and len(scale_factors) == 2:
        size = tuple(math.floor(s * f) for s, f in zip(shape[2:], scale_factors))
    else:
        raise ValueError("neither an output size nor 2 scale factors")
    if min(size) < 1:
        raise ValueError(f"input of shape {shape} gives an empty output {size}")
    return size


def add_upsample(b, body, align_corners, scales, functions=""):
    """Record an upsample of argument 0 to the sizes of argument 1 (a list, or None for `scales`
    times the input's), reading the source at 1 / scales where given (height, width; either None),
    else at the sizes' ratio; `body` computes output pixel i (WGSL), with `functions`."""
    x, out = b.args[0], b.out
    tx, to = b.float_storage(x, out)
    shader = fill(UPSAMPLE, TX=tx, TO=to, IO=load_store(to) + functions, BODY=body, FLAT_INDEX=FLAT_INDEX, OUTPUT_PIXEL=OUTPUT_PIXEL,
                  MAIN=SPREAD_MAIN)
    params = b.params(32)
    d = b.dispatch(shader, [x, out, params])

    def resize(ctx):
        shape = ctx.dims(x)
        sizes = None if b.is_none(1) else ctx.int_list(b.args[1])
        try:
            oh, ow = upsample_out_size(shape, sizes, scales)
        except ValueError as e:
            b.fail(f"{e}")
        fh, fw = scales if scales is not None else (None, None)
        sh = source_scale(shape[2], oh, fh, align_corners)
        sw = source_scale(shape[3], ow, fw, align_corners)
        numel = shape[0] * shape[1] * oh * ow
        ctx.set_params(params, struct.pack("<6I2f", numel, oh, ow, shape[2], shape[3], int(align_corners), sh, sw))
        ctx.set_grid(d, spread_grid(numel))
        ctx.set_dims(out, (shape[0], shape[1], oh, ow))

    b.hook(resize)


def _scale_factors(b, i):
    return None if b.is_none(i) else tuple(b.value(i).items)


@op("aten.upsample_nearest2d.vec", "aten::upsample_nearest2d.vec_out", half=True)
def upsample_nearest2d(b):
    add_upsample(b, NEAREST, False, _scale_factors(b, 2))


@op("aten.upsample_bilinear2d.vec", "aten::upsample_bilinear2d.vec_out", half=True)
def upsample_bilinear2d(b):
    add_upsample(b, BILINEAR, bool(b.scalar(2, False)), _scale_factors(b, 3))


# Antialiased bilinear (torch's separable triangle filter): output o of a dim reads the inputs
# within `support` (1, or the scale when shrinking) of its center scale * (o + 0.5), each weighted
# 1 - |distance| (the distance over the scale when shrinking), the weights of a dim normalized.
# One pass over the 2-D window, about (2 * scale_h + 1) * (2 * scale_w + 1) reads an output (two
# separable passes, as torch's CPU kernel, were slower on lavapipe at 1,024 -> 224: 14.0 against 11.2 ms).
AA_WINDOW = """
fn aa_window(o: u32, scale: f32, size: u32) -> vec4<f32> {
    let shrink = scale >= 1.0;
    let support = select(1.0, scale, shrink);
    let center = scale * (f32(o) + 0.5);
    let lo = max(i32(center - support + 0.5), 0);
    let hi = min(i32(center + support + 0.5), i32(size));
    return vec4<f32>(f32(lo), f32(hi), center, select(1.0, 1.0 / scale, shrink));
}
fn aa_weight(j: i32, w: vec4<f32>) -> f32 { return max(0.0, 1.0 - abs((f32(j) - w.z + 0.5) * w.w)); }
"""

BILINEAR_AA = """
    let wy = aa_window(oy, p.scale_h, p.ih);
    let wx = aa_window(ox, p.scale_w, p.iw);
    var acc = 0.0;
    var ty = 0.0;
    for (var y = i32(wy.x); y < i32(wy.y); y = y + 1) {
        var row = 0.0;
        for (var x = i32(wx.x); x < i32(wx.y); x = x + 1) { row = row + aa_weight(x, wx) * load(plane + u32(y) * p.iw + u32(x)); }
        acc = acc + aa_weight(y, wy) * row;
        ty = ty + aa_weight(y, wy);
    }
    var tx = 0.0;
    for (var x = i32(wx.x); x < i32(wx.y); x = x + 1) { tx = tx + aa_weight(x, wx); }
    store(i, select(acc / (ty * tx), 0.0, ty * tx == 0.0));
"""


@op("aten._upsample_bilinear2d_aa.default", "aten::_upsample_bilinear2d_aa.out", half=True)
def upsample_bilinear2d_aa(b):
    """[input, output_size, align_corners, scale_h or None, scale_w or None, out]."""
    scales = tuple(None if b.is_none(i) else float(b.scalar(i)) for i in (3, 4))
    add_upsample(b, BILINEAR_AA, bool(b.scalar(2, False)), scales, AA_WINDOW)


# grid_sampler_2d: out[n, c, y, x] samples input[n, c] at grid[n, y, x] = (gx, gy) in [-1, 1].
GRID_SAMPLE = """
struct P { numel: u32, c: u32, oh: u32, ow: u32, ih: u32, iw: u32, align: u32, padding: u32 }
@group(0) @binding(0) var<storage, read> x: array<$TX>;
@group(0) @binding(1) var<storage, read> grid: array<$TG>;
@group(0) @binding(2) var<storage, read_write> out: array<$TO>;
@group(0) @binding(3) var<uniform> p: P;
$IO
// zeros (0), border (1) or reflection (2) padding of a source coordinate over `size` pixels
fn source(g: f32, size: u32) -> f32 {
    let s = f32(size);
    var v = ((g + 1.0) * s - 1.0) * 0.5;
    if (p.align != 0u) { v = (g + 1.0) * 0.5 * (s - 1.0); }
    if (p.padding == 2u) {
        var lo = -0.5;
        var span = s;
        if (p.align != 0u) { lo = 0.0; span = s - 1.0; }
        if (span <= 0.0) { return 0.0; }
        let a = abs(v - lo);
        let flips = floor(a / span);
        let extra = a - flips * span;
        v = select(span - extra + lo, extra + lo, flips % 2.0 == 0.0);
    }
    if (p.padding != 0u) { v = clamp(v, 0.0, s - 1.0); }
    return v;
}
fn at(plane: u32, yy: f32, xx: f32) -> f32 {
    if (yy < 0.0 || xx < 0.0 || yy >= f32(p.ih) || xx >= f32(p.iw)) { return 0.0; }
    return load(plane + u32(yy) * p.iw + u32(xx));
}
$FLAT_INDEX
$MAIN
fn element(i: u32) {
$OUTPUT_PIXEL
    let n = nc / p.c;
    let g = ((n * p.oh + oy) * p.ow + ox) * 2u;
    let sx = source(f32(grid[g]), p.iw);
    let sy = source(f32(grid[g + 1u]), p.ih);
$BODY
}
"""

GRID_BILINEAR = """
    let x0 = floor(sx);
    let y0 = floor(sy);
    let lx = sx - x0;
    let ly = sy - y0;
    store(i, at(plane, y0, x0) * (1.0 - lx) * (1.0 - ly) + at(plane, y0, x0 + 1.0) * lx * (1.0 - ly)
             + at(plane, y0 + 1.0, x0) * (1.0 - lx) * ly + at(plane, y0 + 1.0, x0 + 1.0) * lx * ly);
"""

GRID_NEAREST = """
    store(i, at(plane, round(sy), round(sx)));
"""


@op("aten.grid_sampler_2d.default", "aten::grid_sampler_2d.out", half=True)
def grid_sampler_2d(b):
    x, grid, out = b.args[0], b.args[1], b.out
    mode, padding, align = int(b.scalar(2, 0)), int(b.scalar(3, 0)), bool(b.scalar(4, False))
    if mode not in (0, 1) or padding not in (0, 1, 2):
        raise NotImplementedError(f"{b.name}: interpolation mode {mode}, padding mode {padding}")
    body = GRID_BILINEAR if mode == 0 else GRID_NEAREST
    tx, tg, to = b.float_storage(x, grid, out)
    shader = fill(
        GRID_SAMPLE, TX=tx, TG=tg, TO=to, IO=load_store(to), BODY=body, FLAT_INDEX=FLAT_INDEX, OUTPUT_PIXEL=OUTPUT_PIXEL, MAIN=SPREAD_MAIN
    )
    params = b.params(32)
    d = b.dispatch(shader, [x, grid, out, params])

    def resize(ctx):
        shape, gshape = ctx.dims(x), ctx.dims(grid)
        if len(shape) != 4 or len(gshape) != 4 or gshape[0] != shape[0] or gshape[3] != 2:
            b.fail(f"input {shape} with grid {gshape}: expected [N, C, H, W] and [N, H', W', 2]")
        oshape = (shape[0], shape[1], gshape[1], gshape[2])
        numel = numel_of(oshape)
        ctx.set_params(params, struct.pack("<8I", numel, shape[1], gshape[1], gshape[2], shape[2], shape[3], align, padding))
        ctx.set_grid(d, spread_grid(numel))
        ctx.set_dims(out, oshape)

    b.hook(resize)


# et_vk.grid_priors: row y * W + x of the [H * W, 2] output is ((x + offset) * stride, (y + offset) * stride).
GRID_PRIORS = """
struct P { numel: u32, w: u32, stride: f32, offset: f32 }
@group(0) @binding(0) var<storage, read_write> out: array<$TO>;
@group(0) @binding(1) var<uniform> p: P;
$FLAT_INDEX
$MAIN
fn element(i: u32) {
    if (i >= p.numel) { return; }
    let cell = i / 2u;
    let c = select(cell / p.w, cell % p.w, i % 2u == 0u);
    out[i] = $TO((f32(c) + p.offset) * p.stride);
}
"""


@op("et_vk.grid_priors.default", half=True)
def grid_priors(b):
    x, out = b.args[0], b.out
    stride, offset = float(b.scalar(1)), float(b.scalar(2))
    (to,) = b.float_storage(out)
    shader = fill(GRID_PRIORS, FLAT_INDEX=FLAT_INDEX, MAIN=SPREAD_MAIN, TO=to)
    params = b.params(16)
    d = b.dispatch(shader, [out, params])

    def resize(ctx):
        shape = ctx.dims(x)
        if len(shape) < 2:
            b.fail(f"input of shape {shape}: expected at least 2 dims")
        h, w = shape[-2:]
        ctx.set_params(params, struct.pack("<2I2f", h * w * 2, w, stride, offset))
        ctx.set_grid(d, spread_grid(h * w * 2))
        ctx.set_dims(out, (h * w, 2))

    b.hook(resize)
