"""Vision ops that only move elements, each one strided copy (kernels/tensor/shape.py): pixel_shuffle,
pixel_unshuffle and unfold_copy. The output is walked contiguously over split coordinates and
each coordinate's input stride says where its element comes from."""

from pte_wgpu.resize.shapes import contiguous_strides, numel_of

from ..registry import op
from ..tensor.shape import _dim, strided_copy


def _shuffle(b, unshuffle):
    src = b.args[0]
    r = int(b.scalar(1))
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        dims = ctx.dims(src)
        if len(dims) < 3 or r < 1:
            b.fail(f"factor {r} for shape {list(dims)}: expected at least 3 dims")
        batch, (c, h, w) = numel_of(dims[:-3]), dims[-3:]
        if unshuffle:
            if h % r or w % r:
                b.fail(f"height and width of shape {list(dims)} are not multiples of {r}")
            oh, ow = h // r, w // r
            shape = (*dims[:-3], c * r * r, oh, ow)
            # out [B, C, i, j, H/r, W/r] reads in[b, c, y * r + i, x * r + j]
            sizes = (batch, c, r, r, oh, ow)
            strides = (c * h * w, h * w, w, 1, r * w, r)
        else:
            if c % (r * r):
                b.fail(f"channels of shape {list(dims)} are not a multiple of {r * r}")
            oc = c // (r * r)
            shape = (*dims[:-3], oc, h * r, w * r)
            # out [B, C/r², H, i, W, j] reads in[b, (c * r + i) * r + j, y, x]
            sizes = (batch, oc, h, r, w, r)
            strides = (c * h * w, r * r * h * w, w, r * h * w, 1, h * w)
        set_copy(ctx, sizes, strides)
        ctx.set_dims(b.out, shape)

    b.hook(resize)


@op("aten.pixel_shuffle.default", "aten::pixel_shuffle.out", half=True)
def pixel_shuffle(b):
    _shuffle(b, unshuffle=False)


@op("aten.pixel_unshuffle.default", "aten::pixel_unshuffle.out", half=True)
def pixel_unshuffle(b):
    _shuffle(b, unshuffle=True)


@op("aten.unfold_copy.default", "aten::unfold_copy.out", half=True)
def unfold_copy(b):
    """Windows of `size` every `step` along `dimension`, as a new last dim."""
    src = b.args[0]
    size, step = int(b.scalar(2)), int(b.scalar(3))
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        dims = ctx.dims(src)
        d = _dim(b, int(b.scalar(1)), len(dims))
        if step < 1 or not 1 <= size <= dims[d]:
            b.fail(f"size {size} and step {step} for dim {d} of shape {list(dims)}")
        strides = contiguous_strides(dims)
        sizes = [*dims, size]
        sizes[d] = (dims[d] - size) // step + 1
        set_copy(ctx, sizes, [*strides[:d], strides[d] * step, *strides[d + 1 :], strides[d]])
        ctx.set_dims(b.out, sizes)

    b.hook(resize)
