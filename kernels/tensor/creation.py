"""Creation ops: empty, full, full_like, zeros, ones, zeros_like, ones_like, scalar_tensor and arange.

They read no tensor data: empty writes nothing, the others run one kernel that writes
`out[i] = start + i * step` in the output's compute type (a fill is step 0; a float16 output
computes in f32 and converts at the store). The live shape comes from a size list (Ints and
SymInts), from another tensor's live shape (the `_like` ops), or from arange's live start/end/step.
"""

import math
import struct

from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..wgsl import PACKED, fill, flat_grid, flat_kernel, is_float, wgsl_type

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# out[i] = start + i * step in the compute type $CT, stored as $STORE (of x) into $TO
FILL = flat_kernel(
    "numel: u32, pad: u32, start: $CT, step: $CT",
    [("out", "$TO", "read_write")],
    """
    let x = p.start + $CT(i) * p.step;
    out[i] = $STORE;
""",
    count="numel",
)


def _compute_type(dtype):
    return "f32" if is_float(dtype) else "i32"


def _pack(ct, start, step):
    if ct == "f32":
        return struct.pack("<ff", _f32(start), _f32(step))
    return struct.pack("<ii", _i32(start), _i32(step))


def _f32(x):
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return x
    return max(min(x, 3.4028234663852886e38), -3.4028234663852886e38)


def _i32(x):
    if isinstance(x, float):
        if math.isnan(x):
            return 0
        if math.isinf(x):
            return INT32_MAX if x > 0 else INT32_MIN
    return max(min(int(x), INT32_MAX), INT32_MIN)


def fill_kernel(b):
    """Record the fill/ramp dispatch into the output; returns `set(ctx, shape, start, step)`."""
    out = b.graph.values[b.out]
    if out.dtype in PACKED:
        raise NotImplementedError(f"{b.name}: {out.dtype} output")
    to = wgsl_type(out.dtype)
    ct = _compute_type(out.dtype)
    store = "select(0u, 1u, x != 0)" if to == "u32" else f"{to}(x)"
    shader = fill(FILL, CT=ct, TO=to, STORE=store)
    params = b.params(16)
    d = b.dispatch(shader, [b.out, params])

    def set_fill(ctx, shape, start, step=0):
        n = numel_of(shape)
        if to == "u32":  # bool: only the truth of the value matters
            start, step = int(bool(start)), 0
        ctx.set_params(params, struct.pack("<II", n, 0) + _pack(ct, start, step))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, shape)

    return set_fill


def _size_of(b, ctx, vid):
    size = tuple(ctx.int_list(vid))
    if any(s < 1 for s in size):
        b.fail(f"size {list(size)} has a dim below 1 (empty tensors are not supported)")
    return size


def _scalar_value(b, i):
    """A fill value fixed in the file (Int, Double or Bool), or a live SymInt."""
    v = b.value(i)
    if hasattr(v, "value"):
        if v.value is None:
            b.fail(f"argument {i} is None, expected a number")
        return lambda ctx: v.value
    vid = b.args[i]
    return lambda ctx: ctx.int_value(vid)


def _full(b, size_arg, value):
    set_fill = fill_kernel(b)

    def resize(ctx):
        set_fill(ctx, _size_of(b, ctx, size_arg), value(ctx))

    b.hook(resize)


def _like(b, value):
    set_fill = fill_kernel(b)
    src = b.args[0]

    def resize(ctx):
        set_fill(ctx, ctx.dims(src), value(ctx))

    b.hook(resize)


@op("aten::empty.out", "dim_order_ops::_empty_dim_order.out", half=True)
def empty(b):
    """torch.empty: the shape alone; the elements are whatever the buffer holds (torch leaves them
    undefined, and the program writes them before it reads them)."""

    def resize(ctx):
        ctx.set_dims(b.out, _size_of(b, ctx, b.args[0]))

    b.hook(resize)


@op("aten.full.default", "aten::full.out", half=True)
def full(b):
    _full(b, b.args[0], _scalar_value(b, 1))


@op("aten.zeros.default", "aten::zeros.out", half=True)
def zeros(b):
    _full(b, b.args[0], lambda ctx: 0)


@op("aten.ones.default", "aten::ones.out", half=True)
def ones(b):
    _full(b, b.args[0], lambda ctx: 1)


@op("aten.full_like.default", "aten::full_like.out", half=True)
def full_like(b):
    _like(b, _scalar_value(b, 1))


@op("aten.zeros_like.default", "aten::zeros_like.out", half=True)
def zeros_like(b):
    _like(b, lambda ctx: 0)


@op("aten.ones_like.default", "aten::ones_like.out", half=True)
def ones_like(b):
    _like(b, lambda ctx: 1)


@op("aten.scalar_tensor.default", "aten::scalar_tensor.out", half=True)
def scalar_tensor(b):
    value = _scalar_value(b, 0)
    set_fill = fill_kernel(b)
    rank = len(b.graph.values[b.out].dims)

    def resize(ctx):
        set_fill(ctx, (1,) * rank, value(ctx))

    b.hook(resize)


def _arange(b, start, end, step):
    """`start`, `end`, `step`: functions of ctx giving the live numbers."""
    set_fill = fill_kernel(b)
    out = b.graph.values[b.out]
    if len(out.dims) != 1:
        b.fail(f"output of rank {len(out.dims)}, expected 1")

    def resize(ctx):
        a, e, s = start(ctx), end(ctx), step(ctx)
        if s == 0:
            b.fail("step must be nonzero")
        n = math.ceil((e - a) / s)
        if n < 1:
            b.fail(f"arange({a}, {e}, {s}) is empty (empty tensors are not supported)")
        set_fill(ctx, (n,), a, s)

    b.hook(resize)


def _number(b, i, default):
    """A start/end/step argument: a SymInt, a fixed number, or missing/None (the default)."""
    if i >= len(b.args) - 1:
        return lambda ctx: default
    v = b.value(i)
    if hasattr(v, "value"):
        value = default if v.value is None else v.value
        if isinstance(value, bool):
            value = int(value)
        return lambda ctx: value
    vid = b.args[i]
    return lambda ctx: ctx.int_value(vid)


@op("aten.arange.start_step", "aten.arange.start", "aten::arange.start_out", half=True)
def arange_start_step(b):
    # aten.arange.start has no step: (start, end, dtype, layout, device, pin_memory, out)
    step = (lambda ctx: 1) if b.name == "aten.arange.start" else _number(b, 2, 1)
    _arange(b, _number(b, 0, 0), _number(b, 1, None), step)


@op("aten.arange.default", "aten::arange.out", half=True)
def arange_end(b):
    _arange(b, lambda ctx: 0, _number(b, 0, None), lambda ctx: 1)
