"""Table lookups: `aten.embedding` (rows of a weight by index), each table and output in its own
storage type (f32, f16 or an integer type); a ragged batch's last row of each sequence; and rows
of 4-bit tables (`quantized_decomposed.embedding_4bit`, `et_vk.embedding_q4gsw`).

A 4-bit table is kernels/matmul/q4_linear.py's format: uint8 [V, D / 2], two elements a byte, each
stored as q + 8, times its group's scale (scales [V, groups], or [V] for one group). Which nibble
holds the even element is the one difference: the low one in a linear weight's packing
(`is_linear_weight`), the high one otherwise."""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..wgsl import fill, flat_grid, flat_kernel, type_aliases


def lookup_kernel(parts=1, per=0):
    """The flat lookup: out[i] = element i % dim of row index[i / dim] of a table bound as `parts`
    bindings part0, part1, .. of `per` rows each (the last one the rest)."""
    if parts == 1:
        reads = "v = part0[row * p.dim + i % p.dim];"
    else:
        reads = "\n    ".join(
            f"{'else ' if j else ''}if (row / {per}u == {j}u) {{ v = part{j}[(row - {j * per}u) * p.dim + i % p.dim]; }}" for j in range(parts)
        )
    return flat_kernel(
        "n: u32, dim: u32, rows: u32, pad: u32",
        [*((f"part{j}", "WT", "read") for j in range(parts)), ("index", "i32", "read"), ("out", "OT", "read_write")],
        f"""
    let t = i / p.dim;
    // An index outside the table reads its nearest row instead of out-of-bounds memory.
    let row = u32(clamp(index[t], 0, i32(p.rows) - 1));
    var v = WT(0);
    {reads}
    out[i] = OT(v);
""",
    )


EMBEDDING = lookup_kernel()


@op("aten.embedding.default", "aten::embedding.out", half=True)
def embedding(b):
    weight, indices = b.args[0], b.args[1]
    rows, dim = b.tensor(0).dims
    _add_lookup(b, EMBEDDING, [weight], indices, dim, rows)


def _add_lookup(b, kernel, tables, indices, dim, rows):
    """Record a lookup of `rows` rows of `dim` by `indices` from `tables` (lookup_kernel's parts,
    bound in order, of one storage type) with `kernel`, and its hook."""
    params = b.params(16)
    d = b.dispatch(type_aliases(b.graph.values, WT=tables[0], OT=b.out) + kernel, [*tables, indices, b.out, params])

    def resize(ctx):
        shape = ctx.dims(indices) + (dim,)
        n = numel_of(shape)
        ctx.set_params(params, struct.pack("<4I", n, dim, rows, 0))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, shape)

    b.hook(resize)


EMBEDDING_PARTS = "pte_wgpu.embedding_parts"
# A lookup binds its parts, the indices, the output and the uniform: within WebGPU's default of 8
# storage buffers a shader stage.
MAX_PARTS = 6


@op(EMBEDDING_PARTS, half=True)
def embedding_parts(b):
    """[indices, rows a part, part 0, part 1, .., out]: aten.embedding over a table cut into parts
    of whole rows (async_runtime/program/tables.py), each its own binding."""
    indices, per, parts = b.args[0], b.scalar(1), b.args[2:-1]
    dim = b.graph.values[parts[0]].dims[1]
    rows = per * (len(parts) - 1) + b.graph.values[parts[-1]].dims[0]
    _add_lookup(b, lookup_kernel(len(parts), per), parts, indices, dim, rows)


@op("pte_wgpu.last_rows", half=True)
def last_rows(b):
    """Each sequence's last row of a ragged batch (async_runtime.ragged): out[b] = x[seq_last[b]],
    where x's token axis holds the concatenated rows and the unit dim before it becomes the
    sequence axis of the output."""
    src, axis, seq_last = b.args[0], b.scalar(1), b.args[2]
    params = b.params(16)
    d = b.dispatch(type_aliases(b.graph.values, WT=src, OT=b.out) + EMBEDDING, [src, seq_last, b.out, params])

    def resize(ctx):
        dims = ctx.dims(src)
        seqs = ctx.dims(seq_last)[0]
        row = numel_of(dims[axis + 1 :])
        shape = dims[: axis - 1] + (seqs,) + dims[axis + 1 :]
        ctx.set_params(params, struct.pack("<4I", seqs * row, row, dims[axis], 0))
        ctx.set_grid(d, flat_grid(seqs * row))
        ctx.set_dims(b.out, shape)

    b.hook(resize)


# Rows of a 4-bit table: element d of row r is byte d / 2 of the row, nibble by `p.linear`.
EMBEDDING_Q4 = flat_kernel(
    "n: u32, dim: u32, rows: u32, wpr: u32, groups: u32, gs: u32, linear: u32, pad: u32",
    [("wq", "u32", "read"), ("ws", "$WS_TYPE", "read"), ("index", "i32", "read"), ("out", "$OUT_TYPE", "read_write")],
    """
    let t = i / p.dim;
    let d = i % p.dim;
    // An index outside the table reads its nearest row instead of out-of-bounds memory.
    let row = u32(clamp(index[t], 0, i32(p.rows) - 1));
    let byte = (wq[row * p.wpr + d / 8u] >> (8u * ((d / 2u) % 4u))) & 0xFFu;
    // linear packing: even element in the low nibble; otherwise in the high nibble
    let high = ((d % 2u) == 1u) == (p.linear == 1u);
    let q = select(byte & 15u, byte >> 4u, high);
    out[i] = $OUT_TYPE((f32(q) - 8.0) * f32(ws[row * p.groups + min(d / p.gs, p.groups - 1u)]));
""",
)


def _add_q4_embedding(b, weight, scales, indices, dim, group_size, linear):
    """Record out[..., d] = (nibble - 8) * scale of row indices[...] of a 4-bit table."""
    rows, row_bytes = b.graph.values[weight].dims
    groups = b.graph.values[scales].dims[1] if len(b.graph.values[scales].dims) == 2 else 1
    params = b.params(32)
    shader = fill(EMBEDDING_Q4, WS_TYPE=b.storage(scales), OUT_TYPE=b.storage(b.out))
    d = b.dispatch(shader, [weight, scales, indices, b.out, params])

    def resize(ctx):
        shape = ctx.dims(indices) + (dim,)
        n = numel_of(shape)
        ctx.set_params(params, struct.pack("<8I", n, dim, rows, row_bytes // 4, groups, group_size, int(linear), 0))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, shape)

    b.hook(resize)


@op("quantized_decomposed.embedding_4bit.dtype", "quantized_decomposed::embedding_4bit.out", "quantized_decomposed::embedding_4bit.dtype_out", half=True)
def embedding_4bit(b):
    """[weight uint8 [V, D/2], scales [V] or [V, groups], zero_points (None), quant_min, quant_max,
    indices, dtype, out [..., D]]: the even element in the high nibble."""
    wt, st = b.tensor(0), b.tensor(1)
    if not b.is_none(2):
        raise NotImplementedError(f"{b.name}: zero points")
    row_bytes = wt.dims[1]
    if row_bytes % 4:
        raise NotImplementedError(f"{b.name}: rows of {row_bytes} bytes are not whole u32 words")
    groups = st.dims[1] if len(st.dims) == 2 else 1
    _add_q4_embedding(b, b.args[0], b.args[1], b.args[5], row_bytes * 2, row_bytes * 2 // groups, linear=False)


@op("et_vk.embedding_q4gsw.default", half=True)
def embedding_q4gsw(b):
    """[weight u8 [V, Dp/2], scales f32 [V, groups] (or [V]), group_size Int, indices, is_linear_weight
    Bool, out [..., D]]."""
    wt, st = b.tensor(0), b.tensor(1)
    gs = int(b.scalar(2))
    linear = b.flag(4)
    if len(wt.dims) != 2 or wt.dims[1] % 4:
        b.fail(f"weight must be packed [V, D/2] with whole u32 rows, got {list(wt.dims)}")
    rows, row_bytes = wt.dims
    groups = st.dims[1] if len(st.dims) == 2 else 1
    if st.dims[0] != rows:
        b.fail(f"scales {list(st.dims)} for {rows} rows")
    dim = b.graph.values[b.out].dims[-1]
    if dim > row_bytes * 2 or -(-dim // gs) > groups:
        b.fail(f"embedding dim {dim} does not fit weight {list(wt.dims)} / scales {list(st.dims)}")
    _add_q4_embedding(b, b.args[0], b.args[1], b.args[3], dim, gs, linear)
