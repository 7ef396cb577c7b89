"""`sdpa_with_kv_cache`: writes this step's K and V into the session's caches at the live position,
then causal attention of the S query rows over the cache prefix, with grouped-query heads.

The attention kernel streams the keys in chunks with an online softmax, so no scores matrix is
ever materialized, whatever the context length: one workgroup per (query head, query row).
"""

import math
import struct

from resize.shapes import numel_of

from .registry import op
from .wgsl import FLAT_INDEX, WG, flat_grid

MAX_HEAD_DIM = 256
CHUNK = 64  # keys per chunk = workgroup size

UPDATE_CACHE = f"""
struct P {{ n: u32, offset: u32, pad0: u32, pad1: u32 }}
@group(0) @binding(0) var<storage, read> k: array<f32>;
@group(0) @binding(1) var<storage, read> v: array<f32>;
@group(0) @binding(2) var<storage, read_write> kc: array<f32>;
@group(0) @binding(3) var<storage, read_write> vc: array<f32>;
@group(0) @binding(4) var<uniform> p: P;
{FLAT_INDEX}
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let i = flat_index(gid, nwg, {WG}u);
    if (i >= p.n) {{ return; }}
    kc[p.offset + i] = k[i];
    vc[p.offset + i] = v[i];
}}
"""

ATTENTION = f"""
struct P {{ s: u32, pos: u32, hq: u32, hkv: u32, d: u32, scale: f32, pad0: u32, pad1: u32 }}
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<f32>;
@group(0) @binding(2) var<storage, read> vc: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: P;
var<workgroup> qs: array<f32, {MAX_HEAD_DIM}>;
var<workgroup> probs: array<f32, {CHUNK}>;
var<workgroup> red: array<f32, {CHUNK}>;

fn reduce_max(t: u32) -> f32 {{
    for (var stride = {CHUNK // 2}u; stride > 0u; stride = stride / 2u) {{
        if (t < stride) {{ red[t] = max(red[t], red[t + stride]); }}
        workgroupBarrier();
    }}
    return red[0];
}}

fn reduce_sum(t: u32) -> f32 {{
    for (var stride = {CHUNK // 2}u; stride > 0u; stride = stride / 2u) {{
        if (t < stride) {{ red[t] = red[t] + red[t + stride]; }}
        workgroupBarrier();
    }}
    return red[0];
}}

@compute @workgroup_size({CHUNK})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{
    let h = wid.x;
    let s = wid.y;
    let t = lid.x;
    let kvh = h / (p.hq / p.hkv);
    let row = (s * p.hq + h) * p.d;
    for (var d = t; d < p.d; d = d + {CHUNK}u) {{ qs[d] = q[row + d] * p.scale; }}
    workgroupBarrier();
    let keys = p.pos + s + 1u;  // causal: absolute position pos + s sees keys 0..pos + s
    var m = -3.0e38;
    var l = 0.0;
    var acc = array<f32, {MAX_HEAD_DIM // CHUNK}>();
    for (var base = 0u; base < keys; base = base + {CHUNK}u) {{
        let j = base + t;
        var score = -3.0e38;
        if (j < keys) {{
            let kbase = (j * p.hkv + kvh) * p.d;
            var dot = 0.0;
            for (var d = 0u; d < p.d; d = d + 1u) {{ dot = dot + qs[d] * kc[kbase + d]; }}
            score = dot;
        }}
        red[t] = score;
        workgroupBarrier();
        let m_new = max(m, reduce_max(t));
        workgroupBarrier();
        let e = select(0.0, exp(score - m_new), j < keys);
        probs[t] = e;
        red[t] = e;
        workgroupBarrier();
        let total = reduce_sum(t);
        let corr = exp(m - m_new);
        l = l * corr + total;
        let n = min({CHUNK}u, keys - base);
        for (var c = 0u; c < {MAX_HEAD_DIM // CHUNK}u; c = c + 1u) {{
            let d = t + c * {CHUNK}u;
            if (d < p.d) {{
                var sum = 0.0;
                for (var jj = 0u; jj < n; jj = jj + 1u) {{
                    sum = sum + probs[jj] * vc[((base + jj) * p.hkv + kvh) * p.d + d];
                }}
                acc[c] = acc[c] * corr + sum;
            }}
        }}
        m = m_new;
        workgroupBarrier();
    }}
    for (var c = 0u; c < {MAX_HEAD_DIM // CHUNK}u; c = c + 1u) {{
        let d = t + c * {CHUNK}u;
        if (d < p.d) {{ out[row + d] = acc[c] / l; }}
    }}
}}
"""


@op("sdpa_with_kv_cache.default")
def sdpa_with_kv_cache(b):
    q, k, v, k_cache, v_cache, input_pos = b.args[:6]
    if not b.is_none(7):
        raise ValueError("sdpa_with_kv_cache: an explicit attn_mask is not supported (causal only)")
    if b.scalar(8, 0):
        raise ValueError("sdpa_with_kv_cache: dropout is not supported")
    _, context, hkv, dim = b.tensor(3).dims
    hq = b.tensor(0).dims[2]
    if dim > MAX_HEAD_DIM or hq % hkv:
        raise ValueError(f"sdpa_with_kv_cache: head dim {dim} (max {MAX_HEAD_DIM}) or heads {hq}/{hkv} unsupported")
    scale = b.scalar(10, None)
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    b.writes(k_cache)
    b.writes(v_cache)
    p_update, p_attn = b.params(16), b.params(32)
    d_update = b.dispatch(UPDATE_CACHE, [k, v, k_cache, v_cache, p_update])
    d_attn = b.dispatch(ATTENTION, [q, k_cache, v_cache, b.out, p_attn])

    def resize(ctx):
        shape = ctx.dims(q)
        s = shape[1]
        pos = ctx.int_value(input_pos)
        if ctx.dims(k)[1] != s or ctx.dims(v)[1] != s:
            raise ValueError(f"sdpa_with_kv_cache: q, k, v have {s}, {ctx.dims(k)[1]}, {ctx.dims(v)[1]} rows")
        if pos < 0 or pos + s > context:
            raise ValueError(
                f"sdpa_with_kv_cache: positions {pos}..{pos + s - 1} do not fit the KV cache of {context} positions"
            )
        n = numel_of(ctx.dims(k))
        ctx.set_params(p_update, struct.pack("<4I", n, pos * hkv * dim, 0, 0))
        ctx.set_grid(d_update, flat_grid(n))
        ctx.set_params(p_attn, struct.pack("<5If2I", s, pos, hq, hkv, dim, scale, 0, 0))
        ctx.set_grid(d_attn, (hq, s, 1))
        ctx.set_dims(b.out, shape)

    b.hook(resize)
