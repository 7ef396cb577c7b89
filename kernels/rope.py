"""Rotary position embeddings: `et_vk.apply_rotary_emb` (Llama's interleaved-pair layout).

x is [1, S, H, D]; freqs_cos and freqs_sin are [S, D/2] rows for the live positions (sliced
upstream), and pairs (2i, 2i+1) of each head rotate by frequency i.
"""

import struct

from resize.shapes import numel_of

from .registry import op
from .wgsl import FLAT_INDEX, WG, flat_grid

ROPE = """
struct P {{ pairs: u32, heads: u32, half: u32, pad: u32 }}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> fcos: array<f32>;
@group(0) @binding(2) var<storage, read> fsin: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: P;
{FLAT_INDEX}
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let i = flat_index(gid, nwg, {WG}u);
    if (i >= p.pairs) {{ return; }}
    let k = i % p.half;            // frequency index
    let row = i / p.half;          // (b, s, h) row
    let s = (row / p.heads);       // position row in the freqs table (batch 1)
    let c = fcos[s * p.half + k];
    let sn = fsin[s * p.half + k];
    let base = row * p.half * 2u;
    let ia = 2u * k;
    let ib = 2u * k + 1u;
    let a = x[base + ia];
    let b = x[base + ib];
    out[base + ia] = a * c - b * sn;
    out[base + ib] = a * sn + b * c;
}}
"""
SHADER = ROPE.format(FLAT_INDEX=FLAT_INDEX, WG=WG)


@op("et_vk.apply_rotary_emb.default")
def apply_rotary_emb(b):
    xq, xk, fcos, fsin = b.args[:4]
    outs = b.graph.values[b.out].items
    jobs = []
    for src, dst in ((xq, outs[0]), (xk, outs[1])):
        params = b.params(16)
        jobs.append((src, dst, params, b.dispatch(SHADER, [src, fcos, fsin, dst, params])))

    def resize(ctx):
        for src, dst, params, d in jobs:
            shape = ctx.dims(src)
            if len(shape) != 4 or shape[0] != 1:
                raise ValueError(f"{b.name}: expected x of shape [1, S, H, D], got {list(shape)}")
            _, s, heads, dim = shape
            half = dim // 2
            if ctx.dims(fcos)[0] < s or ctx.dims(fcos)[-1] != half:
                raise ValueError(
                    f"{b.name}: the rotary table has {ctx.dims(fcos)[0]} rows for {s} positions "
                    "(are the positions past the context?)"
                )
            pairs = numel_of(shape) // 2
            ctx.set_params(params, struct.pack("<4I", pairs, heads, half, 0))
            ctx.set_grid(d, flat_grid(pairs))
            ctx.set_dims(dst, shape)

    b.hook(resize)
