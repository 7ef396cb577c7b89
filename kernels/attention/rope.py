"""Rotary position embeddings: `et_vk.apply_rotary_emb` (Llama's interleaved-pair layout), and the
`_hf` (rotate-half) and `_interleaved` (EdgeTAM, one tensor of cos/sin pairs) variants.

In `apply_rotary_emb`, x is [1, S, H, D]; freqs_cos and freqs_sin are [S, D/2] rows for the live
positions (sliced upstream), and pairs (2i, 2i+1) of each head rotate by frequency i.

Each tensor is read and written in its own storage type (f32 or f16, named by WGSL aliases); the
rotation is computed in f32.
"""

import struct
from dataclasses import dataclass

from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..wgsl import FLAT_INDEX, WG, fill, flat_grid, flat_kernel, rounded, type_aliases
from .kv_cache import CACHE_AT, cache_at, table_entries

# One dispatch rotates both q and k: invocations past q's pairs continue into k's. The ragged
# form (`pte_wgpu.rope_into_cache`) also stores this step's rotated k, and v, in the KV caches as
# ragged_sdpa's own update would (kernels/attention/kv_cache_sdpa.py RAGGED_UPDATE_CACHE), which then skips it.
ROPE = """
struct P { q_pairs: u32, pairs: u32, q_heads: u32, k_heads: u32, half: u32, row: u32, blocks: u32, pad: u32 }
$CACHE_BINDINGS
@group(0) @binding(0) var<storage, read> xq: array<XQT>;
@group(0) @binding(1) var<storage, read> xk: array<XKT>;
@group(0) @binding(2) var<storage, read> fcos: array<CT>;
@group(0) @binding(3) var<storage, read> fsin: array<ST>;
@group(0) @binding(4) var<storage, read_write> oq: array<OQT>;
@group(0) @binding(5) var<storage, read_write> ok: array<OKT>;
@group(0) @binding(6) var<uniform> p: P;
$FLAT_INDEX
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let g = flat_index(gid, nwg, ${WG}u);
    if (g >= p.pairs) { return; }
    let in_q = g < p.q_pairs;
    var i = g;
    var heads = p.q_heads;
    if (!in_q) { i = g - p.q_pairs; heads = p.k_heads; }
    let k = i % p.half;            // frequency index
    let row = i / p.half;          // (b, s, h) row
    let s = row / heads;           // position row in the freqs table (batch 1)
    let c = f32(fcos[s * p.half + k]);
    let sn = f32(fsin[s * p.half + k]);
    let ia = row * p.half * 2u + 2u * k;
    if (in_q) {
        let a = f32(xq[ia]);
        let b = f32(xq[ia + 1u]);
        oq[ia] = OQT(a * c - b * sn);
        oq[ia + 1u] = OQT(a * sn + b * c);
    } else {
        let a = f32(xk[ia]);
        let b = f32(xk[ia + 1u]);
        ok[ia] = OKT(a * c - b * sn);
        ok[ia + 1u] = OKT(a * sn + b * c);$CACHE_STORE
    }
}
"""
SHADER = fill(ROPE, FLAT_INDEX=FLAT_INDEX, WG=WG, CACHE_BINDINGS="", CACHE_STORE="")
CACHE_BINDINGS = """
@group(0) @binding(7) var<storage, read> v: array<VT>;
@group(0) @binding(8) var<storage, read_write> kc: array<KCT>;
@group(0) @binding(9) var<storage, read_write> vc: array<VCT>;
@group(0) @binding(10) var<storage, read> row_pos: array<i32>;
@group(0) @binding(11) var<storage, read> row_seq: array<i32>;
@group(0) @binding(12) var<storage, read> seq_blocks: array<i32>;
""" + CACHE_AT
CACHE_STORE = """
        let r = ia / p.row;  // the pass's token row
        if (row_seq[r] >= 0) {  // not a padding row
            let at = cache_at(r, ia % p.row);
            kc[at] = KCT(ok[ia]);
            kc[at + 1u] = KCT(ok[ia + 1u]);
            vc[at] = VCT(v[ia]);
            vc[at + 1u] = VCT(v[ia + 1u]);
        }"""
SHADER_CACHE = fill(ROPE, FLAT_INDEX=FLAT_INDEX, WG=WG, CACHE_BINDINGS=CACHE_BINDINGS, CACHE_STORE=CACHE_STORE)


@op("et_vk.apply_rotary_emb.default", "pte_wgpu.rope_into_cache", half=True)
def apply_rotary_emb(b):
    """`pte_wgpu.rope_into_cache` takes (v, k_cache, v_cache, row_pos, row_seq, seq_blocks) after the four."""
    xq, xk = b.args[:2]
    oq, ok = b.graph.values[b.out].items[:2]
    set_rope = rope_route(b, b.args[:-1], oq, ok)

    def resize(ctx):
        shapes = []
        for src in (xq, xk):
            shape = ctx.dims(src)
            if len(shape) != 4 or shape[0] != 1:
                b.fail(f"expected x of shape [1, S, H, D], got {list(shape)}")
            shapes.append(shape)
        set_rope(ctx, *shapes)

    b.hook(resize)


def rope_dispatch(b, shaders, args, oq, ok, params, cache_args):
    """The dispatch of a RoPE's `shaders` (plain, storing into the caches) rotating `args` (xq, xk,
    fcos, fsin) into `oq` and `ok`, and where `cache_args` (v, k_cache, v_cache, row_pos, row_seq,
    seq_blocks) are given storing k and v in the paged caches, which it then writes; returns
    (dispatch, row, blocks): the caches' floats a position and a sequence's table entries (0 without)."""
    xq, xk, fcos, fsin = args
    names, row, blocks = dict(XQT=xq, XKT=xk, CT=fcos, ST=fsin, OQT=oq, OKT=ok), 0, 0
    if cache_args:
        v, k_cache, v_cache = cache_args[:3]
        _, context, hkv, dim = b.graph.values[k_cache].dims
        row, blocks = hkv * dim, table_entries(context)
        b.writes(k_cache)
        b.writes(v_cache)
        names.update(VT=v, KCT=k_cache, VCT=v_cache)
    shader = type_aliases(b.graph.values, **names) + shaders[bool(cache_args)]
    return b.dispatch(shader, [xq, xk, fcos, fsin, oq, ok, params, *cache_args]), row, blocks


def rope_route(b, args, oq, ok):
    """The dispatch rotating q and k (`args`: xq, xk, fcos, fsin, and with v, k_cache, v_cache,
    row_pos, row_seq, seq_blocks after them storing k and v in the caches) into `oq` and `ok`; returns
    `set(ctx, q_shape, k_shape, on=True)` for shapes [1, S, H, D] (the grid off unless `on`)."""
    fcos = args[2]
    params = b.params(32)
    d, row, blocks = rope_dispatch(b, (SHADER, SHADER_CACHE), args[:4], oq, ok, params, args[4:10])

    def set_rope(ctx, q_shape, k_shape, on=True):
        (_, s, q_heads, dim), (_, s_k, k_heads, dim_k) = q_shape, k_shape
        half = dim // 2
        if (s_k, dim_k) != (s, dim):
            b.fail(f"q {list(q_shape)} and k {list(k_shape)} differ in positions or head size")
        table = ctx.dims(fcos)
        if table[0] < s or table[-1] != half:
            b.fail(f"the rotary table has {table[0]} rows for {s} positions (are the positions past the context?)")
        q_pairs = numel_of(q_shape) // 2
        pairs = q_pairs + numel_of(k_shape) // 2
        if row and k_heads * dim != row:
            b.fail(f"k rows of {k_heads} x {dim} do not match the cache's {row}")
        ctx.set_params(params, struct.pack("<8I", q_pairs, pairs, q_heads, k_heads, half, row, blocks, 0))
        ctx.set_grid(d, flat_grid(pairs) if on else (0, 0, 0))
        ctx.set_dims(oq, q_shape)
        ctx.set_dims(ok, k_shape)

    return set_rope


# The same rotation and cache stores in the epilogue of a q/k/v GEMV (kernels/matmul/qkv_rope.py), whose
# invocation for output n of a pair also holds the pair's other output.
@dataclass
class RopeEpilogue:
    """What q/k/v products that take the RoPE (kernels/matmul/qkv_rope.py) add to their GEMV on GPUs:
    after its uniform, the bindings `values` (fcos, fsin, rotated q, rotated k, k cache, v cache,
    row_pos, row_seq, seq_blocks) of storage `types`, and the uniform's fields half, dim, row, blocks
    (as ROPE's p). With `hf`, the rotate-half RoPE of a head's first rd = 2 half dims (tables
    [rows, rd]) over q and k weights whose rows were paired at load (kernels/fusion.py's
    _pair_rotary_rows): the products' outputs 2i and 2i + 1 of a head are its dims i and
    i + rd / 2 (i < rd / 2), the rest its dims from rd. `lean`: nothing reads the products or
    rotated k after (the ragged pass's attention finds k and v in the caches), so the epilogue
    writes rotated q and the caches alone, and binds neither the products nor rotated k (`bound`
    leaves it out): 4 storage buffers fewer (LEAN_UNBOUND), which lets Dawn's 16 hold a
    normalizing 4-bit q/k/v group with its RoPE. `values` and `types` are in ROPE_NAMES' order."""

    values: list
    types: list
    fields: tuple
    hf: bool = False
    lean: bool = False

    @property
    def names(self):
        """The names of the epilogue's bindings."""
        return tuple(name for name in ROPE_NAMES if not (self.lean and name == "ok"))

    @property
    def bound(self):
        """The values the epilogue binds, in its bindings' order."""
        return [v for name, v in zip(ROPE_NAMES, self.values) if name in self.names]


ROPE_NAMES = ("fcos", "fsin", "oq", "ok", "kc", "vc", "row_pos", "row_seq", "seq_blocks")
LEAN_UNBOUND = 4  # the bindings a lean epilogue leaves out: the three products and rotated k


def rope_bindings(first, rope):
    """The epilogue's bindings from `first`, and the paged caches' `cache_at`."""
    types = dict(zip(ROPE_NAMES, rope.types))
    lines = [
        f"@group(0) @binding({first + i}) var<storage, {'read_write' if name in ('oq', 'ok', 'kc', 'vc') else 'read'}> {name}: array<{types[name]}>;"
        for i, name in enumerate(rope.names)
    ]
    return "\n" + "\n".join(lines) + cache_at("q")


def rope_store(j, row, t, rope, biased=False, products=True):
    """Output n of q (j 0), k (1) or v (2) of input row `row` (WGSL) as the RoPE's own kernel leaves
    it (SHADER_CACHE, or with `rope.hf` SHADERS_HF[True]: the same expressions on
    the same values: the product, plus its bias where `biased` (bias{j}, as the plain linear adds
    it), rounded to its type `t`, then f32): q and k rotated with the other output of their pair
    (pair0), k and v also in the caches. The products themselves are stored too (every binding is
    used: the pipeline's layout keeps them all) where `products` (a caller storing them itself:
    not), unless the epilogue is `lean`, which stores rotated q and the caches alone (k rounded to
    rotated k's type all the same)."""
    _, _, oq, ok, kc, vc, _, _, _ = rope.types
    row = f"let row = {row};"
    mine, other = (f"v0 + f32(bias{j}[n])", f"pair0 + f32(bias{j}[n ^ 1u])") if biased else ("v0", "pair0")

    def cache(name, value, at="n"):
        return f"if (row_seq[row] >= 0) {{ {name}[cache_at(row, {at})] = {value}; }}"

    if j == 2:
        product = "" if rope.lean or not products else "o2[row * q.N2 + n] = x; "
        return f"{{ {row} let x = {t}({mine}); {product}{cache('vc', f'{vc}(x)')} }}"
    out, ot = (("oq", oq), ("ok", ok))[j]
    if rope.hf:  # output n is dim d of its head: 2i -> i, 2i + 1 -> i + rd / 2 below rd = 2 q.half (at: its place in q or k)
        rotate = (
            "let hd = n % q.dim; let rotates = hd < 2u * q.half; let first = (hd & 1u) == 0u; "
            "let d = select(hd, select(q.half, 0u, first) + hd / 2u, rotates); let at = n - hd + d; "
            f"let mine = {rounded(mine, t)}; let other = {rounded(other, t)}; var y = mine; "
            "if (rotates) { let fi = row * 2u * q.half + d; let partner = select(other, -other, first); "
            f"y = {hf_rotation('mine', 'partner', 'fi')}; }}"
        )
    else:
        rotate = (
            f"let at = n; let fi = row * q.half + (n % q.dim) / 2u; let c = f32(fcos[fi]); let sn = f32(fsin[fi]); "
            f"let mine = {rounded(mine, t)}; let other = {rounded(other, t)}; let even = (n & 1u) == 0u; "
            "let ev = select(other, mine, even); let od = select(mine, other, even); "
            "var y = ev * sn + od * c; if (even) { y = ev * c - od * sn; }"
        )
    stored = cache("kc", f"{kc}({ot}(y))", "at") if j == 1 else ""
    product = "" if rope.lean or not products else f"o{j}[row * q.N{j} + n] = {t}({mine}); "
    rotated = "" if rope.lean and j == 1 else f"{out}[row * q.N{j} + at] = {ot}(y); "
    return f"{{ {row} {rotate} {product}{rotated}{stored} }}"


# `et_vk.apply_rotary_emb_hf` (HuggingFace rotate-half): the first `rd` dims of each head rotate,
# dim d < rd/2 pairing with d + rd/2; the rest pass through. cos and sin are [rows, rd] tables,
# read at row start_pos + s (the full table and a SymInt start_pos, or a slice and 0). One dispatch
# rotates q and k: invocations past q's elements continue into k's. Its ragged form
# (`pte_wgpu.rope_hf_into_cache`) stores this step's k, and v, in the KV caches as ROPE's does.
# The paired form reads q and k as products of paired weight rows leave them (RopeEpilogue's `hf`:
# dims d and d + rd/2 side by side at 2d and 2d + 1) and writes them in the heads' order.
HF = flat_kernel(
    "numel: u32, q_numel: u32, dim: u32, q_heads: u32, k_heads: u32, seq: u32, rd: u32, start: u32, row: u32, blocks: u32, pad0: u32, pad1: u32",
    [("xq", "XQT", "read"), ("xk", "XKT", "read"), ("fcos", "CT", "read"), ("fsin", "ST", "read"), ("oq", "OQT", "read_write"), ("ok", "OKT", "read_write")],
    """
    let in_q = i < p.q_numel;
    let j = select(i - p.q_numel, i, in_q);
    let d = j % p.dim;
    let half = p.rd / 2u;
    let s = (j / p.dim / select(p.k_heads, p.q_heads, in_q)) % p.seq;
    let t = (p.start + s) * p.rd + d;
    var y = element(in_q, j);
    if (d < p.rd) {
        var partner: f32;
        if (d < half) { partner = -element(in_q, j + half); } else { partner = element(in_q, j - half); }
        y = $ROTATION;
    }
    if (in_q) { oq[j] = OQT(y); } else { ok[j] = OKT(y);$CACHE_STORE }
""",
    count="numel",
    declarations="$CACHE_BINDINGS",
    functions="fn element(in_q: bool, j: u32) -> f32 { let at = $AT; if (in_q) { return f32(xq[at]); } return f32(xk[at]); }\n$PAIRED",
)


def hf_rotation(y, partner, t):
    """WGSL: value `y` rotated by the rotate-half RoPE with its pair's value `partner` (negated for
    the first half's dims) at table entry `t` of fcos and fsin: every kernel that rotates so writes
    this expression, so that their results are the same bits."""
    return f"{y} * f32(fcos[{t}]) + {partner} * f32(fsin[{t}])"


PAIRED = """fn paired(j: u32) -> u32 {  // where dim d of j's head lies in paired rows
    let d = j % p.dim;
    let half = p.rd / 2u;
    if (d >= p.rd) { return j; }
    return j - d + select(2u * (d - half) + 1u, 2u * d, d < half);
}
"""
HF_CACHE_STORE = """
        let r = j / p.row;  // the pass's token row
        if (row_seq[r] >= 0) {  // not a padding row
            let at = cache_at(r, j % p.row);
            kc[at] = KCT(OKT(y));
            vc[at] = VCT(v[j]);
        }
   """
SHADERS_HF = {
    paired: tuple(fill(HF, CACHE_BINDINGS=bindings, CACHE_STORE=store, AT="paired(j)" if paired else "j", PAIRED=PAIRED if paired else "",
                       ROTATION=hf_rotation("y", "partner", "t"))
                  for bindings, store in (("", ""), (CACHE_BINDINGS, HF_CACHE_STORE)))
    for paired in (False, True)
}  # fmt: skip


@op("et_vk.apply_rotary_emb_hf.default", "pte_wgpu.rope_hf_into_cache", half=True)
def apply_rotary_emb_hf(b):
    """`pte_wgpu.rope_hf_into_cache` takes (v, k_cache, v_cache, row_pos, row_seq, seq_blocks) after the five."""
    xq, xk = b.args[:2]
    oq, ok = b.graph.values[b.out].items[:2]
    set_rope = rope_hf_route(b, (*b.args[:4], *b.args[5:-1]), b.args[4], oq, ok)
    b.hook(lambda ctx: set_rope(ctx, ctx.dims(xq), ctx.dims(xk)))


def rope_hf_route(b, args, start_pos, oq, ok, paired=False):
    """The dispatch of the rotate-half RoPE as rope_route's, from table row `start_pos` (a value;
    None: 0); with `paired`, over q and k of paired rows (SHADERS_HF)."""
    fcos = args[2]
    params = b.params(48)
    d, row, blocks = rope_dispatch(b, SHADERS_HF[paired], args[:4], oq, ok, params, args[4:10])

    def set_rope(ctx, q_shape, k_shape, on=True):
        rows, rd = ctx.dims(fcos)
        start = 0 if start_pos is None else ctx.int_value(start_pos)
        for shape in (q_shape, k_shape):
            if len(shape) != 4 or rd % 2 or rd > shape[3]:
                b.fail(f"x of shape {list(shape)} with a rotary table of width {rd}")
        (_, s, q_heads, dim), (_, s_k, k_heads, dim_k) = q_shape, k_shape
        if (s_k, dim_k) != (s, dim):
            b.fail(f"q {list(q_shape)} and k {list(k_shape)} differ in positions or head size")
        if start < 0 or start + s > rows:
            b.fail(f"the rotary table has {rows} rows for positions {start}..{start + s - 1} (are the positions past the context?)")
        if row and k_heads * dim != row:
            b.fail(f"k rows of {k_heads} x {dim} do not match the cache's {row}")
        q_numel = numel_of(q_shape)
        numel = q_numel + numel_of(k_shape)
        ctx.set_params(params, struct.pack("<12I", numel, q_numel, dim, q_heads, k_heads, s, rd, start, row, blocks, 0, 0))
        ctx.set_grid(d, flat_grid(numel) if on else (0, 0, 0))
        ctx.set_dims(oq, q_shape)
        ctx.set_dims(ok, k_shape)

    return set_rope


# `et_vk.apply_rotary_emb_interleaved` (EdgeTAM): x is [B, N, C] with (real, imag) pairs along C;
# freqs_cis, of any rank, holds N * C values laid out as [N, C/2, (cos, sin)].
SHADER_INTERLEAVED = flat_kernel(
    "pairs: u32, half: u32, n: u32, pad: u32",
    [("x", "XT", "read"), ("cis", "CT", "read"), ("out", "OT", "read_write")],
    """
    let f = ((i / p.half) % p.n * p.half + i % p.half) * 2u;
    let c = f32(cis[f]);
    let sn = f32(cis[f + 1u]);
    let a = f32(x[2u * i]);
    let b = f32(x[2u * i + 1u]);
    out[2u * i] = OT(a * c - b * sn);
    out[2u * i + 1u] = OT(a * sn + b * c);
""",
    count="pairs",
)


@op("et_vk.apply_rotary_emb_interleaved.default", half=True)
def apply_rotary_emb_interleaved(b):
    x, cis = b.args[:2]
    params = b.params(16)
    d = b.dispatch(type_aliases(b.graph.values, XT=x, CT=cis, OT=b.out) + SHADER_INTERLEAVED, [x, cis, b.out, params])

    def resize(ctx):
        shape = ctx.dims(x)
        if len(shape) != 3 or shape[2] % 2:
            b.fail(f"expected x of shape [B, N, C] with an even C, got {list(shape)}")
        _, n, c = shape
        if numel_of(ctx.dims(cis)) != n * c:
            b.fail(f"freqs_cis of shape {list(ctx.dims(cis))} for x of shape {list(shape)}")
        pairs = numel_of(shape) // 2
        ctx.set_params(params, struct.pack("<4I", pairs, c // 2, n, 0))
        ctx.set_grid(d, flat_grid(pairs))
        ctx.set_dims(b.out, shape)

    b.hook(resize)
