"""Table lookups: `aten.embedding` (rows of a weight by index), each table and output in its own
storage type (f32, f16 or an integer type)."""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..matmul.q4_linear import embedding_q4_shader
from ..registry import op
from ..wgsl import FLAT_INDEX, WG, flat_grid, type_aliases

EMBEDDING = f"""
struct P {{ n: u32, dim: u32, rows: u32, pad: u32 }}
@group(0) @binding(0) var<storage, read> weight: array<WT>;
@group(0) @binding(1) var<storage, read> index: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<OT>;
@group(0) @binding(3) var<uniform> p: P;
{FLAT_INDEX}
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let i = flat_index(gid, nwg, {WG}u);
    if (i >= p.n) {{ return; }}
    let t = i / p.dim;
    // An index outside the table reads its nearest row instead of out-of-bounds memory.
    let row = u32(clamp(index[t], 0, i32(p.rows) - 1));
    out[i] = OT(weight[row * p.dim + i % p.dim]);
}}
"""


@op("aten.embedding.default", "aten::embedding.out", half=True)
def embedding(b):
    weight, indices = b.args[0], b.args[1]
    rows, dim = b.tensor(0).dims
    params = b.params(16)
    d = b.dispatch(type_aliases(b.graph.values, WT=weight, OT=b.out) + EMBEDDING, [weight, indices, b.out, params])

    def resize(ctx):
        shape = ctx.dims(indices) + (dim,)
        n = numel_of(shape)
        ctx.set_params(params, struct.pack("<4I", n, dim, rows, 0))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, shape)

    b.hook(resize)


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


@op("quantized_decomposed.embedding_4bit.dtype", half=True)
def embedding_4bit(b):
    """[weight uint8 [V, D/2], scales [V] or [V, groups], zero_points (None), quant_min, quant_max,
    indices, dtype, out [..., D]]: rows of 4-bit weights, the even element in the high nibble,
    stored as q + 8, times their group's scale (the q4gsw embedding kernel's non-linear layout)."""
    wt, st = b.tensor(0), b.tensor(1)
    if not b.is_none(2):
        raise NotImplementedError(f"{b.name}: zero points")
    rows, row_bytes = wt.dims
    if row_bytes % 4:
        raise NotImplementedError(f"{b.name}: rows of {row_bytes} bytes are not whole u32 words")
    groups = st.dims[1] if len(st.dims) == 2 else 1
    dim, gs = row_bytes * 2, row_bytes * 2 // groups
    indices = b.args[5]
    params = b.params(32)
    d = b.dispatch(embedding_q4_shader(b, b.args[1], b.out), [b.args[0], b.args[1], indices, b.out, params])

    def resize(ctx):
        shape = ctx.dims(indices) + (dim,)
        n = numel_of(shape)
        ctx.set_params(params, struct.pack("<8I", n, dim, rows, row_bytes // 4, groups, gs, 0, 0))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, shape)

    b.hook(resize)
