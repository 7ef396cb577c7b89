"""q, k and v products that take the RoPE after them (kernels/fusion.py's fuse_ragged): one
dispatch fewer a decode layer.

`pte_wgpu.linear_group_rope` (and its rms_, q4_, bias_ forms: every group of GROUPS) is the q/k/v
group of that name, its args but the outputs, then (fcos, fsin, k_cache, v_cache, row_pos,
row_seq, seq_blocks, lean: a bool, kernels/attention/rope.py's RopeEpilogue.lean); out [q, k, v,
rotated q, rotated k]. Where a GPU's GEMV (or the subgroup
kernel at its shape, SG_GPU) takes the rows, its epilogue rotates q and k as
`pte_wgpu.rope_into_cache` does and stores k and v in the KV caches (kernels/attention/rope.py's
rope_store: the same expressions on the same values, so results are bitwise the two ops'); other
routes (more rows, CPU adapters' kernels) run rope_into_cache's own dispatch after them.

`..._rope_hf` takes the rotate-half RoPE (`pte_wgpu.rope_hf_into_cache`, tables [rows, rd], from
row 0) the same way: the fusion paired q's and k's weight rows (dims d and d + rd / 2 of a head
side by side), so that a pair's outputs meet in one invocation as the interleaved RoPE's do; the
epilogue, or the paired form of rope_hf_into_cache's dispatch, writes them in the heads' order.
"""

from pte_wgpu.resize.values import ValueList

from ..attention.kv_cache import table_entries
from ..attention.rope import RopeEpilogue, rope_hf_route, rope_route
from ..registry import op
from .fused_linear import linear_group_routes
from .q4_fused_linear import q4_group_routes

GROUPS = {
    "pte_wgpu.linear_group": linear_group_routes,
    "pte_wgpu.rms_linear_group": linear_group_routes,
    "pte_wgpu.linear_bias_group": linear_group_routes,
    "pte_wgpu.rms_linear_bias_group": linear_group_routes,
    "pte_wgpu.q4_linear_group": q4_group_routes,
    "pte_wgpu.rms_q4_linear_group": q4_group_routes,
    "pte_wgpu.q4_linear_bias_group": q4_group_routes,
    "pte_wgpu.rms_q4_linear_bias_group": q4_group_routes,
}
ROPES = ("_rope", "_rope_hf")  # the suffixes of a group that takes the interleaved RoPE, the rotate-half one


@op(*(name + rope for name in GROUPS for rope in ROPES), half=True)
def linear_group_rope(b):
    values = b.graph.values
    *group_args, fcos, fsin, k_cache, v_cache, row_pos, row_seq, seq_blocks, lean = b.args[:-1]
    q, k, v, oq, ok = values[b.out].items
    _, context, hkv, dim = values[k_cache].dims
    values.append(ValueList((q, k, v)))
    hf = b.name.endswith("_rope_hf")
    group = b.part(b.name.removesuffix("_rope_hf" if hf else "_rope"), (*group_args, len(values) - 1))
    tensors = [fcos, fsin, oq, ok, k_cache, v_cache, row_pos, row_seq, seq_blocks]
    half = values[fcos].dims[-1] // 2 if hf else dim // 2  # the pairs a head rotates
    fields = (half, dim, hkv * dim, table_entries(context))
    epilogue = RopeEpilogue(tensors, [b.storage(vid) for vid in tensors], fields, hf, bool(values[lean].value))
    set_group = GROUPS[group.name](group, epilogue)
    rope_args = (q, k, fcos, fsin, v, k_cache, v_cache, row_pos, row_seq, seq_blocks)
    set_rope = rope_hf_route(b, rope_args, None, oq, ok, paired=True) if hf else rope_route(b, rope_args, oq, ok)
    n_q = values[q].dims[-1]

    def resize(ctx):
        rotated = set_group(ctx)
        m = ctx.numel(q) // n_q
        set_rope(ctx, (1, m, n_q // dim, dim), (1, m, hkv, dim), on=not rotated)

    b.hook(resize)
