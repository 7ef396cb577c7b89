"""Table lookups: `aten.embedding` (rows of a weight by index), each table and output in its own
storage type (f32, f16 or an integer type); a ragged batch's last row of each sequence; and rows
of quantized tables of 8, 4 or 2 bits a value (`quantized_decomposed.embedding_byte`, `_4bit`,
`_2bit`, `et_vk.embedding_q4gsw`), times their group's scale (scales [V, groups], or [V] for one
group), less its zero point where there are any.

A 4-bit table is kernels/matmul/q4_linear.py's format: uint8 [V, D / 2], two elements a byte, each
stored as q + 8. Which nibble holds the even element is the one difference: the low one in a
linear weight's packing (`is_linear_weight`), the high one otherwise."""

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


# Rows of a quantized table of `bits` a value (8, 4 or 2): element d of row r is in byte
# r * row_bytes + d * bits / 8 of the table's words, its value that byte's QUANTIZED_VALUES[bits],
# less the group's zero point, times its scale.
EMBEDDING_QUANTIZED = """
    let t = i / p.dim;
    let d = i % p.dim;
    // An index outside the table reads its nearest row instead of out-of-bounds memory.
    let row = u32(clamp(index[t], 0, i32(p.rows) - 1));
    let at = row * p.row_bytes + d / ${PER_BYTE}u;
    let byte = (wq[at / 4u] >> (8u * (at % 4u))) & 0xFFu;
    let g = row * p.groups + min(d / p.gs, p.groups - 1u);
    out[i] = $OUT_TYPE(($VALUE - $ZERO) * f32(ws[g]));
"""
# a value of each width as the byte holds it: 8 bits signed; 4 bits stored as q + 8, the even
# element in the high nibble (the low one in a linear weight's packing, `p.linear`); 2 bits stored
# as q + 2, element 4j + k in bits 2k of byte j
QUANTIZED_VALUES = {
    8: "f32(bitcast<i32>(byte << 24u) >> 24u)",
    4: "(f32(select(byte & 15u, byte >> 4u, ((d % 2u) == 1u) == (p.linear == 1u))) - 8.0)",
    2: "(f32((byte >> (2u * (d % 4u))) & 3u) - 2.0)",
}


def _add_quantized_embedding(b, weight, scales, zero_points, indices, dim, group_size, bits, linear=False):
    """Record out[..., d] = (value - zero point) * scale of row indices[...] of a table of `bits`
    a value (zero_points: a value id, or None for none)."""
    rows, row_bytes = b.graph.values[weight].dims
    groups = b.graph.values[scales].dims[1] if len(b.graph.values[scales].dims) == 2 else 1
    params = b.params(32)
    zp = [zero_points] if zero_points is not None else []
    bindings = [("wq", "u32", "read"), ("ws", b.storage(scales), "read"), *(("wz", b.storage(z), "read") for z in zp), ("index", "i32", "read"),
                ("out", b.storage(b.out), "read_write")]
    body = fill(EMBEDDING_QUANTIZED, OUT_TYPE=b.storage(b.out), PER_BYTE=8 // bits, VALUE=QUANTIZED_VALUES[bits], ZERO="f32(wz[g])" if zp else "0.0")
    shader = flat_kernel("n: u32, dim: u32, rows: u32, row_bytes: u32, groups: u32, gs: u32, linear: u32, pad: u32", bindings, body)
    d = b.dispatch(shader, [weight, scales, *zp, indices, b.out, params])

    def resize(ctx):
        shape = ctx.dims(indices) + (dim,)
        n = numel_of(shape)
        ctx.set_params(params, struct.pack("<8I", n, dim, rows, row_bytes, groups, group_size, int(linear), 0))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, shape)

    b.hook(resize)


def _quantized_embedding(bits):
    """quantized_decomposed.embedding_byte / _4bit / _2bit: [weight [V, D * bits / 8], scales [V]
    or [V, groups], zero_points (None, or as scales), quant_min, quant_max, indices, (dtype), out
    [..., D]]."""

    def build(b):
        wt, st = b.tensor(0), b.tensor(1)
        if len(wt.dims) != 2 or not 1 <= len(st.dims) <= 2 or st.dims[0] != wt.dims[0]:
            b.fail(f"weight {list(wt.dims)} with scales {list(st.dims)}: expected [V, bytes] and [V] or [V, groups]")
        zero_points = None if b.is_none(2) else b.args[2]
        if zero_points is not None and b.tensor(2).dims != st.dims:
            b.fail(f"zero points {list(b.tensor(2).dims)}, expected the scales' shape {list(st.dims)}")
        dim = wt.dims[1] * 8 // bits
        groups = st.dims[1] if len(st.dims) == 2 else 1
        _add_quantized_embedding(b, b.args[0], b.args[1], zero_points, b.args[5], dim, dim // groups, bits)

    return build


for _bits, _name in ((8, "byte"), (4, "4bit"), (2, "2bit")):
    op(f"quantized_decomposed.embedding_{_name}.default", f"quantized_decomposed.embedding_{_name}.dtype",
       f"quantized_decomposed::embedding_{_name}.out", f"quantized_decomposed::embedding_{_name}.dtype_out", half=True)(_quantized_embedding(_bits))


@op("et_vk.embedding_q4gsw.default", half=True)
def embedding_q4gsw(b):
    """[weight u8 [V, Dp/2], scales f32 [V, groups] (or [V]), group_size Int, indices, is_linear_weight
    Bool, out [..., D]]."""
    wt, st = b.tensor(0), b.tensor(1)
    gs = int(b.scalar(2))
    linear = b.flag(4)
    if len(wt.dims) != 2:
        b.fail(f"weight must be packed [V, D/2], got {list(wt.dims)}")
    rows, row_bytes = wt.dims
    groups = st.dims[1] if len(st.dims) == 2 else 1
    if st.dims[0] != rows:
        b.fail(f"scales {list(st.dims)} for {rows} rows")
    dim = b.graph.values[b.out].dims[-1]
    if dim > row_bytes * 2 or -(-dim // gs) > groups:
        b.fail(f"embedding dim {dim} does not fit weight {list(wt.dims)} / scales {list(st.dims)}")
    _add_quantized_embedding(b, b.args[0], b.args[1], None, b.args[3], dim, gs, 4, linear)
