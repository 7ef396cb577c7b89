"""Prototype: query-tiled attention whose two products run as 4 x 4 register tiles (the GEMM
template's outer products), head dim 64. A workgroup of 128 invocations takes 32 query rows of one
head; per block of 64 keys: K^T into workgroup memory, scores S = Q K^T (rows 4ty.., keys 4tx..),
the block's row maxima through workgroup memory, P = exp(S - m) written as [key][row quad], V into
the same memory K held, O += P V (rows 4ty.., dims 4tx..). 32 KB of workgroup memory."""
from pte_wgpu.kernels.attention import kv_cache_sdpa as K
from pte_wgpu.kernels.wgsl import fill

# Both variants' entry: the workgroup's head and 32 rows (the last, longest tile first), an invocation's place
ENTRY = """@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let h = wid.x;
    let r0 = ((p.s + 31u) / 32u - 1u - wid.y) * 32u;
    let r_end = min(r0 + 32u, p.s);
    let tx = t % 16u;
    let ty = t / 16u;
    let kvh = h / (p.hq / p.hkv);"""
# Both variants' online softmax of a block: the rows' new maxima from the block's (mb), the probabilities
# of the invocation's scores, its part of the rows' sums and its sums of the weighted V rescaled
SOFTMAX = """        let mn = max(vec4<f32>(m0, m1, m2, m3), mb);
        let corr = exp(vec4<f32>(m0, m1, m2, m3) - mn);
        m0 = mn.x; m1 = mn.y; m2 = mn.z; m3 = mn.w;
        let p0 = select(vec4<f32>(0.0), exp(s0 - m0), v0);
        let p1 = select(vec4<f32>(0.0), exp(s1 - m1), v1);
        let p2 = select(vec4<f32>(0.0), exp(s2 - m2), v2);
        let p3 = select(vec4<f32>(0.0), exp(s3 - m3), v3);
        l = l * corr + vec4<f32>((p0.x + p0.y) + (p0.z + p0.w), (p1.x + p1.y) + (p1.z + p1.w), (p2.x + p2.y) + (p2.z + p2.w), (p3.x + p3.y) + (p3.z + p3.w));
        o0 = o0 * corr.x; o1 = o1 * corr.y; o2 = o2 * corr.z; o3 = o3 * corr.w;"""
# Both variants' end: each row's weighted sum over its total, written by the invocations of its dims
WRITES = """    let w = max(tot, vec4<f32>(1e-30));
    let os = array<vec4<f32>, 4>(o0 / w.x, o1 / w.y, o2 / w.z, o3 / w.w);
    for (var i = 0u; i < 4u; i = i + 1u) {
        let row = rowa + i;
        if (row < p.s) {
            let o = $OUT_ROW * 64u + 4u * tx;
            out[o] = OT(os[i].x); out[o + 1u] = OT(os[i].y); out[o + 2u] = OT(os[i].z); out[o + 3u] = OT(os[i].w);
        }
    }
}
"""


def layout(encoder):
    """The fill values both variants share: where rows and keys are read and written (kv_cache_sdpa.py's
    CACHE_ROWS or ENCODER_ROWS), the key bound, each of an invocation's 4 rows' key count, ENTRY, SOFTMAX and WRITES."""
    q_row, out_row, key_row = K.ENCODER_ROWS if encoder else K.CACHE_ROWS
    k_at, v_at = ("at + e.k4", "at + e.v4") if encoder else ("at", "at")
    limits = "    let kmax = p.pos;" if encoder else "    let kmax = p.pos + r_end;"
    keys = ["p.pos"] * 4 if encoder else [f"p.pos + rowa + {i + 1}u" for i in range(4)]
    return dict(TABLES=K.ENCODER_LAYOUT if encoder else K.PLAIN_KEYS, Q_ROW=q_row, KEY_ROW=key_row, K_AT=k_at, V_AT=v_at, LIMITS=limits,
                KEYS0=keys[0], KEYS1=keys[1], KEYS2=keys[2], KEYS3=keys[3], WRITES=fill(WRITES, OUT_ROW=out_row), SOFTMAX=SOFTMAX, ENTRY=ENTRY)


SRC = K.VEC4_BINDINGS + """$TABLES
// Rows of 16 vec4s with their vec4s swizzled, slot dq ^ (row % 16) (P's: slot ty ^ (key % 8)), so that
// invocations reading or writing the same slot of neighbouring rows hit different banks.
var<workgroup> qs: array<vec4<f32>, 512>;   // [row][16]: Q * scale
var<workgroup> kv: array<vec4<f32>, 1024>;  // K as [key][16], then V as [key][16]
var<workgroup> ps: array<vec4<f32>, 512>;   // the rows' partial maxima [row][16 floats], then P as [key][row quad]

$ENTRY
    for (var i = t; i < 512u; i = i + 128u) {  // q: 32 rows x 16 vec4
        let rr = i / 16u;
        let r = min(r0 + rr, p.s - 1u);
        let qi = $Q_ROW * 64u + 4u * (i % 16u);
        qs[i] = vec4<f32>(f32(q[qi]), f32(q[qi + 1u]), f32(q[qi + 2u]), f32(q[qi + 3u])) * p.scale;
    }
    var m0 = -3.0e38; var m1 = -3.0e38; var m2 = -3.0e38; var m3 = -3.0e38;
    var l = vec4<f32>(0.0);
    var o0 = vec4<f32>(0.0); var o1 = vec4<f32>(0.0); var o2 = vec4<f32>(0.0); var o3 = vec4<f32>(0.0);
    let rowa = r0 + 4u * ty;
$LIMITS
    let seq = 0u;
    let kj = vec4<u32>(tx, tx + 16u, tx + 32u, tx + 48u);  // this invocation's keys of a block
    for (var kb = 0u; kb < kmax; kb = kb + 64u) {
        for (var i = t; i < 1024u; i = i + 128u) {
            let key = i / 16u;
            let j = min(kb + key, kmax - 1u);
            let at = $KEY_ROW * 16u + i % 16u;
            kv[key * 16u + ((i % 16u) ^ (key % 16u))] = vec4<f32>(kc[$K_AT]);
        }
        workgroupBarrier();
        var s0 = vec4<f32>(0.0); var s1 = vec4<f32>(0.0); var s2 = vec4<f32>(0.0); var s3 = vec4<f32>(0.0);
        for (var dq = 0u; dq < 16u; dq = dq + 1u) {
            let x0 = qs[(4u * ty) * 16u + dq]; let x1 = qs[(4u * ty + 1u) * 16u + dq];
            let x2 = qs[(4u * ty + 2u) * 16u + dq]; let x3 = qs[(4u * ty + 3u) * 16u + dq];
            let sw = dq ^ tx;
            let y0 = kv[kj.x * 16u + sw]; let y1 = kv[kj.y * 16u + sw]; let y2 = kv[kj.z * 16u + sw]; let y3 = kv[kj.w * 16u + sw];
            s0 = s0 + vec4<f32>(dot(x0, y0), dot(x0, y1), dot(x0, y2), dot(x0, y3));
            s1 = s1 + vec4<f32>(dot(x1, y0), dot(x1, y1), dot(x1, y2), dot(x1, y3));
            s2 = s2 + vec4<f32>(dot(x2, y0), dot(x2, y1), dot(x2, y2), dot(x2, y3));
            s3 = s3 + vec4<f32>(dot(x3, y0), dot(x3, y1), dot(x3, y2), dot(x3, y3));
        }
        let kk = kb + kj;
        let v0 = kk < vec4<u32>($KEYS0); let v1 = kk < vec4<u32>($KEYS1); let v2 = kk < vec4<u32>($KEYS2); let v3 = kk < vec4<u32>($KEYS3);
        s0 = select(vec4<f32>(-3.0e38), s0, v0); s1 = select(vec4<f32>(-3.0e38), s1, v1);
        s2 = select(vec4<f32>(-3.0e38), s2, v2); s3 = select(vec4<f32>(-3.0e38), s3, v3);
        let f = 64u * ty + tx;  // red[row 4ty + i][tx] at float f + 16 i
        ps[f / 4u][f % 4u] = max(max(s0.x, s0.y), max(s0.z, s0.w));
        ps[(f + 16u) / 4u][f % 4u] = max(max(s1.x, s1.y), max(s1.z, s1.w));
        ps[(f + 32u) / 4u][f % 4u] = max(max(s2.x, s2.y), max(s2.z, s2.w));
        ps[(f + 48u) / 4u][f % 4u] = max(max(s3.x, s3.y), max(s3.z, s3.w));
        workgroupBarrier();
        for (var i = t; i < 1024u; i = i + 128u) {
            let key = i / 16u;
            let j = min(kb + key, kmax - 1u);
            let at = $KEY_ROW * 16u + i % 16u;
            kv[key * 16u + ((i % 16u) ^ (key % 16u))] = vec4<f32>(vc[$V_AT]);
        }
        var mb = vec4<f32>(-3.0e38);
        for (var c = 0u; c < 4u; c = c + 1u) {
            let b = 16u * ty + c;
            mb = max(mb, vec4<f32>(ps[b].x, ps[b + 4u].x, ps[b + 8u].x, ps[b + 12u].x));
            mb = max(mb, vec4<f32>(ps[b].y, ps[b + 4u].y, ps[b + 8u].y, ps[b + 12u].y));
            mb = max(mb, vec4<f32>(ps[b].z, ps[b + 4u].z, ps[b + 8u].z, ps[b + 12u].z));
            mb = max(mb, vec4<f32>(ps[b].w, ps[b + 4u].w, ps[b + 8u].w, ps[b + 12u].w));
        }
$SOFTMAX
        workgroupBarrier();
        let sp = ty ^ (tx % 8u);  // P's slot of row quad ty at each of this invocation's keys (key % 8 = tx % 8)
        ps[kj.x * 8u + sp] = vec4<f32>(p0.x, p1.x, p2.x, p3.x);
        ps[kj.y * 8u + sp] = vec4<f32>(p0.y, p1.y, p2.y, p3.y);
        ps[kj.z * 8u + sp] = vec4<f32>(p0.z, p1.z, p2.z, p3.z);
        ps[kj.w * 8u + sp] = vec4<f32>(p0.w, p1.w, p2.w, p3.w);
        workgroupBarrier();
        let nk = min(64u, kmax - kb);
        for (var key = 0u; key < nk; key = key + 1u) {
            let x = ps[key * 8u + (ty ^ (key % 8u))];
            let y = kv[key * 16u + (tx ^ (key % 16u))];
            o0 = o0 + x.x * y; o1 = o1 + x.y * y; o2 = o2 + x.z * y; o3 = o3 + x.w * y;
        }
        workgroupBarrier();
    }
    let f = 64u * ty + tx;
    ps[f / 4u][f % 4u] = l.x; ps[(f + 16u) / 4u][f % 4u] = l.y; ps[(f + 32u) / 4u][f % 4u] = l.z; ps[(f + 48u) / 4u][f % 4u] = l.w;
    workgroupBarrier();
    var tot = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c = c + 1u) {
        let b = 16u * ty + c;
        tot = tot + vec4<f32>(ps[b].x + ps[b].y + ps[b].z + ps[b].w, ps[b + 4u].x + ps[b + 4u].y + ps[b + 4u].z + ps[b + 4u].w,
                              ps[b + 8u].x + ps[b + 8u].y + ps[b + 8u].z + ps[b + 8u].w, ps[b + 12u].x + ps[b + 12u].y + ps[b + 12u].z + ps[b + 12u].w);
    }
$WRITES"""


def shader(encoder):
    return fill(SRC, **layout(encoder))


UNROLLED = K.VEC4_BINDINGS + """$TABLES
// Every read with constant inner indices (naga clamps a dynamic index into a workgroup array; the
// outer ones here are each invocation's own, the same all along), rows padded against bank conflicts.
var<workgroup> qs: array<array<vec4<f32>, 16>, 32>;  // [row][d quad]: Q * scale
var<workgroup> kv: array<array<vec4<f32>, 17>, 64>;  // [key][d quad]: K, then V
var<workgroup> ps: array<array<vec4<f32>, 9>, 64>;   // [key][row quad]: P
var<workgroup> red: array<array<f32, 17>, 32>;       // [row][16]: the rows' partial maxima, then sums

$ENTRY
    for (var i = t; i < 512u; i = i + 128u) {
        let r = min(r0 + i / 16u, p.s - 1u);
        let qi = $Q_ROW * 64u + 4u * (i % 16u);
        qs[i / 16u][i % 16u] = vec4<f32>(f32(q[qi]), f32(q[qi + 1u]), f32(q[qi + 2u]), f32(q[qi + 3u])) * p.scale;
    }
    var m0 = -3.0e38; var m1 = -3.0e38; var m2 = -3.0e38; var m3 = -3.0e38;
    var l = vec4<f32>(0.0);
    var o0 = vec4<f32>(0.0); var o1 = vec4<f32>(0.0); var o2 = vec4<f32>(0.0); var o3 = vec4<f32>(0.0);
    let rowa = r0 + 4u * ty;
    let ra = 4u * ty;
$LIMITS
    let seq = 0u;
    let kj = vec4<u32>(tx, tx + 16u, tx + 32u, tx + 48u);
    for (var kb = 0u; kb < kmax; kb = kb + 64u) {
        for (var i = t; i < 1024u; i = i + 128u) {
            let j = min(kb + i / 16u, kmax - 1u);
            let at = $KEY_ROW * 16u + i % 16u;
            kv[i / 16u][i % 16u] = vec4<f32>(kc[$K_AT]);
        }
        workgroupBarrier();
        var s0 = vec4<f32>(0.0); var s1 = vec4<f32>(0.0); var s2 = vec4<f32>(0.0); var s3 = vec4<f32>(0.0);
$SCORES
        let kk = kb + kj;
        let v0 = kk < vec4<u32>($KEYS0); let v1 = kk < vec4<u32>($KEYS1); let v2 = kk < vec4<u32>($KEYS2); let v3 = kk < vec4<u32>($KEYS3);
        s0 = select(vec4<f32>(-3.0e38), s0, v0); s1 = select(vec4<f32>(-3.0e38), s1, v1);
        s2 = select(vec4<f32>(-3.0e38), s2, v2); s3 = select(vec4<f32>(-3.0e38), s3, v3);
        red[ra][tx] = max(max(s0.x, s0.y), max(s0.z, s0.w));
        red[ra + 1u][tx] = max(max(s1.x, s1.y), max(s1.z, s1.w));
        red[ra + 2u][tx] = max(max(s2.x, s2.y), max(s2.z, s2.w));
        red[ra + 3u][tx] = max(max(s3.x, s3.y), max(s3.z, s3.w));
        workgroupBarrier();
        for (var i = t; i < 1024u; i = i + 128u) {
            let j = min(kb + i / 16u, kmax - 1u);
            let at = $KEY_ROW * 16u + i % 16u;
            kv[i / 16u][i % 16u] = vec4<f32>(vc[$V_AT]);
        }
        var mb = vec4<f32>(-3.0e38);
$MAXES
$SOFTMAX
        ps[tx][ty] = vec4<f32>(p0.x, p1.x, p2.x, p3.x);
        ps[tx + 16u][ty] = vec4<f32>(p0.y, p1.y, p2.y, p3.y);
        ps[tx + 32u][ty] = vec4<f32>(p0.z, p1.z, p2.z, p3.z);
        ps[tx + 48u][ty] = vec4<f32>(p0.w, p1.w, p2.w, p3.w);
        workgroupBarrier();
$WEIGHTED
        workgroupBarrier();
    }
    red[ra][tx] = l.x; red[ra + 1u][tx] = l.y; red[ra + 2u][tx] = l.z; red[ra + 3u][tx] = l.w;
    workgroupBarrier();
    var tot = vec4<f32>(0.0);
$TOTALS
$WRITES"""


def unrolled(encoder):
    n = "\n        "
    scores = []
    for d in range(16):
        scores.append(f"{{ let x0 = qs[ra][{d}]; let x1 = qs[ra + 1u][{d}]; let x2 = qs[ra + 2u][{d}]; let x3 = qs[ra + 3u][{d}];")
        scores.append(f"  let y0 = kv[tx][{d}]; let y1 = kv[tx + 16u][{d}]; let y2 = kv[tx + 32u][{d}]; let y3 = kv[tx + 48u][{d}];")
        for i in range(4):
            scores.append(f"  s{i} = s{i} + vec4<f32>(dot(x{i}, y0), dot(x{i}, y1), dot(x{i}, y2), dot(x{i}, y3));")
        scores.append("}")
    maxes = [f"mb = max(mb, vec4<f32>(red[ra][{c}], red[ra + 1u][{c}], red[ra + 2u][{c}], red[ra + 3u][{c}]));" for c in range(16)]
    totals = [f"tot = tot + vec4<f32>(red[ra][{c}], red[ra + 1u][{c}], red[ra + 2u][{c}], red[ra + 3u][{c}]);" for c in range(16)]
    weighted = [f"{{ let x = ps[{k}][ty]; let y = kv[{k}][tx]; o0 = o0 + x.x * y; o1 = o1 + x.y * y; o2 = o2 + x.z * y; o3 = o3 + x.w * y; }}"
                for k in range(64)]
    return fill(UNROLLED, **layout(encoder), SCORES="        " + n.join(scores), MAXES="        " + n.join(maxes), TOTALS="    " + "\n    ".join(totals),
                WEIGHTED="        " + n.join(weighted))
