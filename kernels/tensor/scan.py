"""Scans and boolean reductions: cumsum along one dim, any/all over some or all dims.

cumsum: one invocation per line along `dim` runs the prefix sum sequentially in the output's
compute type (bool and int inputs sum as i32, floats, float16 included, as f32).
any/all: one invocation per output element walks the reduced elements through their strides and
stops at the first element that decides the answer.
"""

import struct

from pte_wgpu.resize.shapes import contiguous_strides, normalize_dim, numel_of

from ..registry import op
from ..wgsl import PACKED, STRIDED, fill, flat_grid, flat_kernel, is_float, pack_u32x8, wgsl_type

CUMSUM = flat_kernel(
    "lines: u32, size: u32, inner: u32, pad: u32",
    [("src", "$TI", "read"), ("dst", "$TO", "read_write")],
    """
    let base = (l / p.inner) * p.size * p.inner + l % p.inner;
    var acc = $CT(0);
    for (var k = 0u; k < p.size; k = k + 1u) {
        let at = base + k * p.inner;
        acc = acc + $CT(src[at]);
        dst[at] = $STORE;
    }
""",
    count="lines",
    index="l",
)

BOOL_REDUCE = flat_kernel(
    """numel: u32, nr: u32, kr: u32, rr: u32, ksizes: array<vec4<u32>, 2>, kstrides: array<vec4<u32>, 2>,
           rsizes: array<vec4<u32>, 2>, rstrides: array<vec4<u32>, 2>""",
    [("src", "$TI", "read"), ("dst", "$TO", "read_write")],
    """
    // (a rank of 0 has one element, at offset 0)
    let base = strided_offsets(i, p.kr, p.ksizes, p.kstrides, p.kstrides, p.kstrides).x;
    var result = $INIT;
    for (var r = 0u; r < p.nr; r = r + 1u) {
        let off = base + strided_offsets(r, p.rr, p.rsizes, p.rstrides, p.rstrides, p.rstrides).x;
        if ((src[off] != $TI(0)) == $DECIDER) {
            result = $DECIDER;
            break;
        }
    }
    dst[i] = $TO(select(0u, 1u, result));
""",
    count="numel",
    functions=STRIDED,
)


def _check_unpacked(b, *vids):
    for v in vids:
        dtype = b.graph.values[v].dtype
        if dtype in PACKED:
            raise NotImplementedError(f"{b.name}: {dtype} tensors")


@op("aten.cumsum.default", "aten::cumsum.out", half=True)
def cumsum(b):
    src = b.args[0]
    _check_unpacked(b, src, b.out)
    ti, to = wgsl_type(b.tensor(0).dtype), b.storage(b.out)
    ct = "f32" if is_float(b.graph.values[b.out].dtype) else "i32"
    store = "select(0u, 1u, acc != 0)" if to == "u32" else f"{to}(acc)"
    shader = fill(CUMSUM, TI=ti, TO=to, CT=ct, STORE=store)
    params = b.params(16)
    d = b.dispatch(shader, [src, b.out, params])

    def resize(ctx):
        dims = ctx.dims(src)
        rank = len(dims)
        dim = normalize_dim(ctx.int_value(b.args[1]), rank) if rank else 0
        size = dims[dim] if rank else 1
        inner = numel_of(dims[dim + 1 :]) if rank else 1
        lines = numel_of(dims) // size
        ctx.set_params(params, struct.pack("<4I", lines, size, inner, 0))
        ctx.set_grid(d, flat_grid(lines))
        ctx.set_dims(b.out, dims)

    b.hook(resize)


def _bool_reduce(b, is_any, dims_of, keepdim):
    """`dims_of(ctx, rank)`: the reduced dims (None or empty for all); `keepdim`: a bool."""
    src = b.args[0]
    _check_unpacked(b, src, b.out)
    ti, to = wgsl_type(b.tensor(0).dtype), b.storage(b.out)
    decider = "true" if is_any else "false"
    shader = fill(BOOL_REDUCE, TI=ti, TO=to, INIT="false" if is_any else "true", DECIDER=decider)
    params = b.params(16 + 4 * 32)
    d = b.dispatch(shader, [src, b.out, params])
    out_rank = len(b.graph.values[b.out].dims)

    def resize(ctx):
        dims = ctx.dims(src)
        rank = len(dims)
        picked = dims_of(ctx, rank)
        if not picked:
            picked = range(rank)
        try:
            picked = {normalize_dim(x, rank) for x in picked} if rank else set()
        except IndexError as e:
            b.fail(str(e))
        strides = contiguous_strides(dims)
        kept = [k for k in range(rank) if k not in picked]
        red = sorted(picked)
        ksizes, kstrides = [dims[k] for k in kept], [strides[k] for k in kept]
        rsizes, rstrides = [dims[k] for k in red], [strides[k] for k in red]
        shape = tuple(1 if k in picked else s for k, s in enumerate(dims)) if keepdim else tuple(ksizes)
        if len(shape) != out_rank:
            b.fail(f"reducing dims {red} of live shape {dims} gives rank {len(shape)}, expected {out_rank}")
        n = numel_of(ksizes)
        data = struct.pack("<4I", n, numel_of(rsizes), len(kept), len(red))
        data += pack_u32x8(ksizes) + pack_u32x8(kstrides) + pack_u32x8(rsizes) + pack_u32x8(rstrides)
        ctx.set_params(params, data)
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, shape)

    b.hook(resize)


def _register(kind):
    is_any = kind == "any"

    @op(f"aten.{kind}.default", f"aten::{kind}.all_out", half=True)
    def reduce_all(b):
        _bool_reduce(b, is_any, lambda ctx, rank: None, False)

    @op(f"aten.{kind}.dim", f"aten::{kind}.out", half=True)
    def reduce_dim(b):
        _bool_reduce(b, is_any, lambda ctx, rank: (ctx.int_value(b.args[1]),), b.flag(2))

    @op(f"aten.{kind}.dims", f"aten::{kind}.dims_out", half=True)
    def reduce_dims(b):
        arg = b.args[1]
        if b.is_none(1):
            dims_of = lambda ctx, rank: None  # noqa: E731
        else:
            dims_of = lambda ctx, rank: ctx.int_list(arg)  # noqa: E731
        _bool_reduce(b, is_any, dims_of, b.flag(2))


_register("any")
_register("all")
