"""`update_cache` (ExecuTorch's `llama::update_cache`): write `value` [B, S, H, D] into `cache`
[B, C, H, D] at rows start_pos..start_pos+S-1, in place, converted to the cache's storage type
(a cache stored f16 takes half the bytes of each session).

The cache is a mutable buffer of the exported module, so it is a state tensor of each session
(`b.writes`). The op's own output is a placeholder of one element (the eager op returns an empty
[1] tensor), which this kernel leaves alone.
"""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..wgsl import fill, flat_grid, flat_kernel, type_aliases


# The paged KV cache of a ragged pass (async_runtime/batching.py): each cache is a pool of blocks of
# KV_BLOCK positions. Sequence b of the pass keeps its position j in block seq_blocks[b * blocks +
# j / KV_BLOCK] (`blocks`: the table entries of a sequence, ceil(context / KV_BLOCK)), at row j %
# KV_BLOCK of it; token row r of the pass is sequence row_seq[r]'s position row_pos[r], and a
# padding row (sequence -1) has no place. Every kernel that stores or reads a ragged pass's k and v
# goes through `key_row` (kernels/attention/kv_cache_sdpa.py, kernels/attention/rope.py).
KV_BLOCK = 64


def table_entries(context):
    """Entries of a sequence's block table for a cache of `context` positions."""
    return -(-context // KV_BLOCK)


def key_row(uniform="p"):
    """`key_row(b, j)`, the pool row of sequence b's position j, reading the table stride from
    `uniform`.blocks (a reader's)."""
    return fill(
        """
fn key_row(b: u32, j: u32) -> u32 { return u32(seq_blocks[b * $UNIFORM.blocks + j / ${BLOCK}u]) * ${BLOCK}u + j % ${BLOCK}u; }
""",
        UNIFORM=uniform,
        BLOCK=KV_BLOCK,
    )


def cache_at(uniform="p"):
    """`key_row` and `cache_at(r, e)`, the pool element e of token row r (`uniform`.row floats a
    position): a writer's."""
    return key_row(uniform) + fill(
        """fn cache_at(r: u32, e: u32) -> u32 { return key_row(u32(row_seq[r]), u32(row_pos[r])) * $UNIFORM.row + e; }
""",
        UNIFORM=uniform,
    )


CACHE_AT = cache_at()

UPDATE = flat_kernel(
    "numel: u32, per_batch: u32, cache_per_batch: u32, offset: u32",
    [("value", "VT", "read"), ("cache", "CT", "read_write")],
    """
    let batch = i / p.per_batch;
    cache[batch * p.cache_per_batch + p.offset + i % p.per_batch] = CT(value[i]);
""",
    count="numel",
)


@op("update_cache.default", half=True)
def update_cache(b):
    value, cache, start_pos = b.args[:3]
    batch, context, heads, dim = b.tensor(1).dims
    out_dims = b.graph.values[b.out].dims
    b.writes(cache)
    params = b.params(16)
    shader = type_aliases(b.graph.values, VT=value, CT=cache) + UPDATE
    d = b.dispatch(shader, [value, cache, params])

    def resize(ctx):
        shape = ctx.dims(value)
        if len(shape) != 4 or (shape[0], shape[2], shape[3]) != (batch, heads, dim):
            b.fail(f"value of shape {list(shape)} for a cache of shape {[batch, context, heads, dim]}")
        pos, s = ctx.int_value(start_pos), shape[1]
        if pos < 0 or pos + s > context:
            b.fail(f"positions {pos}..{pos + s - 1} do not fit the cache of {context} positions")
        n = numel_of(shape)
        ctx.set_params(params, struct.pack("<4I", n, s * heads * dim, context * heads * dim, pos * heads * dim))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, out_dims)

    b.hook(resize)
