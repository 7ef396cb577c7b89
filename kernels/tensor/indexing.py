"""Advanced indexing: `aten.index.Tensor` (`self[i0, i1, ...]` with a list of optional index
tensors).

The index tensors broadcast together to a shape B. When the indexed dims are adjacent the output
is `self.shape[:first] + B + self.shape[last + 1:]`; otherwise B comes first, followed by the
non-indexed dims in order (NumPy's rule). One kernel serves every case: each output coordinate
contributes to the input offset either directly (a non-indexed dim, through `in_strides`) or
through the index tensors (a B dim, through each index tensor's broadcast strides); each index
value, wrapped if negative and clamped, is multiplied by its input dim's stride. Bool (mask) index
tensors would need a data-dependent shape and are not supported.
"""

import struct

from pte_wgpu.resize.shapes import broadcast_shapes, broadcast_strides, contiguous_strides, numel_of
from pte_wgpu.resize.values import Scalar, Tensor

from ..registry import op
from ..wgsl import PACKED, STRIDED, fill, flat_grid, flat_kernel, pack_u32x8, wgsl_type

MAX_INDICES = 8

INDEX_FIELDS = """numel: u32, rank: u32, pad0: u32, pad1: u32, sizes: array<vec4<u32>, 2>,
           in_strides: array<vec4<u32>, 2>, dim_sizes: array<vec4<u32>, 2>, dim_strides: array<vec4<u32>, 2>,
           idx_strides: array<array<vec4<u32>, 2>, $N>"""
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
    dst[i] = src[off];
"""


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


@op("aten.index.Tensor", "aten::index.Tensor_out", half=True)
def index(b):
    src = b.args[0]
    t = b.tensor(0).dtype
    entries = _optional_tensors(b, 1)
    indexed = [(d, vid) for d, vid in enumerate(entries) if vid is not None]
    if not indexed:
        b.fail("no index tensors")
    if len(indexed) > MAX_INDICES:
        raise NotImplementedError(f"{b.name}: {len(indexed)} index tensors (at most {MAX_INDICES})")
    if t in PACKED or wgsl_type(t) != b.storage(b.out):
        raise NotImplementedError(f"{b.name}: {t} source, {b.graph.values[b.out].dtype} output")
    for _, vid in indexed:
        dtype = b.graph.values[vid].dtype
        if dtype == "bool" or wgsl_type(dtype) != "i32":
            raise NotImplementedError(f"{b.name}: {dtype} index tensors (boolean masks have data-dependent shapes)")
    n = len(indexed)
    bindings = [("src", wgsl_type(t), "read"), *((f"idx{j}", "i32", "read") for j in range(n)), ("dst", wgsl_type(t), "read_write")]
    zero = "\n".join(f"    var o{j} = 0u;" for j in range(n))
    accum = "\n".join(f"        o{j} = o{j} + c * at8(p.idx_strides[{j}], u32(d));" for j in range(n))
    gather = "\n".join(f"    off = off + wrap(idx{j}[o{j}], {j}u);" for j in range(n))
    body = fill(INDEX_BODY, ZERO=zero, ACCUM=accum, GATHER=gather)
    shader = flat_kernel(fill(INDEX_FIELDS, N=n), bindings, body, count="numel", functions=STRIDED + WRAP)
    params = b.params(16 + 4 * 32 + n * 32)
    d = b.dispatch(shader, [src] + [vid for _, vid in indexed] + [b.out, params])
    out_rank = len(b.graph.values[b.out].dims)
    dims_idx = [dd for dd, _ in indexed]
    adjacent = dims_idx == list(range(dims_idx[0], dims_idx[-1] + 1))

    def resize(ctx):
        dims = ctx.dims(src)
        rank = len(dims)
        if len(entries) > rank:
            b.fail(f"{len(entries)} indices for a tensor of rank {rank}")
        ishapes = [ctx.dims(vid) for _, vid in indexed]
        try:
            bshape = broadcast_shapes(*ishapes)
        except ValueError as e:
            b.fail(str(e))
        strides = contiguous_strides(dims)
        rest = [k for k in range(rank) if k not in dims_idx]
        # the output's dims: ("in", input dim) or ("b", position in bshape)
        if adjacent:
            first = dims_idx[0]
            layout = [("in", k) for k in rest if k < first] + [("b", k) for k in range(len(bshape))]
            layout += [("in", k) for k in rest if k > first]
        else:
            layout = [("b", k) for k in range(len(bshape))] + [("in", k) for k in rest]
        shape = [dims[k] if kind == "in" else bshape[k] for kind, k in layout]
        if len(shape) != out_rank:
            b.fail(f"indexing live shape {dims} with index shapes {ishapes} gives rank {len(shape)}, expected {out_rank}")
        in_strides = [strides[k] if kind == "in" else 0 for kind, k in layout]
        b_pos = [p for p, (kind, _) in enumerate(layout) if kind == "b"]
        idx_strides = b""
        for s in ishapes:
            bs = broadcast_strides(s, bshape)
            per_out = [0] * len(layout)
            for p, k in zip(b_pos, range(len(bshape))):
                per_out[p] = bs[k]
            idx_strides += pack_u32x8(per_out)
        total = numel_of(shape)
        data = struct.pack("<4I", total, len(shape), 0, 0) + pack_u32x8(shape) + pack_u32x8(in_strides)
        data += pack_u32x8([dims[k] for k in dims_idx]) + pack_u32x8([strides[k] for k in dims_idx])
        ctx.set_params(params, data + idx_strides)
        ctx.set_grid(d, flat_grid(total))
        ctx.set_dims(b.out, shape)

    b.hook(resize)
