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


# The ragged KV-cache slot formula, for every kernel that stores a ragged pass's k and v
# (kernels/attention/kv_cache_sdpa.py RAGGED_UPDATE_CACHE, kernels/attention/rope.py rope_into_cache): element e of the
# pass's token row r (p.row floats a row) goes to slot row_slot[r] of the pooled cache (p.stride
# floats a slot) at position row_pos[r]. A padding row (slot -1) has no place; callers skip it.
def cache_slot(uniform="p"):
    """`cache_at(r, e)`, reading p.stride and p.row from the uniform named `uniform`."""
    return fill(
        """
fn cache_at(r: u32, e: u32) -> u32 { return u32(row_slot[r]) * $UNIFORM.stride + u32(row_pos[r]) * $UNIFORM.row + e; }
""",
        UNIFORM=uniform,
    )


CACHE_SLOT = cache_slot()

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
