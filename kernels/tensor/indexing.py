"""Indexing and scattering: `aten.index.Tensor` (`self[i0, i1, ...]` with a list of optional index
tensors), its mirror `index_put` (`self[i0, i1, ...] = values`, or `+=`), `scatter`, `scatter_add`
and `masked_scatter`.

The index tensors broadcast together to a shape B. When the indexed dims are adjacent the indexed
shape is `self.shape[:first] + B + self.shape[last + 1:]`; otherwise B comes first, followed by
the non-indexed dims in order (NumPy's rule). One kernel template walks that shape for every
case: each coordinate contributes to the offset into self either directly (a non-indexed dim,
through `in_strides`) or through the index tensors (a B dim, through each index tensor's broadcast
strides); each index value, wrapped if negative and clamped, is multiplied by its dim's stride.
`index` gathers `self` at that offset; `index_put` copies `self`, then writes `values` there.
Bool (mask) index tensors would need a data-dependent shape and are not supported.

index_put's accumulation is deterministic and in index order, as torch's CPU kernel sums: each
entry of B gets its target (the same template, storing the offset), then its link to the next
entry of the same target; the first entry of each target sums the chain onto `self`'s element.
WGSL has no float atomics, and this orders the sum. scatter and scatter_add gather instead: each
output element walks the line of `index` along `dim` that could name it, in order (the last write
wins for scatter, every match is summed for scatter_add; a negative index wraps, one out of range
names no element). Simple rather than fast for large index tensors: the links cost B^2
comparisons, the scatters' gather an output element times the line's length.
"""

import math
import struct

from pte_wgpu.resize.shapes import broadcast_shapes, broadcast_strides, contiguous_strides, normalize_dim, numel_of
from pte_wgpu.resize.values import Scalar, Tensor

from ..registry import op
from ..wgsl import PACKED, STRIDED, copy_bytes, fill, flat_grid, flat_kernel, pack_u32x8, rounded, wgsl_type

MAX_INDICES = 8

INDEX_FIELDS = """numel: u32, rank: u32, count: u32, brank: u32, sizes: array<vec4<u32>, 2>,
           in_strides: array<vec4<u32>, 2>, dim_sizes: array<vec4<u32>, 2>, dim_strides: array<vec4<u32>, 2>,
           idx_strides: array<array<vec4<u32>, 2>, $N>$EXTRA"""
WRAP = """
fn wrap(k: i32, j: u32) -> u32 {
    let size = at8(p.dim_sizes, j);
    var kk = k;
    if (kk < 0) { kk = kk + i32(size); }
    return min(u32(max(kk, 0)), size - 1u) * at8(p.dim_strides, j);
}"""
INDEX_BODY = """
    var rem = i;
    var off = 0u;
$ZERO
    for (var d = i32(p.rank) - 1; d >= 0; d = d - 1) {
        let size = at8(p.sizes, u32(d));
        let c = rem % size;
        rem = rem / size;
        off = off + c * at8(p.in_strides, u32(d));
$ACCUM
    }
$GATHER
$STORE
"""

# index_put with accumulate: `ov` is the element's offset into values, `oj` its entry of B; `vb(k)`
# the part of values' offset that entry k of B gives. chain[k] >= 0 for the first entry of its
# target, then it is the next entry of that target (p.count: none); -1 - next for the others.
PUT_SUM = """
    if (chain[oj] < 0) { return; }
    let rest = ov - vb(oj);
    var acc = $CT(dst[off]);
    var k = oj;
    for (var s = 0u; s < p.count && k < p.count; s = s + 1u) {
        acc = $SUM;
        let link = chain[k];
        k = select(u32(-1 - link), u32(link), link >= 0);
    }
    dst[off] = $T(acc);"""
VALUES_OF_ENTRY = """
fn vb(k: u32) -> u32 { return strided_offsets(k, p.brank, p.bsizes, p.vb_strides, p.vb_strides, p.vb_strides).x; }"""
PUT_SUM_FIELDS = """, v_strides: array<vec4<u32>, 2>, j_strides: array<vec4<u32>, 2>,
           bsizes: array<vec4<u32>, 2>, vb_strides: array<vec4<u32>, 2>"""

LINKS = flat_kernel(
    "count: u32, pad0: u32, pad1: u32, pad2: u32",
    [("targets", "i32", "read"), ("chain", "i32", "read_write")],
    """
    let t = targets[i];
    var first = true;
    for (var k = 0u; k < i; k = k + 1u) {
        if (targets[k] == t) { first = false; break; }
    }
    var next = p.count;
    for (var k = i + 1u; k < p.count; k = k + 1u) {
        if (targets[k] == t) { next = k; break; }
    }
    chain[i] = select(-1 - i32(next), i32(next), first);
""",
    count="count",
)

# One invocation an output element: the element's coordinates off `dim` pick a line of `index`
# along `dim` (none where they pass index's extent); its entries naming the element's coordinate
# on `dim` are combined into it in order.
SCATTER_FIELDS = """numel: u32, rank: u32, dim: u32, line: u32, value: u32, pad0: u32, pad1: u32, pad2: u32,
           sizes: array<vec4<u32>, 2>, isizes: array<vec4<u32>, 2>, istrides: array<vec4<u32>, 2>, sstrides: array<vec4<u32>, 2>"""
SCATTER_BODY = """
    var rem = i;
    var at = 0u;
    var line = 0u;
    var soff = 0u;
    var inside = true;
    for (var d = i32(p.rank) - 1; d >= 0; d = d - 1) {
        let size = at8(p.sizes, u32(d));
        let c = rem % size;
        rem = rem / size;
        if (u32(d) == p.dim) {
            at = c;
        } else {
            inside = inside && c < at8(p.isizes, u32(d));
            line = line + c * at8(p.istrides, u32(d));
            soff = soff + c * at8(p.sstrides, u32(d));
        }
    }
    var acc = $CT(base[i]);
    if (inside) {
        let size = i32(at8(p.sizes, p.dim));
        for (var l = 0u; l < p.line; l = l + 1u) {
            var k = index[line + l * at8(p.istrides, p.dim)];
            if (k < 0) { k = k + size; }
            if (k == i32(at)) { acc = $COMBINE; }
        }
    }
    dst[i] = $T(acc);
"""

# masked_scatter walks the elements in chunks, one invocation a chunk: the first pass counts each
# chunk's set mask elements, the second starts from the sum of the chunks before its own.
MASKED_FIELDS = """numel: u32, rank: u32, chunk: u32, chunks: u32, source: u32, pad0: u32, pad1: u32, pad2: u32,
           sizes: array<vec4<u32>, 2>, mstrides: array<vec4<u32>, 2>"""
MASKED_CHUNK = """
    let first = c * p.chunk;
    let last = min(first + p.chunk, p.numel);
    var k = 0u;
$START
    for (var e = first; e < last; e = e + 1u) {
        let on = mask[strided_offsets(e, p.rank, p.sizes, p.mstrides, p.mstrides, p.mstrides).x] != 0u;
$STEP
        k = k + select(0u, 1u, on);
    }
$END"""
MASK_COUNT = dict(START="", STEP="", END="    counts[c] = i32(k);")
MASK_WRITE = dict(
    START="    for (var q = 0u; q < c; q = q + 1u) { k = k + u32(counts[q]); }",
    STEP="        if (on && k < p.source) { dst[e] = src[k]; } else { dst[e] = base[e]; }",
    END="",
)


def _optional_tensors(b, i):
    """The entries of an optional-tensor list: a value id, or None for a missing entry (-1 or a
    None value)."""
    items = b.value(i).items
    out = []
    for vid in items:
        if vid is None or vid < 0:
            out.append(None)
            continue
        v = b.graph.values[vid]
        if isinstance(v, Scalar) and v.value is None:
            out.append(None)
        elif isinstance(v, Tensor):
            out.append(vid)
        else:
            b.fail(f"index entry {vid} is {type(v).__name__}, expected a tensor or None")
    return out


def _index_tensors(b):
    """The indexed (dim, value id) pairs of argument 1, checked: at least one, at most
    MAX_INDICES, integer."""
    entries = _optional_tensors(b, 1)
    indexed = [(d, vid) for d, vid in enumerate(entries) if vid is not None]
    if not indexed:
        b.fail("no index tensors")
    if len(indexed) > MAX_INDICES:
        raise NotImplementedError(f"{b.name}: {len(indexed)} index tensors (at most {MAX_INDICES})")
    for _, vid in indexed:
        dtype = b.graph.values[vid].dtype
        if dtype == "bool" or wgsl_type(dtype) != "i32":
            raise NotImplementedError(f"{b.name}: {dtype} index tensors (boolean masks have data-dependent shapes)")
    return entries, indexed


def _index_shader(n, bindings, store, fields="", accumulators=(), functions=""):
    """The INDEX_BODY kernel of `n` index tensors `idx0`.. ending with `store` (WGSL statements
    that use `off`); `accumulators`: more (variable, strides field) offsets summed over the walk."""
    accs = [(f"o{j}", f"p.idx_strides[{j}]") for j in range(n)] + list(accumulators)
    zero = "\n".join(f"    var {name} = 0u;" for name, _ in accs)
    accum = "\n".join(f"        {name} = {name} + c * at8({strides}, u32(d));" for name, strides in accs)
    gather = "\n".join(f"    off = off + wrap(idx{j}[o{j}], {j}u);" for j in range(n))
    body = fill(INDEX_BODY, ZERO=zero, ACCUM=accum, GATHER=gather, STORE=store)
    return flat_kernel(fill(INDEX_FIELDS, N=n, EXTRA=fields), bindings, body, count="numel", functions=STRIDED + WRAP + functions)


class Indexed:
    """The indexed shape of live `dims` (self's) under index tensors of live shapes `ishapes` at
    dims `dims_idx` (`adjacent`: consecutive): `shape`, per dim its stride into self (`in_strides`, 0
    on a B dim), each index tensor's strides (`idx_strides`, 0 off B), and B (`bshape`, at positions
    `b_pos` of `shape`)."""

    def __init__(self, b, dims, dims_idx, ishapes, adjacent):
        try:
            self.bshape = broadcast_shapes(*ishapes)
        except ValueError as e:
            b.fail(str(e))
        rank = len(dims)
        strides = contiguous_strides(dims)
        rest = [k for k in range(rank) if k not in dims_idx]
        # the indexed shape's dims: ("in", self's dim) or ("b", position in bshape)
        if adjacent:
            first = dims_idx[0]
            layout = [("in", k) for k in rest if k < first] + [("b", k) for k in range(len(self.bshape))]
            layout += [("in", k) for k in rest if k > first]
        else:
            layout = [("b", k) for k in range(len(self.bshape))] + [("in", k) for k in rest]
        self.shape = [dims[k] if kind == "in" else self.bshape[k] for kind, k in layout]
        self.in_strides = [strides[k] if kind == "in" else 0 for kind, k in layout]
        self.b_pos = [p for p, (kind, _) in enumerate(layout) if kind == "b"]
        self.ishapes = ishapes
        self.idx_strides = [self.over_shape(broadcast_strides(s, self.bshape)) for s in ishapes]
        self.dim_sizes = [dims[k] for k in dims_idx]
        self.dim_strides = [strides[k] for k in dims_idx]

    def over_shape(self, per_b):
        """Strides over B as strides over the indexed shape (0 off B)."""
        out = [0] * len(self.shape)
        for p, s in zip(self.b_pos, per_b):
            out[p] = s
        return out

    def params(self, header=(0, 0), extra=()):
        """INDEX_FIELDS' bytes for a walk of the indexed shape (`header`: count and brank), then the
        arrays of `extra`."""
        return self._walk(self.shape, self.in_strides, self.idx_strides, header, extra)

    def targets_params(self):
        """INDEX_FIELDS' bytes for a walk of B alone: each entry's offset into self."""
        per_b = [broadcast_strides(s, self.bshape) for s in self.ishapes]
        return self._walk(self.bshape, [0] * len(self.bshape), per_b)

    def _walk(self, shape, in_strides, idx_strides, header=(0, 0), extra=()):
        data = struct.pack("<4I", numel_of(shape), len(shape), *header) + pack_u32x8(shape) + pack_u32x8(in_strides)
        data += pack_u32x8(self.dim_sizes) + pack_u32x8(self.dim_strides)
        return data + b"".join(pack_u32x8(s) for s in (*idx_strides, *extra))


def _indexed_of(b, entries, indexed, src):
    """A hook's function of the live dims giving (self's dims, its `Indexed` shape)."""
    dims_idx = [d for d, _ in indexed]
    adjacent = dims_idx == list(range(dims_idx[0], dims_idx[-1] + 1))

    def indexed_of(ctx):
        dims = ctx.dims(src)
        if len(entries) > len(dims):
            b.fail(f"{len(entries)} indices for a tensor of rank {len(dims)}")
        return dims, Indexed(b, dims, dims_idx, [ctx.dims(vid) for _, vid in indexed], adjacent)

    return indexed_of


def _same_storage(b, *vids):
    """Refuse packed tensors and tensors of other storage types than the output's."""
    dtypes = [b.graph.values[v].dtype for v in (*vids, b.out)]
    if any(t in PACKED for t in dtypes) or len({wgsl_type(t) for t in dtypes}) > 1:
        raise NotImplementedError(f"{b.name}: {', '.join(dtypes)} tensors (expected one storage type, not 8-bit)")
    return wgsl_type(dtypes[-1])


def _sum_type(b, t, *vids):
    """The WGSL type sums of storage type `t` run in (f32 for floats); bool sums are refused."""
    if any(b.graph.values[v].dtype == "bool" for v in vids):
        raise NotImplementedError(f"{b.name}: sums of bool tensors")
    return "f32" if t in ("f32", "f16") else t


@op("aten.index.Tensor", "aten::index.Tensor_out", half=True)
def index(b):
    src = b.args[0]
    entries, indexed = _index_tensors(b)
    t = _same_storage(b, src)
    n = len(indexed)
    bindings = [("src", t, "read"), *((f"idx{j}", "i32", "read") for j in range(n)), ("dst", t, "read_write")]
    shader = _index_shader(n, bindings, "    dst[i] = src[off];")
    params = b.params(16 + 4 * 32 + n * 32)
    d = b.dispatch(shader, [src] + [vid for _, vid in indexed] + [b.out, params])
    out_rank = len(b.graph.values[b.out].dims)
    indexed_of = _indexed_of(b, entries, indexed, src)

    def resize(ctx):
        dims, ix = indexed_of(ctx)
        if len(ix.shape) != out_rank:
            b.fail(f"indexing live shape {dims} with index shapes {ix.ishapes} gives rank {len(ix.shape)}, expected {out_rank}")
        ctx.set_params(params, ix.params())
        ctx.set_grid(d, flat_grid(numel_of(ix.shape)))
        ctx.set_dims(b.out, ix.shape)

    b.hook(resize)


def _max_broadcast(shapes):
    """The largest element count that shapes of at most these dims broadcast to."""
    rank = max((len(s) for s in shapes), default=0)
    return math.prod(max((s[k - rank + len(s)] for s in shapes if k - rank + len(s) >= 0), default=1) for k in range(rank))


@op("aten::index_put.out", "aten::index_put_", half=True)
def index_put(b):
    """out = self with out[indices] = values (broadcast to the indexed shape), or += with
    accumulate (index_put_: self itself, out being self): a copy of self, then one invocation an
    element of the indexed shape writes it
    (duplicate indices without accumulate: one of them wins, which one left open as torch leaves it;
    a GPU's invocations race for it). With accumulate, the
    entries' targets and links first, and only the first entry of a target sums (module docstring)."""
    base, values = b.args[0], b.args[2]
    entries, indexed = _index_tensors(b)
    t = _same_storage(b, base, values)
    accumulate = bool(b.scalar(3, False))
    n = len(indexed)
    idx = [vid for _, vid in indexed]
    copy = None
    if base == b.out:  # index_put_: self written in place, what it held kept (a buffer carried between calls)
        b.reads(base)
    else:
        copy = b.copy(base, b.out)
    bindings = [("src", t, "read"), *((f"idx{j}", "i32", "read") for j in range(n))]
    if accumulate:
        ct = _sum_type(b, t, base)
        entries_cap = _max_broadcast([b.graph.values[v].dims for v in idx])
        targets, chain = b.scratch("int32", entries_cap), b.scratch("int32", entries_cap)
        shader = _index_shader(n, [*bindings[1:], ("dst", "i32", "read_write")], "    dst[i] = i32(off);")
        target_params = b.params(16 + 4 * 32 + n * 32)
        find = b.dispatch(shader, [*idx, targets, target_params])
        link_params = b.params(16)
        link = b.dispatch(LINKS, [targets, chain, link_params])
        total = f"acc + {ct}(src[rest + vb(k)])"
        # each sum rounded to the storage type (f16 too), as torch's CPU index_put adds in it
        store = fill(PUT_SUM, CT=ct, T=t, SUM=rounded(total, t) if ct == "f32" else total)
        bindings += [("chain", "i32", "read"), ("dst", t, "read_write")]
        accumulators = [("ov", "p.v_strides"), ("oj", "p.j_strides")]
        shader = _index_shader(n, bindings, store, PUT_SUM_FIELDS, accumulators, VALUES_OF_ENTRY)
        params = b.params(16 + 4 * 32 + n * 32 + 4 * 32)
        put = b.dispatch(shader, [values, *idx, chain, b.out, params])
    else:
        bindings.append(("dst", t, "read_write"))
        shader = _index_shader(n, bindings, "    dst[off] = src[ov];", ", v_strides: array<vec4<u32>, 2>", [("ov", "p.v_strides")])
        params = b.params(16 + 4 * 32 + n * 32 + 32)
        put = b.dispatch(shader, [values, *idx, b.out, params])
    dtype = b.graph.values[base].dtype
    indexed_of = _indexed_of(b, entries, indexed, base)

    def resize(ctx):
        dims, ix = indexed_of(ctx)
        vdims = ctx.dims(values)
        try:
            fits = list(broadcast_shapes(vdims, ix.shape)) == list(ix.shape)
        except ValueError:
            fits = False
        if not fits:
            b.fail(f"values of shape {list(vdims)} do not broadcast to the indexed shape {ix.shape} of self {list(dims)}")
        v_strides = broadcast_strides(vdims, ix.shape)
        count = numel_of(ix.bshape)
        if copy is not None:
            ctx.set_grid(copy, (copy_bytes(numel_of(dims), dtype), 1, 1))
        if accumulate:
            ctx.set_params(target_params, ix.targets_params())
            ctx.set_params(link_params, struct.pack("<4I", count, 0, 0, 0))
            j_strides = ix.over_shape(contiguous_strides(ix.bshape))
            vb_strides = [v_strides[p] for p in ix.b_pos]
            ctx.set_params(params, ix.params((count, len(ix.bshape)), (v_strides, j_strides, ix.bshape, vb_strides)))
            ctx.set_grid(find, flat_grid(count))
            ctx.set_grid(link, flat_grid(count))
        else:
            ctx.set_params(params, ix.params(extra=(v_strides,)))
        ctx.set_grid(put, flat_grid(numel_of(ix.shape)))
        ctx.set_dims(b.out, dims)

    b.hook(resize)


def _scatter(b, src=None, value=None, add=False):
    """out = self with the entries of index (args[2]) along dim (args[1]) written into it in order
    (the last wins), or summed onto it with `add`: src's elements (`src`), or the scalar `value`."""
    base, index_vid = b.args[0], b.args[2]
    if b.graph.values[index_vid].dtype == "bool" or b.storage(index_vid) != "i32":
        b.fail(f"index of dtype {b.graph.values[index_vid].dtype}, expected int64 or int32")
    t = _same_storage(b, base) if src is None else _same_storage(b, base, src)
    ct = _sum_type(b, t, base) if add else "f32" if t in ("f32", "f16") else t
    entry = f"{ct}(src[soff + l * at8(p.sstrides, p.dim)])" if src is not None else f"bitcast<{ct}>(p.value)"
    combine = f"acc + {entry}" if add else entry  # in f32 for f16 tensors, rounded once, as torch's CPU kernel sums
    bindings = [("base", t, "read"), ("index", "i32", "read"), *([("src", t, "read")] if src is not None else []), ("dst", t, "read_write")]
    shader = flat_kernel(SCATTER_FIELDS, bindings, fill(SCATTER_BODY, CT=ct, T=t, COMBINE=combine), count="numel", functions=STRIDED)
    params = b.params(32 + 4 * 32)
    d = b.dispatch(shader, [base, index_vid, *([src] if src is not None else []), b.out, params])
    bits = bytes(4)
    if value is not None:
        bits = struct.pack("<f", value) if ct == "f32" else struct.pack("<i" if ct == "i32" else "<I", int(value))

    def resize(ctx):
        dims, idims = ctx.dims(base), ctx.dims(index_vid)
        sdims = ctx.dims(src) if src is not None else idims
        if not len(idims) == len(dims) == len(sdims):
            b.fail(f"index of rank {len(idims)}, self of rank {len(dims)}, src of rank {len(sdims)}: expected one rank")
        try:
            dim = normalize_dim(ctx.int_value(b.args[1]), len(dims))
        except IndexError as e:
            b.fail(str(e))
        dims, idims, sdims = dims or (1,), idims or (1,), sdims or (1,)  # a 0-d scatter as a 1-d one
        if any(i > s for i, s in zip(idims, sdims)) or any(i > s for k, (i, s) in enumerate(zip(idims, dims)) if k != dim):
            b.fail(f"index of shape {list(idims)} is larger than src {list(sdims)}, or than self {list(dims)} off dim {dim}")
        data = struct.pack("<4I", numel_of(dims), len(dims), dim, idims[dim]) + bits + bytes(12)
        data += pack_u32x8(dims) + pack_u32x8(idims) + pack_u32x8(contiguous_strides(idims)) + pack_u32x8(contiguous_strides(sdims))
        ctx.set_params(params, data)
        ctx.set_grid(d, flat_grid(numel_of(dims)))
        ctx.set_dims(b.out, ctx.dims(base))

    b.hook(resize)


@op("aten::scatter.src_out", half=True, capacity=True)
def scatter_src(b):
    _scatter(b, src=b.args[3])


@op("aten::scatter.value_out", half=True, capacity=True)
def scatter_value(b):
    _scatter(b, value=b.scalar(3))


@op("aten::scatter_add.out", half=True, capacity=True)
def scatter_add(b):
    _scatter(b, src=b.args[3], add=True)


@op("aten::masked_scatter.out", half=True)
def masked_scatter(b):
    """out[i] = source[k] where mask[i] (broadcast to self) is the k-th set element in row-major
    order, else self[i]: chunks of about sqrt(n) elements, counted, then written (MASKED_CHUNK). Where
    source has too few elements, the rest keep self's."""
    base, mask, source = b.args[0], b.args[1], b.args[2]
    if b.graph.values[mask].dtype != "bool":
        raise NotImplementedError(f"{b.name}: a {b.graph.values[mask].dtype} mask, expected bool")
    t = _same_storage(b, base, source)
    counts = b.scratch("int32", math.isqrt(numel_of(b.graph.values[base].dims)) + 1)  # at least ceil(sqrt(n)) chunks
    params = b.params(32 + 2 * 32)

    def chunk_kernel(bindings, steps):
        return flat_kernel(MASKED_FIELDS, bindings, fill(MASKED_CHUNK, **steps), count="chunks", index="c", functions=STRIDED)

    count = b.dispatch(chunk_kernel([("mask", "u32", "read"), ("counts", "i32", "read_write")], MASK_COUNT), [mask, counts, params])
    bindings = [("mask", "u32", "read"), ("counts", "i32", "read"), ("base", t, "read"), ("src", t, "read"), ("dst", t, "read_write")]
    write = b.dispatch(chunk_kernel(bindings, MASK_WRITE), [mask, counts, base, source, b.out, params])

    def resize(ctx):
        dims, mdims = ctx.dims(base), ctx.dims(mask)
        try:
            fits = list(broadcast_shapes(mdims, dims)) == list(dims)
        except ValueError:
            fits = False
        if not fits:
            b.fail(f"mask of shape {list(mdims)} does not broadcast to self's shape {list(dims)}")
        n = numel_of(dims)
        chunk = math.isqrt(n - 1) + 1 if n else 1  # ceil(sqrt(n))
        chunks = -(-n // chunk)
        data = struct.pack("<8I", n, len(dims), chunk, chunks, ctx.numel(source), 0, 0, 0)
        ctx.set_params(params, data + pack_u32x8(dims) + pack_u32x8(broadcast_strides(mdims, dims)))
        ctx.set_grid(count, flat_grid(chunks))
        ctx.set_grid(write, flat_grid(chunks))
        ctx.set_dims(b.out, dims)

    b.hook(resize)
