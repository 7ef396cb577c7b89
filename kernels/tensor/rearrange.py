"""Copies that rearrange a tensor: flip, repeat and constant_pad_nd, all on the strided copy of
kernels/tensor/shape.py.

- flip reads each flipped dim backwards: a negative stride, which the kernel's u32 arithmetic
  wraps correctly (`in_off + c * (2**32 - s)` is `in_off - c * s` modulo 2**32).
- repeat splits each repeated output dim d into (repeat r_d, size s_d): the input stride of the
  repeat coordinate is 0 and its output stride is s_d times the output dim's stride. Dims with
  r_d == 1 stay one dim, so at most 8 coordinates means up to 4 repeated dims.
- constant_pad_nd fills the output with the value, then copies the input's kept region into it
  (negative pads crop).
"""

from pte_wgpu.resize.shapes import contiguous_strides

from ..registry import op
from .creation import fill_kernel
from .shape import _dim, strided_copy

U32 = 2**32


@op("aten.flip.default", "aten::flip.out", half=True)
def flip(b):
    src = b.args[0]
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        dims = ctx.dims(src)
        flipped = {_dim(b, d, len(dims)) for d in ctx.int_list(b.args[1])}
        strides = list(contiguous_strides(dims))
        off = sum((dims[d] - 1) * strides[d] for d in flipped)
        for d in flipped:
            strides[d] = (U32 - strides[d]) % U32
        set_copy(ctx, dims, strides, off)
        ctx.set_dims(b.out, dims)

    b.hook(resize)


@op("aten.repeat.default", "aten::repeat.out", half=True)
def repeat(b):
    src = b.args[0]
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        reps = ctx.int_list(b.args[1])
        dims = ctx.dims(src)
        if len(reps) < len(dims) or min(reps, default=1) < 1:
            b.fail(f"repeats {list(reps)} for shape {list(dims)}")
        dims = (1,) * (len(reps) - len(dims)) + tuple(dims)
        shape = tuple(r * s for r, s in zip(reps, dims))
        in_strides, out_strides = contiguous_strides(dims), contiguous_strides(shape)
        sizes, ins, outs = [], [], []
        for r, s, si, so in zip(reps, dims, in_strides, out_strides):
            if r > 1:
                sizes.append(r)
                ins.append(0)
                outs.append(s * so)
            sizes.append(s)
            ins.append(si)
            outs.append(so)
        if len(sizes) > 8:
            b.fail(f"repeats {list(reps)}: more than 4 repeated dims")
        set_copy(ctx, sizes, ins, 0, outs)
        ctx.set_dims(b.out, shape)

    b.hook(resize)


@op("aten.constant_pad_nd.default", "aten::constant_pad_nd.out", half=True)
def constant_pad_nd(b):
    src = b.args[0]
    value = b.scalar(2, 0)
    set_fill = fill_kernel(b)
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        dims = ctx.dims(src)
        pad = ctx.int_list(b.args[1])
        if len(pad) % 2 or len(pad) // 2 > len(dims):
            b.fail(f"padding {list(pad)} for shape {list(dims)}")
        shape, starts, region = list(dims), [0] * len(dims), list(dims)
        out_starts = [0] * len(dims)
        for k in range(len(pad) // 2):  # pairs run from the last dim backwards
            d = len(dims) - 1 - k
            lo, hi = pad[2 * k], pad[2 * k + 1]
            shape[d] = dims[d] + lo + hi
            starts[d], out_starts[d] = max(-lo, 0), max(lo, 0)
            region[d] = dims[d] - max(-lo, 0) - max(-hi, 0)
        if min(shape) < 1:
            b.fail(f"padding {list(pad)} of shape {list(dims)} leaves an empty tensor")
        set_fill(ctx, shape, value)
        in_strides, out_strides = contiguous_strides(dims), contiguous_strides(shape)
        if min(region) < 1:  # everything cropped away: the fill alone
            set_copy(ctx, [0], [1])
            return
        set_copy(
            ctx,
            region,
            in_strides,
            sum(a * s for a, s in zip(starts, in_strides)),
            out_strides,
            sum(a * s for a, s in zip(out_starts, out_strides)),
        )

    b.hook(resize)
