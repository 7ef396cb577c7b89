"""Attention without a KV-cache update: `et_vk.sdpa` and `llama::custom_sdpa`.

- `et_vk.sdpa(q [B, Hq, S, D], k, v [B, Hkv, L, D], attn_mask or None, scale or None)`:
  softmax(q @ k^T * scale + mask) @ v, the mask additive and broadcast to [B, Hq, S, L].
- `custom_sdpa(q [B, S, Hq, D], k_cache, v_cache [B, Smax, Hkv, D], start_pos, attn_mask
  (None only), dropout_p (0 only), is_causal, scale or None)`: query row s at position
  start_pos + s attends the first start_pos + S cache rows, or with is_causal those up to its own.

Both read any head layout through strides, with grouped-query heads (query head h reads kv head
h / (Hq / Hkv)). One invocation computes one query row with an online softmax over the keys: the
plain kernel for the small attention blocks of encoders and vision models, where the tuned
flash-attention kernels of kernels/attention/kv_cache_sdpa.py (cache updates, causal LLM decode) do not apply.
Each tensor is read and written in its own storage type (f32 or f16); the arithmetic is f32.

- `pte_wgpu.attention(q [..., S, D], k, v [..., L, D], scale, out [..., S, D])`: what
  kernels/fusion.py makes of an exported attention, bmm -> (safe) softmax -> bmm (ViT's, from
  scaled_dot_product_attention's decomposition): per head (the leading dims), softmax(q @ k^T *
  scale) @ v, rows of only -inf scores zeros. It runs kv_cache_sdpa.py's query-tiled kernel over
  every key, so the scores are never stored.
"""

import math
import struct

from pte_wgpu.resize.shapes import broadcast_strides, numel_of

from ..registry import op
from ..wgsl import fill, flat_grid, flat_kernel, is_float, type_aliases
from .kv_cache_sdpa import MAX_HEAD_DIM, TILE_ROWS, tiled_shader, online_softmax_step, tiled_shape

ATTENTION, ATTENTION_PACKED = "pte_wgpu.attention", "pte_wgpu.attention_packed"

SDPA_PARAMS = "<6IfI4I4I4I"
SDPA_FIELDS = """rows: u32, s: u32, hq: u32, group: u32, dim: u32, keys: u32, scale: f32, causal_pos: u32,
           qs: vec4<u32>, ks: vec4<u32>, ms: vec4<u32>"""
# The kernel's statements; $MASK: the mask's term of a score
SDPA_BODY = """
    let s = i % p.s;
    let h = (i / p.s) % p.hq;
    let b = i / (p.s * p.hq);
    let qrow = b * p.qs.x + h * p.qs.y + s * p.qs.z;
    let kbase = b * p.ks.x + (h / p.group) * p.ks.y;
    let mrow = b * p.ms.x + h * p.ms.y + s * p.ms.z;
    // causal_pos: 0 for none, else 1 + the position of query row 0
    let keys = select(p.keys, min(p.keys, p.causal_pos + s), p.causal_pos > 0u);
    var acc: array<f32, $MAX_HEAD_DIM>;
    for (var d = 0u; d < p.dim; d = d + 1u) { acc[d] = 0.0; }
    var m = -3.0e38;
    var l = 0.0;
    for (var j = 0u; j < keys; j = j + 1u) {
        let krow = kbase + j * p.ks.z;
        var dot = 0.0;
        for (var d = 0u; d < p.dim; d = d + 1u) { dot = dot + f32(q[qrow + d]) * f32(k[krow + d]); }
        let score = dot * p.scale + $MASK;
$ONLINE_SOFTMAX_STEP
    }
    let orow = b * p.qs.x + h * p.qs.y + s * p.qs.z;
    for (var d = 0u; d < p.dim; d = d + 1u) { out[orow + d] = OT(acc[d] / l); }
"""


def _add_sdpa(b, q, k, v, mask, scale, geometry):
    """Record the kernel; `geometry(ctx)` -> (B, Hq, S, Hkv, L keys, D, q strides (b, h, s),
    kv strides (b, h, row), causal_pos) from the live shapes."""
    tensors = dict(QT=q, KT=k, VT=v, OT=b.out, **({"MT": mask} if mask is not None else {}))
    for vid in tensors.values():
        if not is_float(b.graph.values[vid].dtype):
            raise NotImplementedError(f"{b.name}: {b.graph.values[vid].dtype} tensors")
    bindings = [q, k, v] + ([mask] if mask is not None else [])
    decls = [("q", "QT", "read"), ("k", "KT", "read"), ("v", "VT", "read")] + ([("mask", "MT", "read")] if mask is not None else [])
    body = fill(
        SDPA_BODY,
        MAX_HEAD_DIM=MAX_HEAD_DIM,
        MASK="f32(mask[mrow + j * p.ms.w])" if mask is not None else "0.0",
        ONLINE_SOFTMAX_STEP=online_softmax_step("p.dim", "f32(v[krow + d])"),
    )
    shader = type_aliases(b.graph.values, **tensors) + flat_kernel(SDPA_FIELDS, [*decls, ("out", "OT", "read_write")], body, count="rows")
    params = b.params(struct.calcsize(SDPA_PARAMS))
    d = b.dispatch(shader, bindings + [b.out, params])

    def resize(ctx):
        batch, hq, s, hkv, keys, dim, q_strides, kv_strides, causal_pos = geometry(ctx)
        if dim > MAX_HEAD_DIM or hq % hkv or ctx.dims(k) != ctx.dims(v):
            b.fail(f"head dim {dim} (max {MAX_HEAD_DIM}), heads {hq}/{hkv} or k, v shapes {ctx.dims(k)}, {ctx.dims(v)}")
        mask_strides = (0, 0, 0, 0)
        if mask is not None:
            scores = (batch, hq, s, keys)
            shape = ctx.dims(mask)
            if len(shape) > 4 or any(m not in (1, n) for m, n in zip(shape[::-1], scores[::-1])):
                b.fail(f"a mask of shape {shape} for scores of shape {scores}")
            mask_strides = broadcast_strides(shape, scores)
        rows = batch * hq * s
        data = struct.pack(SDPA_PARAMS, rows, s, hq, hq // hkv, dim, keys, scale(dim), causal_pos, *q_strides, 0, *kv_strides, 0, *mask_strides)
        ctx.set_params(params, data)
        ctx.set_grid(d, flat_grid(rows))
        ctx.set_dims(b.out, ctx.dims(q))

    b.hook(resize)


def _scale(given):
    return lambda dim: 1.0 / math.sqrt(dim) if given is None else float(given)


@op("et_vk.sdpa.default", half=True)
def sdpa(b):
    """[q, k, v, attn_mask or None, scale or None, out]."""
    q, k, v = b.args[:3]
    mask = None if b.is_none(3) else b.args[3]

    def geometry(ctx):
        (batch, hq, s, dim), (_, hkv, keys, _) = ctx.dims(q), ctx.dims(k)
        return batch, hq, s, hkv, keys, dim, (hq * s * dim, s * dim, dim), (hkv * keys * dim, keys * dim, dim), 0

    _add_sdpa(b, q, k, v, mask, _scale(b.scalar(4, None)), geometry)


@op("custom_sdpa.default", "llama.custom_sdpa.default", half=True)
def custom_sdpa(b):
    """[q, k_cache, v_cache, start_pos, attn_mask (None), dropout_p (0), is_causal, scale, out]."""
    q, k, v, start_pos = b.args[:4]
    if not b.is_none(4):
        raise NotImplementedError(f"{b.name}: an explicit attn_mask")
    if b.scalar(5, 0.0):
        raise NotImplementedError(f"{b.name}: dropout")
    causal = bool(b.scalar(6, False))

    def geometry(ctx):
        (batch, s, hq, dim), (_, context, hkv, _) = ctx.dims(q), ctx.dims(k)
        pos = ctx.int_value(start_pos)
        if pos < 0 or pos + s > context:
            b.fail(f"positions {pos}..{pos + s - 1} do not fit the cache of {context}")
        kv_strides = (context * hkv * dim, dim, hkv * dim)
        return batch, hq, s, hkv, pos + s, dim, (s * hq * dim, dim, hq * dim), kv_strides, pos + 1 if causal else 0

    _add_sdpa(b, q, k, v, None, _scale(b.scalar(7, None)), geometry)


@op(ATTENTION, ATTENTION_PACKED, half=True)
def attention(b):
    """pte_wgpu.attention: [q [..., S, D], k [..., L, D], v [..., L, D], scale (Double), out], the
    heads q's leading dims (k's and v's alike), each contiguous. pte_wgpu.attention_packed: [qkv
    [B, S, 3, H, D] (q, k and v its slices along dim 2: torch's multi-head attention's in-projection
    viewed), scale, out [B, S, H, D]], read and written in place."""
    packed = b.name == ATTENTION_PACKED
    q, k, v = [b.args[0]] * 3 if packed else b.args[:3]
    out = b.out
    dim = b.tensor(0).dims[-1]
    if tiled_shape(dim) is None:
        b.fail(f"head dim {dim}: the tiled kernel takes multiples of 4 up to 64, of 8 up to 128")
    scale = float(b.scalar(1 if packed else 3))
    shader = type_aliases(b.graph.values, QT=q, KCT=k, VCT=v, OT=out) + tiled_shader(False, dim, encoder=True)
    params, layout = b.params(48), b.params(64)
    d = b.dispatch(shader, [q, k, v, out, params, layout])
    rank = len(b.graph.values[out].dims)
    if packed and (len(b.tensor(0).dims) != 5 or b.tensor(0).dims[2] != 3 or rank != 4):
        b.fail(f"qkv of shape {b.tensor(0).dims} and an output of rank {rank}: expected [B, S, 3, H, D] and [B, S, H, D]")
    if not packed and rank not in (3, len(b.tensor(0).dims)):
        b.fail(f"an output of rank {rank} for q of rank {len(b.tensor(0).dims)}")

    def resize(ctx):
        if packed:
            batch, s, _, heads, _ = ctx.dims(q)
            keys, total = s, batch * heads
            g = dim // 4
            # rows of D: ((b * S + s) * 3 + c) * H + h in qkv, (b * S + s) * H + h in out
            rows = (heads, 3 * s * heads, 1, 3 * heads, 0, s * heads, 1, heads, 0, 3 * s * heads, 1, 3 * heads, heads * g, 2 * heads * g)
            out_dims = (batch, s, heads, dim)
        else:
            qd, kd, vd = ctx.dims(q), ctx.dims(k), ctx.dims(v)
            s, keys = qd[-2], kd[-2]
            total = numel_of(qd[:-2])
            if kd[-2:] != vd[-2:] or kd[-1] != dim or qd[-1] != dim or numel_of(kd[:-2]) != total or numel_of(vd[:-2]) != total:
                b.fail(f"q {tuple(qd)}, k {tuple(kd)} and v {tuple(vd)}: expected [..., S, {dim}] and two of [..., L, {dim}] with the same heads")
            rows = (total, 0, s, 1, 0, 0, s, 1, 0, 0, keys, 1, 0, 0)  # one batch of `total` heads, each its rows in turn
            out_dims = tuple(qd) if rank == len(qd) else (total, s, dim)  # out: q's shape, or bmm's [heads, S, D]
        ctx.set_params(params, struct.pack("<5If6I", s, keys, total, total, dim, scale, 0, 0, 0, 0, 0, 0))
        ctx.set_params(layout, struct.pack("<16I", *rows, 0, 0))
        ctx.set_grid(d, (total, -(-s // TILE_ROWS), 1))
        ctx.set_dims(out, out_dims)

    b.hook(resize)
