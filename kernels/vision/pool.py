"""2-D pooling: max_pool2d (with or without indices) and avg_pool2d, over the last two dims of a 3-D
or 4-D input. One invocation per output element walks its window; padding never counts as a max
candidate, and the max index is the flat position in the input's plane, as in torch. Adaptive
average pooling reaches the delegate as `mean.dim` (kernels/tensor/reduce.py), and the portable
kernels by its own name, any output size. float16 tensors load as f32 and the result converts
back at the store."""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..wgsl import FLAT_INDEX, SPREAD_MAIN, fill, spread_grid
from .pixels import OUTPUT_PIXEL, load_store

HEADER = """
struct P { numel: u32, oh: u32, ow: u32, ih: u32, iw: u32, kh: u32, kw: u32, sh: u32,
           sw: u32, ph: u32, pw: u32, dh: u32, dw: u32, divisor: u32, include_pad: u32, pad0: u32 }
@group(0) @binding(0) var<storage, read> x: array<$TX>;
$OUTS
$FLAT_INDEX
$MAIN
$IO
fn element(i: u32) {
$OUTPUT_PIXEL
    let iy0 = i32(oy * p.sh) - i32(p.ph);
    let ix0 = i32(ox * p.sw) - i32(p.pw);
$BODY
}
"""

MAX = """
    let inf_bits = 0x7f800000u;  // a let: WGSL refuses an infinite constant
    var best = -bitcast<f32>(inf_bits);
    var at = u32(max(iy0, 0)) * p.iw + u32(max(ix0, 0));
    for (var ky = 0u; ky < p.kh; ky = ky + 1u) {
        let iy = iy0 + i32(ky * p.dh);
        if (iy < 0 || iy >= i32(p.ih)) { continue; }
        for (var kx = 0u; kx < p.kw; kx = kx + 1u) {
            let ix = ix0 + i32(kx * p.dw);
            if (ix < 0 || ix >= i32(p.iw)) { continue; }
            let k = u32(iy) * p.iw + u32(ix);
            let v = load(plane + k);
            if (v > best || is_nan(v)) { best = v; at = k; }  // a NaN wins, as in torch
        }
    }
    store(i, best);
"""

# count_include_pad counts the window clipped to the padded input; otherwise to the input itself
AVG = """
    let y_end = min(iy0 + i32(p.kh), i32(p.ih + p.ph));
    let x_end = min(ix0 + i32(p.kw), i32(p.iw + p.pw));
    let padded = (y_end - iy0) * (x_end - ix0);
    let y0 = max(iy0, 0);
    let x0 = max(ix0, 0);
    let y1 = min(y_end, i32(p.ih));
    let x1 = min(x_end, i32(p.iw));
    var acc = 0.0;
    for (var iy = y0; iy < y1; iy = iy + 1) {
        for (var ix = x0; ix < x1; ix = ix + 1) { acc = acc + load(plane + u32(iy) * p.iw + u32(ix)); }
    }
    var count = f32(select((y1 - y0) * (x1 - x0), padded, p.include_pad != 0u));
    if (p.divisor != 0u) { count = f32(p.divisor); }
    store(i, acc / count);
"""


# adaptive: output row oy averages input rows floor(oy * ih / oh) to ceil((oy + 1) * ih / oh), as in torch
ADAPTIVE = """
    let y0 = oy * p.ih / p.oh;
    let y1 = ((oy + 1u) * p.ih + p.oh - 1u) / p.oh;
    let x0 = ox * p.iw / p.ow;
    let x1 = ((ox + 1u) * p.iw + p.ow - 1u) / p.ow;
    var acc = 0.0;
    for (var iy = y0; iy < y1; iy = iy + 1u) {
        for (var ix = x0; ix < x1; ix = ix + 1u) { acc = acc + load(plane + iy * p.iw + ix); }
    }
    store(i, acc / f32((y1 - y0) * (x1 - x0)));
"""
BODIES = {"max": MAX, "avg": AVG, "adaptive": ADAPTIVE}


def pool_out_size(size, kernel, stride, pad, dilation, ceil_mode):
    """One spatial output size of a pooling window (PyTorch's pooling_output_shape)."""
    if pad > kernel // 2:
        raise ValueError(f"padding {pad} is more than half the kernel size {kernel}")
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:  # the last window must start inside
        out -= 1
    if out < 1:
        raise ValueError(f"input size {size} is too small for the kernel {kernel} (padding {pad}, dilation {dilation})")
    return out


def _pair(items, default):
    items = tuple(items) or default
    return items * 2 if len(items) == 1 else items


def add_pool(b, kind, outs, kernel=(1,), stride=(), padding=(0,), dilation=(1,), ceil_mode=False, include_pad=True, divisor=0, out_size=None):
    """Record a pooling op of argument 0 into `outs` (the output, then for max the indices);
    `out_size` (height, width): the adaptive pooling's, whose windows follow from it (no kernel,
    stride, padding or dilation)."""
    x = b.args[0]
    tx, to = b.float_storage(x, outs[0])
    kh, kw = _pair(kernel, None)
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride, (kh, kw)), _pair(padding, (0,)), _pair(dilation, (1,))
    decls = [f"@group(0) @binding(1) var<storage, read_write> out: array<{to}>;"]
    body = BODIES[kind]
    if len(outs) == 2:
        decls.append("@group(0) @binding(2) var<storage, read_write> indices: array<i32>;")
        body += "    indices[i] = i32(at);\n"
    decls.append(f"@group(0) @binding({len(outs) + 1}) var<uniform> p: P;")
    shader = fill(
        HEADER, TX=tx, OUTS="\n".join(decls), IO=load_store(to), BODY=body, FLAT_INDEX=FLAT_INDEX, OUTPUT_PIXEL=OUTPUT_PIXEL, MAIN=SPREAD_MAIN
    )
    params = b.params(64)
    d = b.dispatch(shader, [x, *outs, params])

    def resize(ctx):
        shape = ctx.dims(x)
        try:
            if len(shape) not in (3, 4):
                raise ValueError(f"input of shape {shape}: expected 3-D or 4-D")
            if out_size is not None:
                oh, ow = out_size
            else:
                oh = pool_out_size(shape[-2], kh, sh, ph, dh, ceil_mode)
                ow = pool_out_size(shape[-1], kw, sw, pw, dw, ceil_mode)
        except ValueError as e:
            b.fail(f"{e}")
        oshape = (*shape[:-2], oh, ow)
        numel = numel_of(oshape)
        data = struct.pack("<15I", numel, oh, ow, shape[-2], shape[-1], kh, kw, sh, sw, ph, pw, dh, dw, divisor, include_pad)
        ctx.set_params(params, data)
        ctx.set_grid(d, spread_grid(numel))
        for v in outs:
            ctx.set_dims(v, oshape)

    b.hook(resize)


@op("aten.max_pool2d_with_indices.default", "aten::max_pool2d_with_indices.out", half=True, capacity=True)
def max_pool2d_with_indices(b):
    ints = [b.int_list(i) for i in range(1, 5)]
    add_pool(b, "max", b.outputs(2), *ints, bool(b.scalar(5, False)))


@op("aten.max_pool2d.default", half=True, capacity=True)
def max_pool2d(b):
    ints = [b.int_list(i) for i in range(1, 5)]
    add_pool(b, "max", [b.out], *ints, bool(b.scalar(5, False)))


@op("aten.avg_pool2d.default", "aten::avg_pool2d.out", half=True, capacity=True)
def avg_pool2d(b):
    ints = [b.int_list(i) for i in range(1, 4)]
    divisor = int(b.scalar(6, 0) or 0)
    add_pool(b, "avg", [b.out], *ints, (1,), bool(b.scalar(4, False)), bool(b.scalar(5, True)), divisor)


@op("aten._adaptive_avg_pool2d.default", "aten::_adaptive_avg_pool2d.out", half=True, capacity=True)
def adaptive_avg_pool2d(b):
    """[input, output_size, out]: any output size, a window of about input / output each."""
    size = _pair(b.int_list(1), None)
    if len(size) != 2 or min(size) < 1:
        b.fail(f"output size {list(size)}: expected 2 sizes of at least 1")
    add_pool(b, "adaptive", [b.out], out_size=size)
