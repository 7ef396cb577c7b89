"""Shape and memory ops: views, copies, dtype casts, permute, expand, diagonal, as_strided, slice,
select, split, cat, index_select and gather.

Two ways to move data:
- a flat in-graph buffer copy (view, clone, squeeze, unsqueeze, prepack, same-storage casts): the
  live bytes move unchanged and only the live shape changes;
- one strided-copy kernel (`STRIDED_COPY`): each output element's coordinates over `sizes` give an
  input element at `in_off + sum(c_d * in_strides_d)` and an output element at
  `out_off + sum(c_d * out_strides_d)`, converting the dtype on the way. Permute, expand, diagonal,
  as_strided, slice, select, split (one dispatch per output), cat (one dispatch per input) and
  casts are all this kernel with different sizes, strides and offsets.
index_select and gather read one input coordinate from an index tensor (`INDEXED_COPY`).
Every op here takes float16 (f16 storage, 2-byte elements; a cast converts at the store) and
excludes the packed int8/uint8 bytes.

Kept as one module past 400 lines: every op here is the same two kernels with other sizes and strides.
"""

import struct

from pte_wgpu.resize.shapes import broadcast_strides, contiguous_strides, normalize_dim, numel_of

from ..registry import op
from ..wgsl import FLAT_INDEX, PACKED, SPREAD_MAIN, STRIDED, copy_bytes, elem_bytes, fill, flat_grid, flat_kernel, pack_u32x8, spread_grid, wgsl_type

INT64_MAX = 2**63 - 1

STRIDED_COPY = """
struct P { numel: u32, rank: u32, in_off: u32, out_off: u32, sizes: array<vec4<u32>, 2>,
           in_strides: array<vec4<u32>, 2>, out_strides: array<vec4<u32>, 2> }
@group(0) @binding(0) var<storage, read> src: array<$TI>;
@group(0) @binding(1) var<storage, read_write> dst: array<$TO>;
@group(0) @binding(2) var<uniform> p: P;
$FLAT_INDEX
$STRIDED
$MAIN
fn element(i: u32) {
    if (i >= p.numel) { return; }
    // rank 0: both sides contiguous, no coordinates
    let o = strided_offsets(i, p.rank, p.sizes, p.in_strides, p.out_strides, p.out_strides);
    let x = src[p.in_off + o.x];
    dst[p.out_off + o.y] = $CONVERT;
}
"""

# out[c] = src[c with c[dim] replaced by idx[sum(c_d * idx_strides_d)]]; a negative index counts
# from the end of the input's `dim`. in_strides[dim] is 0 (dim_stride holds it).
INDEXED_COPY = flat_kernel(
    """numel: u32, rank: u32, dim_stride: u32, dim_size: u32, sizes: array<vec4<u32>, 2>,
           in_strides: array<vec4<u32>, 2>, idx_strides: array<vec4<u32>, 2>""",
    [("src", "$T", "read"), ("idx", "i32", "read"), ("dst", "$T", "read_write")],
    """
    let o = strided_offsets(i, p.rank, p.sizes, p.in_strides, p.idx_strides, p.idx_strides);
    var k = idx[o.y];
    if (k < 0) { k = k + i32(p.dim_size); }
    let kk = min(u32(max(k, 0)), p.dim_size - 1u);
    dst[i] = src[o.x + kk * p.dim_stride];
""",
    count="numel",
    functions=STRIDED,
)

PARAMS_SIZE = 16 + 3 * 32


def _convert(ti, to, quads=False):
    """The WGSL converting element x of type `ti` to `to` (`quads`: x a vec4 of them)."""
    if ti == to:
        return "x"
    of = (lambda t: f"vec4<{t}>") if quads else (lambda t: t)  # noqa: E731
    if to == "u32":  # bool
        return f"select({of('u32')}(0u), {of('u32')}(1u), x != {of(ti)}(0))"
    return f"{of(to)}(x)"


def _dim(b, dim, rank):
    try:
        return normalize_dim(dim, rank)
    except IndexError as e:
        b.fail(f"{e}")


def _dtype(b, vid):
    return b.graph.values[vid].dtype


# -- flat copies -----------------------------------------------------------------------------------


def flat_copy(b, src, live_shape):
    """Copy the live bytes of `src` into the output; `live_shape(ctx, in_dims)` gives its shape.
    Across storage types (a float32 method input read by a view inside a force_fp16 delegate) it is
    one converting strided copy instead."""
    ti, to = _dtype(b, src), _dtype(b, b.out)
    same = (wgsl_type(ti), elem_bytes(ti)) == (wgsl_type(to), elem_bytes(to))
    if same:
        d = b.copy(src, b.out)
    else:
        set_copy = strided_copy(b, src, b.out)
    rank = len(b.graph.values[b.out].dims)

    def resize(ctx):
        dims = ctx.dims(src)
        shape = tuple(live_shape(ctx, dims))
        n = numel_of(dims)
        if numel_of(shape) != n or len(shape) != rank:
            b.fail(f"input shape {dims} cannot become {shape} (output rank {rank})")
        ctx.set_dims(b.out, shape)
        if same:
            ctx.set_grid(d, (copy_bytes(n, ti), 1, 1))
        else:
            set_copy(ctx, (n,), (1,))

    b.hook(resize)


def _same(ctx, dims):
    return dims


@op(
    "et_vk.prepack.default",
    "aten.clone.default",
    "aten.alias_copy.default",
    "dim_order_ops._clone_dim_order.default",
    "aten::clone.out",
    "aten::alias_copy.out",
    "dim_order_ops::_clone_dim_order.out",
    half=True,
    capacity=True,
)
def clone(b):
    flat_copy(b, b.args[0], _same)


@op("aten.copy.default", half=True, capacity=True)
def copy(b):
    """`self.copy_(src)` as the partitioner takes it: src has self's dtype and shape."""
    flat_copy(b, b.args[1], _same)


@op("aten::copy.out", half=True, capacity=True)
def copy_out(b):
    """[self, src, non_blocking, out]: src broadcast to self's shape, in self's dtype."""
    base, src = b.args[0], b.args[1]
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        dims, have = ctx.dims(base), ctx.dims(src)
        try:
            strides = broadcast_strides(have, dims)
        except ValueError:
            b.fail(f"cannot copy shape {list(have)} into shape {list(dims)}")
        set_copy(ctx, dims, strides)
        ctx.set_dims(b.out, dims)

    b.hook(resize)


MEMORY_VIEW = "pte_wgpu.memory_view"


@op(MEMORY_VIEW, half=True, capacity=True)
def memory_view(b):
    """[base, view]: a static view that ExecuTorch's memory planning folded into its base's memory,
    no instruction between them (async_runtime/program/graph.py): the base's bytes as the view's
    shape."""
    shape = b.graph.values[b.out].dims
    flat_copy(b, b.args[0], lambda ctx, dims: shape)


@op("aten.view_copy.default", "aten::view_copy.out", "executorch_prim::et_view.default", half=True, capacity=True)
def view_copy(b):
    """[x, size, out]; et_view is the view of a live shape that ExecuTorch's memory planning leaves
    as an instruction (a static one it folds into the base's memory: memory_view)."""
    size_arg = b.args[1]

    def live_shape(ctx, dims):
        size = list(ctx.int_list(size_arg))
        if size.count(-1) > 1:
            b.fail(f"more than one -1 in {size}")
        if -1 in size:
            rest = numel_of(s for s in size if s != -1)
            if rest == 0 or numel_of(dims) % rest:
                b.fail(f"size {size} does not fit input shape {dims}")
            size[size.index(-1)] = numel_of(dims) // rest
        return size

    flat_copy(b, b.args[0], live_shape)


def _squeeze(b, dims_of):
    out_rank = len(b.graph.values[b.out].dims)

    def live_shape(ctx, dims):
        picked = {_dim(b, d, len(dims)) for d in dims_of(ctx, dims)}
        shape = [s for k, s in enumerate(dims) if not (k in picked and s == 1)]
        if len(shape) != out_rank:
            b.fail(f"squeezing {sorted(picked)} of live shape {dims} gives rank {len(shape)}, expected {out_rank}")
        return shape

    flat_copy(b, b.args[0], live_shape)


@op("aten.squeeze_copy.dims", "aten::squeeze_copy.dims_out", half=True, capacity=True)
def squeeze_dims(b):
    _squeeze(b, lambda ctx, dims: ctx.int_list(b.args[1]))


@op("aten.squeeze_copy.dim", "aten::squeeze_copy.dim_out", half=True, capacity=True)
def squeeze_dim(b):
    _squeeze(b, lambda ctx, dims: (ctx.int_value(b.args[1]),))


@op("aten.squeeze_copy.default", "aten::squeeze_copy.out", half=True, capacity=True)
def squeeze_all(b):
    # The dims that were 1 at export (the maximum shape) are the ones squeezed.
    static = [k for k, s in enumerate(b.tensor(0).dims) if s == 1]
    _squeeze(b, lambda ctx, dims: static)


@op("aten.unsqueeze_copy.default", "aten::unsqueeze_copy.out", half=True, capacity=True)
def unsqueeze(b):
    def live_shape(ctx, dims):
        d = _dim(b, ctx.int_value(b.args[1]), len(dims) + 1)
        return dims[:d] + (1,) + dims[d:]

    flat_copy(b, b.args[0], live_shape)


# -- the strided copy ------------------------------------------------------------------------------


def _in_quads(sizes, in_strides, out_strides, in_off, out_off):
    """Whether a strided copy moves whole vec4s: 4 neighbours along the last dim, contiguous on both
    sides, at offsets and strides that are multiples of 4 elements."""
    if not sizes or sizes[-1] % 4 or in_strides[-1] != 1 or out_strides[-1] != 1:
        return False
    return all(v % 4 == 0 for v in (in_off, out_off, *in_strides[:-1], *out_strides[:-1]))


def strided_copy(b, src, dst):
    """Record the strided-copy dispatches from `src` into `dst` (one per element, and one per vec4
    of the last dim where both tensors hold at least one); returns a setter for the hook:
    `set(ctx, sizes, in_strides, in_off=0, out_strides=None, out_off=0)` (contiguous output by
    default). The vec4 kernel takes the copies that `_in_quads` allows (a permute, slice or cat
    that keeps the last dim whole, and contiguous copies): its per-element coordinates, a division
    and a remainder a dim, bound such copies, and it computes them once for 4 elements."""
    ti, to = _dtype(b, src), _dtype(b, dst)
    if ti in PACKED or to in PACKED:
        raise NotImplementedError(f"{b.name}: strided copies of packed {ti} -> {to} tensors")
    t_in, t_out = wgsl_type(ti), wgsl_type(to)

    def dispatch(quads):
        types = dict(TI=f"vec4<{t_in}>", TO=f"vec4<{t_out}>") if quads else dict(TI=t_in, TO=t_out)
        shader = fill(STRIDED_COPY, **types, CONVERT=_convert(t_in, t_out, quads), MAIN=SPREAD_MAIN, FLAT_INDEX=FLAT_INDEX, STRIDED=STRIDED)
        return b.dispatch(shader, [src, dst, params])

    params = b.params(PARAMS_SIZE)
    d = dispatch(False)
    q = dispatch(True) if min(numel_of(b.graph.values[v].dims) for v in (src, dst)) >= 4 else None

    def set_copy(ctx, sizes, in_strides, in_off=0, out_strides=None, out_off=0):
        if out_strides is None:
            out_strides = contiguous_strides(sizes)
        n = numel_of(sizes)
        contiguous = tuple(in_strides) == tuple(out_strides) == tuple(contiguous_strides(sizes))
        quads = q is not None and n > 0 and _in_quads(sizes, in_strides, out_strides, in_off, out_off)
        if quads:
            sizes = (*sizes[:-1], sizes[-1] // 4)
            in_strides, out_strides = [s // 4 for s in in_strides[:-1]] + [1], [s // 4 for s in out_strides[:-1]] + [1]
            n, in_off, out_off = n // 4, in_off // 4, out_off // 4
        try:
            data = struct.pack("<4I", n, 0 if contiguous else len(sizes), in_off, out_off)
            data += pack_u32x8(sizes) + pack_u32x8(in_strides) + pack_u32x8(out_strides)
        except ValueError as e:
            b.fail(str(e))
        ctx.set_params(params, data)
        ctx.set_grid(d, (0, 0, 0) if quads else spread_grid(n))
        if q is not None:
            ctx.set_grid(q, spread_grid(n) if quads else (0, 0, 0))

    return set_copy


@op("aten._to_copy.default", "dim_order_ops._to_dim_order_copy.default", "aten::_to_copy.out",
    "dim_order_ops::_to_dim_order_copy.out", half=True, capacity=True)  # fmt: skip
def to_copy(b):
    flat_copy(b, b.args[0], _same)


def _permuted(b, perm_of):
    """Record out = src with its dims reordered by `perm_of(ctx, rank)`."""
    src = b.args[0]
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        dims = ctx.dims(src)
        perm = perm_of(ctx, len(dims))
        strides = contiguous_strides(dims)
        shape = tuple(dims[p] for p in perm)
        set_copy(ctx, shape, [strides[p] for p in perm])
        ctx.set_dims(b.out, shape)

    b.hook(resize)


@op("aten.permute_copy.default", "aten.permute.default", "aten::permute_copy.out", half=True, capacity=True)
def permute_copy(b):
    def perm_of(ctx, rank):
        perm = [_dim(b, p, rank) for p in ctx.int_list(b.args[1])]
        if sorted(perm) != list(range(rank)):
            b.fail(f"{list(ctx.int_list(b.args[1]))} is not a permutation of rank {rank}")
        return perm

    _permuted(b, perm_of)


@op("aten.t_copy.default", "aten::t_copy.out", half=True, capacity=True)
def t_copy(b):
    """The transpose of a matrix; a vector or a scalar is copied as it is."""

    def perm_of(ctx, rank):
        if rank > 2:
            b.fail(f"expects a tensor of at most 2 dims, got rank {rank}")
        return list(range(rank))[::-1]

    _permuted(b, perm_of)


@op("aten.expand_copy.default", "aten::expand_copy.out", half=True, capacity=True)
def expand_copy(b):
    src = b.args[0]
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        dims = ctx.dims(src)
        size = ctx.int_list(b.args[1])
        pad = len(size) - len(dims)
        if pad < 0:
            b.fail(f"cannot expand shape {dims} to {list(size)}")
        shape = []
        for k, s in enumerate(size):
            have = dims[k - pad] if k >= pad else None
            if s == -1:
                if have is None:
                    b.fail(f"-1 in a new leading dim of {list(size)}")
                s = have
            if have not in (None, 1, s) or s < 1:
                b.fail(f"cannot expand shape {dims} to {list(size)}")
            shape.append(s)
        set_copy(ctx, shape, broadcast_strides(dims, shape))
        ctx.set_dims(b.out, shape)

    b.hook(resize)


@op("aten.diagonal_copy.default", "aten::diagonal_copy.out", half=True, capacity=True)
def diagonal_copy(b):
    """[self, offset, dim1, dim2, out]: the diagonal of dims dim1 and dim2 (above the main one by
    `offset`, below it if negative) as the last dim, after the others in order."""
    src = b.args[0]
    offset = int(b.scalar(1, 0))
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        dims = ctx.dims(src)
        d1, d2 = _dim(b, b.scalar(2, 0), len(dims)), _dim(b, b.scalar(3, 1), len(dims))
        if d1 == d2:
            b.fail(f"dims {d1} and {d2} are the same dim, expected two")
        strides = contiguous_strides(dims)
        length = max(min(dims[d1], dims[d2] - offset) if offset >= 0 else min(dims[d1] + offset, dims[d2]), 0)
        if length == 0:
            b.fail(f"offset {offset} leaves no diagonal of dims {d1} and {d2} of shape {list(dims)} (empty tensors are not supported)")
        rest = [k for k in range(len(dims)) if k not in (d1, d2)]
        shape = [dims[k] for k in rest] + [length]
        start = offset * strides[d2] if offset >= 0 else -offset * strides[d1]
        set_copy(ctx, shape, [strides[k] for k in rest] + [strides[d1] + strides[d2]], start)
        ctx.set_dims(b.out, shape)

    b.hook(resize)


@op("aten.as_strided_copy.default", "aten::as_strided_copy.out", half=True)
def as_strided_copy(b):
    """[self, size, stride, storage_offset, out]: the elements of self's contiguous storage at
    storage_offset + sum(c_d * stride_d), as a tensor of `size`."""
    src = b.args[0]
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        size, stride = list(ctx.int_list(b.args[1])), list(ctx.int_list(b.args[2]))
        start = int(b.scalar(3, 0))
        have = numel_of(ctx.dims(src))
        if len(size) != len(stride) or min(size, default=1) < 1 or min(stride, default=0) < 0:
            b.fail(f"size {size} with stride {stride}: expected one positive size and non-negative stride a dim")
        last = start + sum((n - 1) * st for n, st in zip(size, stride))
        if start < 0 or last >= have:
            b.fail(f"size {size}, stride {stride} and offset {start} reach element {last} of a tensor of {have}")
        set_copy(ctx, size, stride, start)
        ctx.set_dims(b.out, size)

    b.hook(resize)


def _slice_bounds(start, end, step, size):
    """torch's clamping of a slice; returns (start, length)."""
    start = 0 if start is None else start
    end = size if end is None or end >= INT64_MAX else end
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, (end - start + step - 1) // step


def _slice(b, ctx, dims, first):
    """(dim, start, step, shape) of the live slice of `dims` that the op's arguments dim, start,
    end and an optional step (from argument `first` on) name."""
    dim = _dim(b, ctx.int_value(b.args[first]), len(dims))
    step = ctx.int_value(b.args[first + 3]) if len(b.args) > first + 4 else 1
    step = 1 if step is None else step
    if step < 1:
        b.fail(f"step {step} must be positive")
    start, length = _slice_bounds(ctx.int_value(b.args[first + 1]), ctx.int_value(b.args[first + 2]), step, dims[dim])
    shape = list(dims)
    shape[dim] = length
    return dim, start, step, shape


@op("aten.slice_copy.Tensor", "aten::slice_copy.Tensor_out", half=True, capacity=True)
def slice_copy(b):
    src = b.args[0]
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        dims = ctx.dims(src)
        dim, start, step, shape = _slice(b, ctx, dims, 1)
        if shape[dim] < 1:
            b.fail(f"empty slice of dim {dim} (size {dims[dim]}) is not supported")
        strides = list(contiguous_strides(dims))
        off = start * strides[dim]
        strides[dim] *= step
        set_copy(ctx, shape, strides, off)
        ctx.set_dims(b.out, shape)

    b.hook(resize)


@op("aten.slice_scatter.default", "aten::slice_scatter.out", half=True, capacity=True)
def slice_scatter(b):
    """out = self with src written over self[start:end:step] along dim (the functional form of an
    in-place slice assignment, as a model's state update `state[:n].copy_(new)` exports): a copy of
    self, then src copied into the slice."""
    base, src = b.args[0], b.args[1]
    set_base, set_src = strided_copy(b, base, b.out), strided_copy(b, src, b.out)

    def resize(ctx):
        dims = ctx.dims(base)
        dim, start, step, shape = _slice(b, ctx, dims, 2)
        if tuple(ctx.dims(src)) != tuple(shape):
            b.fail(f"src of shape {list(ctx.dims(src))} for a slice of shape {shape} of self {list(dims)}")
        strides = contiguous_strides(dims)
        set_base(ctx, dims, strides)
        out_strides = list(strides)
        out_strides[dim] *= step
        set_src(ctx, shape, contiguous_strides(shape), 0, out_strides, start * strides[dim])
        ctx.set_dims(b.out, dims)

    b.hook(resize)


@op("aten::copy_", half=True, capacity=True)
def copy_(b):
    """self.copy_(src) of a program's mutable buffer: src's elements into self, whose shape they keep
    (an equal element count; no broadcast). Onto itself (an update linking made in place:
    async_runtime/program/graph.py's _index_put_in_place) nothing runs."""
    base = b.args[0]
    if b.args[1] == base:
        b.hook(lambda ctx: None)
        return
    flat_copy(b, b.args[1], lambda ctx, dims: ctx.dims(base))


@op("aten.select_copy.int", "aten::select_copy.int_out", half=True, capacity=True)
def select_copy(b):
    src = b.args[0]
    set_copy = strided_copy(b, src, b.out)

    def resize(ctx):
        dims = ctx.dims(src)
        dim = _dim(b, ctx.int_value(b.args[1]), len(dims))
        index = ctx.int_value(b.args[2])
        if index < 0:
            index += dims[dim]
        if not 0 <= index < dims[dim]:
            b.fail(f"index {ctx.int_value(b.args[2])} out of range for dim {dim} of size {dims[dim]}")
        strides = contiguous_strides(dims)
        shape = dims[:dim] + dims[dim + 1 :]
        set_copy(ctx, shape, strides[:dim] + strides[dim + 1 :], index * strides[dim])
        ctx.set_dims(b.out, shape)

    b.hook(resize)


def _split(b, sizes_of):
    """One strided copy per output; `sizes_of(ctx, n)` gives the split sizes of a dim of size n."""
    src = b.args[0]
    outs = b.graph.values[b.out].items
    setters = [strided_copy(b, src, o) for o in outs]

    def resize(ctx):
        dims = ctx.dims(src)
        dim = _dim(b, ctx.int_value(b.args[2]), len(dims))
        sizes = list(sizes_of(ctx, dims[dim]))
        if len(sizes) != len(outs) or sum(sizes) != dims[dim] or min(sizes) < 1:
            b.fail(f"split sizes {sizes} of dim {dim} (live size {dims[dim]}) for {len(outs)} outputs")
        strides = contiguous_strides(dims)
        at = 0
        for o, n, set_copy in zip(outs, sizes, setters):
            shape = dims[:dim] + (n,) + dims[dim + 1 :]
            set_copy(ctx, shape, strides, at * strides[dim])
            ctx.set_dims(o, shape)
            at += n

    b.hook(resize)


@op("aten.split_with_sizes_copy.default", "aten::split_with_sizes_copy.out", half=True, capacity=True)
def split_with_sizes_copy(b):
    _split(b, lambda ctx, n: ctx.int_list(b.args[1]))


@op("aten.split_copy.Tensor", "aten::split_copy.Tensor_out", half=True, capacity=True)
def split_copy(b):
    def sizes_of(ctx, n):
        step = ctx.int_value(b.args[1])
        if step < 1:
            b.fail(f"split size {step} must be positive")
        return [min(step, n - k) for k in range(0, n, step)]

    _split(b, sizes_of)


@op("aten.cat.default", "aten::cat.out", half=True, capacity=True)
def cat(b):
    ins = b.graph.values[b.args[0]].items
    setters = [strided_copy(b, i, b.out) for i in ins]

    def resize(ctx):
        shapes = [ctx.dims(i) for i in ins]
        rank = len(shapes[0])
        dim = _dim(b, ctx.int_value(b.args[1]), rank)
        for s in shapes:
            if len(s) != rank or s[:dim] != shapes[0][:dim] or s[dim + 1 :] != shapes[0][dim + 1 :]:
                b.fail(f"cannot concatenate shapes {shapes} along dim {dim}")
        shape = shapes[0][:dim] + (sum(s[dim] for s in shapes),) + shapes[0][dim + 1 :]
        out_strides = contiguous_strides(shape)
        at = 0
        for s, set_copy in zip(shapes, setters):
            set_copy(ctx, s, contiguous_strides(s), 0, out_strides, at * out_strides[dim])
            at += s[dim]
        ctx.set_dims(b.out, shape)

    b.hook(resize)


# -- indexed copies --------------------------------------------------------------------------------


def indexed_copy(b, src, index, dim_arg, out_shape_of, idx_strides_of):
    """out[c] = src[c with c[dim] <- index[c . idx_strides]]."""
    t, to = _dtype(b, src), _dtype(b, b.out)
    if t in PACKED or wgsl_type(t) != wgsl_type(to) or wgsl_type(_dtype(b, index)) != "i32":
        raise NotImplementedError(f"{b.name}: {t} source, {_dtype(b, index)} index, {to} output")
    shader = fill(INDEXED_COPY, T=wgsl_type(t))
    params = b.params(PARAMS_SIZE)
    d = b.dispatch(shader, [src, index, b.out, params])

    def resize(ctx):
        dims, idims = ctx.dims(src), ctx.dims(index)
        dim = _dim(b, ctx.int_value(dim_arg), len(dims))
        shape = tuple(out_shape_of(dims, idims, dim))
        n = numel_of(shape)
        in_strides = contiguous_strides(dims)
        head = struct.pack("<4I", n, len(shape), in_strides[dim], dims[dim])
        data = head + pack_u32x8(shape) + pack_u32x8([0 if k == dim else s for k, s in enumerate(in_strides)])
        ctx.set_params(params, data + pack_u32x8(idx_strides_of(shape, dim)))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, shape)

    b.hook(resize)


@op("aten.index_select.default", "aten::index_select.out", half=True, capacity=True)
def index_select(b):
    def out_shape(dims, idims, dim):
        if len(idims) > 1:
            b.fail(f"index of shape {idims} must be 1-D")
        return dims[:dim] + (numel_of(idims),) + dims[dim + 1 :]

    def idx_strides(shape, dim):
        return [1 if k == dim else 0 for k in range(len(shape))]

    indexed_copy(b, b.args[0], b.args[2], b.args[1], out_shape, idx_strides)


@op("aten.gather.default", "aten::gather.out", half=True, capacity=True)
def gather(b):
    def out_shape(dims, idims, dim):
        if len(idims) != len(dims) or any(i > s for k, (i, s) in enumerate(zip(idims, dims)) if k != dim):
            b.fail(f"index shape {idims} does not fit input shape {dims} along dim {dim}")
        return idims

    indexed_copy(b, b.args[0], b.args[2], b.args[1], out_shape, lambda shape, dim: contiguous_strides(shape))
