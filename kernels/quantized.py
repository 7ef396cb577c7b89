"""4-bit group-symmetric weights (q4gsw) and dynamic int8 activation quantization.

Formats (as `executorch.backends.vulkan.patterns` writes them):
- weight: uint8 [N, Kp / 2] raw bytes, Kp = K padded to a multiple of 8 with zeros; byte b of a row
  holds k = 2b in its low nibble and k = 2b + 1 in its high nibble, each stored as (q + 8), q in
  [-8, 7]. Read in WGSL as u32 words, so word w of a row holds k = 8w + j at bits 4j..4j+3.
- weight scales: f32 [num_groups, Np] (transposed; N padded to a multiple of 4), group = k / gs.
  The dequantized weight is (nibble - 8) * scale, exactly as torchao's dequantize_affine.
- `et_vk.embedding_q4gsw`: the same nibbles, per-row scales [V, groups] (not transposed); with
  `is_linear_weight` false the even element sits in the high nibble instead.
- `torchao.choose_qparams_affine` gives per-block scale (f32) and zero point (int8, stored packed
  4 per word, or int32); `et_vk.linear_dq8ca_q4gsw` quantizes its input with them on the fly,
  q = clamp(round(x * (1 / scale)) + zp, -128, 127), and multiplies (q - zp) * scale by the
  dequantized weight, the math of torchao's quantize_affine / dequantize_affine. The divisions
  are done by `div_rn`, an integer long division that is correctly rounded on every GPU (WGSL
  allows 2.5 ULP for `/`), so the integer activations match the CPU reference exactly.

The two linear ops record a GEMV route (up to GEMV_MAX_ROWS rows, each its own: 256 threads reduce
over K for 4 outputs, one u32 word = 8 weights per thread step) and a GEMM route (more rows:
kernels/gemm.py's template with a B load that dequantizes each weight as it is staged, and with
dq8 an A load that quantizes each activation; split-K as for fp32). On CPU adapters with
subgroups, where K and the group size are multiples of 16 (a lane's step: 2 words), two subgroup
kernels take every row count instead (one row, and Q4_SG_GEMM's shape for more). The hook zeroes the
grids of the routes not taken.

Activations, scales, bias and outputs are stored as their tensors' types (f32, or f16 for
float16, in any mix); every kernel converts at the load and the store, and dequantizes and sums
in f32.

Kept as one module past 400 lines: the 4-bit formats are read by every kernel here, and the family's variants share them.
"""

import struct
from dataclasses import dataclass

from resize.shapes import fold_grid, numel_of

from .gemm import (
    PARAMS_SIZE,
    GemmRoute,
    TileLoad,
    bindings,
    gemm_scratch,
    params_bytes,
    storage,
)
from .linear import CPU_WG, GEMV_MAX_ROWS, SG_GPU, SG_GPU_ROWS, SG_LANES, SUBGROUP_BUILTINS, sg_wg_rows, vec4_loader, vec4_type
from .registry import op
from .variants import CPU
from .wgsl import FLAT_INDEX, PACKED, WG, flat_grid, is_float, wgsl_type

GEMV_ROWS = 4

# Correctly rounded a / b for finite a and normal b (subnormal quotients flush to 0, overflow
# gives inf): the 24-bit quotient of the mantissas by restoring division, rounded to nearest even.
DIV_RN = """
fn div_rn(a: f32, b: f32) -> f32 {
    let ab = bitcast<u32>(a);
    let bb = bitcast<u32>(b);
    let sign = (ab ^ bb) & 0x80000000u;
    var ea = i32((ab >> 23u) & 0xFFu);
    var eb = i32((bb >> 23u) & 0xFFu);
    if (ea == 255 || eb == 255 || eb == 0) { return a / b; }
    var ma = ab & 0x7FFFFFu;
    if (ea == 0) {
        if (ma == 0u) { return bitcast<f32>(sign); }
        let s = countLeadingZeros(ma) - 8u;
        ma = ma << s;
        ea = 1 - i32(s);
    } else {
        ma = ma | 0x800000u;
    }
    let mb = (bb & 0x7FFFFFu) | 0x800000u;
    var e = ea - eb + 127;
    if (ma < mb) { ma = ma << 1u; e = e - 1; }
    var q = 0u;
    var r = ma;
    for (var i = 0u; i < 24u; i = i + 1u) {
        q = q << 1u;
        if (r >= mb) { r = r - mb; q = q | 1u; }
        r = r << 1u;
    }
    if (r > mb || (r == mb && (q & 1u) == 1u)) {
        q = q + 1u;
        if (q == 0x1000000u) { q = 0x800000u; e = e + 1; }
    }
    if (e <= 0) { return bitcast<f32>(sign); }
    if (e >= 255) { return bitcast<f32>(sign | 0x7F800000u); }
    return bitcast<f32>(sign | (u32(e) << 23u) | (q & 0x7FFFFFu));
}
"""

# A signed byte of a packed int8 array.
I8_AT = """
fn i8_at(i: u32) -> i32 {
    let w = ZP_ARRAY[i / 4u];
    return bitcast<i32>(w << (24u - 8u * (i % 4u))) >> 24u;
}
"""

# ---------------------------------------------------------------- linear_q4gsw / linear_dq8ca_q4gsw

LIN_FIELDS = ("M", "N", "K", "wpr", "sn", "groups", "gs", "kw")
LIN_STRUCT = "struct Q { " + ", ".join(f"{n}: u32" for n in LIN_FIELDS) + " }"
LIN_FORMAT = "<" + "I" * len(LIN_FIELDS)
LIN_SIZE = struct.calcsize(LIN_FORMAT)


@dataclass(frozen=True)
class Storage:
    """The WGSL storage types of a 4-bit linear's activations, activation scales (dq8), weight
    scales, bias and output (f32 or f16 each)."""

    x: str = "f32"
    xs: str = "f32"
    ws: str = "f32"
    bias: str = "f32"
    out: str = "f32"


def _operands(dq8, zp_packed, types, vec4=False):
    """The read bindings of the routes, (name, WGSL element type), in order; with `vec4`, the
    input and the weights as vec4s (the subgroup GEMV's)."""
    acts = (("xs", types.xs), ("xz", "u32" if zp_packed else "i32")) if dq8 else ()
    x, wq = (vec4_type(types.x), f"vec{Q4_SG_WORDS}<u32>") if vec4 else (types.x, "u32")
    return (("x", x), *acts, ("wq", wq), ("ws", types.ws))


def _dequant(dq8, zp_packed, word_group):
    """WGSL both routes share: the weights' dequantization over uniform `q`, and with `dq8` the
    activations' quantize-dequantize."""
    src = """
struct W8 { a: vec4<f32>, b: vec4<f32> }
fn wscale(k: u32, n: u32) -> f32 { return f32(ws[min(k / q.gs, q.groups - 1u) * q.sn + n]); }
// The 8 weights of one word, k = 8w .. 8w + 7, before their scale: nibble - 8.
fn nibbles(word: u32) -> W8 {
    let v = vec4<u32>(word);
    let lo = vec4<f32>((v >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - vec4<f32>(8.0);
    let hi = vec4<f32>((v >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) - vec4<f32>(8.0);
    return W8(lo, hi);
}
// The 8 weights of word `word` (k = k0 .. k0 + 7) of output row n, dequantized.
fn dq8(word: u32, k0: u32, n: u32) -> W8 {
    let w = nibbles(word);
"""
    if word_group:  # gs % 8 == 0: one group per word
        src += "    let s = wscale(k0, n);\n    return W8(w.a * s, w.b * s);\n}\n"
    else:
        src += (
            "    let sa = vec4<f32>(wscale(k0, n), wscale(k0 + 1u, n), wscale(k0 + 2u, n), wscale(k0 + 3u, n));\n"
            "    let sb = vec4<f32>(wscale(k0 + 4u, n), wscale(k0 + 5u, n), wscale(k0 + 6u, n), wscale(k0 + 7u, n));\n"
            "    return W8(w.a * sa, w.b * sb);\n}\n"
        )
    if dq8:
        src += DIV_RN
        if zp_packed:
            src += I8_AT.replace("ZP_ARRAY", "xz")
            src += "fn zp_at(m: u32) -> f32 { return f32(i8_at(m)); }\n"
        else:
            src += "fn zp_at(m: u32) -> f32 { return f32(xz[m]); }\n"
        # quantize_affine then dequantize_affine of one activation with its row's (1/s, zp, s).
        src += """
fn xq(v: f32, inv: f32, zp: f32, s: f32) -> f32 {
    return (clamp(round(v * inv) + zp, -128.0, 127.0) - zp) * s;
}
"""
    return src


def _gemv_header(dq8, zp_packed, has_bias, types, vec4=False):
    lines = [LIN_STRUCT + ";", *bindings(_operands(dq8, zp_packed, types, vec4), has_bias, uniform="q: Q", bias=types.bias, out=types.out)]
    total = "acc + f32(bias[n])" if has_bias else "acc"
    lines.append(f"fn epilogue(acc: f32, n: u32) -> {types.out} {{ return {types.out}({total}); }}")
    return "\n".join(lines) + "\n"


GEMV = """
var<workgroup> red: array<vec4<f32>, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let n0 = (wid.x + wid.y * nwg.x) * 4u;
    let m = wid.z;  // the row: each row of a few is its own GEMV
    let xo = m * q.K;
    let last = q.N - 1u;
    let c0 = min(n0, last);
    let c1 = min(n0 + 1u, last);
    let c2 = min(n0 + 2u, last);
    let c3 = min(n0 + 3u, last);
{ROW_SETUP}
    var acc = vec4<f32>(0.0);
    for (var w = li; w < q.kw; w = w + 256u) {
        let k0 = w * 8u;
        var xa = vec4<f32>(0.0);
        var xb = vec4<f32>(0.0);
        if (k0 + 8u <= q.K) {
            xa = vec4<f32>(f32(x[xo + k0]), f32(x[xo + k0 + 1u]), f32(x[xo + k0 + 2u]), f32(x[xo + k0 + 3u]));
            xb = vec4<f32>(f32(x[xo + k0 + 4u]), f32(x[xo + k0 + 5u]), f32(x[xo + k0 + 6u]), f32(x[xo + k0 + 7u]));
        } else {
            for (var j = 0u; j < 4u; j = j + 1u) {
                if (k0 + j < q.K) { xa[j] = f32(x[xo + k0 + j]); }
                if (k0 + 4u + j < q.K) { xb[j] = f32(x[xo + k0 + 4u + j]); }
            }
        }
{X_TRANSFORM}
        let d0 = dq8(wq[c0 * q.wpr + w], k0, c0);
        let d1 = dq8(wq[c1 * q.wpr + w], k0, c1);
        let d2 = dq8(wq[c2 * q.wpr + w], k0, c2);
        let d3 = dq8(wq[c3 * q.wpr + w], k0, c3);
        acc = acc + vec4<f32>(dot(xa, d0.a) + dot(xb, d0.b), dot(xa, d1.a) + dot(xb, d1.b),
                              dot(xa, d2.a) + dot(xb, d2.b), dot(xa, d3.a) + dot(xb, d3.b));
    }
    red[li] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (li < s) { red[li] = red[li] + red[li + s]; }
        workgroupBarrier();
    }
    if (li < 4u) {
        let n = n0 + li;
        if (n < q.N) { out[m * q.N + n] = epilogue(red[0][li], n); }
    }
}
"""

GEMV_DQ8_SETUP = """    let s_row = f32(xs[m]);
    let zp_row = zp_at(m);
    let inv_row = div_rn(1.0, s_row);"""
GEMV_DQ8_X = """        xa = vec4<f32>(xq(xa.x, inv_row, zp_row, s_row), xq(xa.y, inv_row, zp_row, s_row),
                       xq(xa.z, inv_row, zp_row, s_row), xq(xa.w, inv_row, zp_row, s_row));
        xb = vec4<f32>(xq(xb.x, inv_row, zp_row, s_row), xq(xb.y, inv_row, zp_row, s_row),
                       xq(xb.z, inv_row, zp_row, s_row), xq(xb.w, inv_row, zp_row, s_row));"""


def gemv_shader(dq8, zp_packed, has_bias, word_group, types=Storage()):
    gemv = GEMV.replace("{ROW_SETUP}", GEMV_DQ8_SETUP if dq8 else "").replace("{X_TRANSFORM}", GEMV_DQ8_X if dq8 else "")
    return _gemv_header(dq8, zp_packed, has_bias, types) + _dequant(dq8, zp_packed, word_group) + gemv


# CPU adapters with subgroups (kernels/linear.py's gemv_sg_body, for 4-bit words): the lanes of a
# subgroup walk a weight row together, lane l reading Q4_SG_WORDS words (8 weights each, one scale
# group: gs a multiple of Q4_SG_STEP) at step l, l + S, ..; a subgroup takes a shape of
# (input rows, weight rows), each weight word it dequantizes used for all of its input rows and
# each input vec4 for all of its weight rows; subgroupAdd sums an output's lanes. Needs K a
# multiple of Q4_SG_STEP and rows of whole steps.
# An output's sum is the same at every shape (vec4 accumulators, the words in order), so a row of
# a prompt or a ragged pass is bitwise the row alone. f16 activations are read through
# vec4_loader. On lavapipe each invocation's load is a scalar loop over the lanes, so loading
# several words at once and each input vec4 once for several weight rows is what counts
# (examples/bench_cpu_gemv.py, CPU time, 2 busy cores): one row by 49152 x 576 weights (group
# 32) 24 ms at 4 weight rows a subgroup with dot products, 23 with vec4 accumulators, 20 at 8
# weight rows (22-23 at 16), against 314 for GEMV above; 64 rows by 1536 x 576 52 ms in the
# tiled 4-bit GEMM, 28 at 8 x 8, 31-46 at 4 x 4, 4 x 8, 8 x 4 and 16 x 4 (16 x 8 as 8 x 8).
# 2 words a step rather than 4 (a vec4): K = 576 is 36 steps, 5 a lane of 8 (4 words: 18 steps,
# 3 a lane, the last with 2 of 8 lanes live); 64 rows by 1536 x 576 24-27 against 28-33 ms.
Q4_SG_GEMV = (1, 8)  # (input rows, weight rows) a subgroup takes: one row (decode)
Q4_SG_GEMM = (8, 8)  # any other row count (prefill, a ragged pass): no tiled GEMM, no barriers
Q4_SG_WORDS = 2  # words a lane loads a step (a vec2<u32>: 16 weights)
Q4_SG_STEP = 8 * Q4_SG_WORDS  # weights a lane step: K and the group size must be whole steps
# GPUs with subgroups take it at kernels/linear.py's SG_GPU shape for a ragged pass of
# SG_GPU_ROWS[0] to GEMV_MAX_ROWS rows (several sessions), for weights of at least Q4_SG_GPU_MIN_N
# rows (narrower ones leave too few workgroups at 4 x 4, as fp32's 576-row residual linears did).
# H100, SmolLM2-shaped 4w export, greedy bursts, one call: 32 sessions 4,181 -> 5,565 tokens/s;
# at 64 rows it lost to the split-K dequantizing GEMM (9,081 -> 8,196), so more rows keep that.
Q4_SG_GPU_MIN_N = 1024


def _sg_body(dq8, shape):
    """The subgroup kernel's statements for `shape`; input row r of the workgroup's group of rows
    from r0 (rows past `rows` read as the last live one, not written)."""
    ins, outs = range(shape[0]), range(shape[1])
    lines = [f"let x{r}_ = min(r0 + {r}u, q.M - 1u);" for r in ins]
    if dq8:  # GEMV_DQ8_SETUP for each row
        lines += [f"let s_row{r} = f32(xs[x{r}_]); let zp_row{r} = zp_at(x{r}_); let inv_row{r} = div_rn(1.0, s_row{r});" for r in ins]
    lines += [f"for (var g = li / sgs; g < {CPU_WG // SG_LANES}u; g = g + {CPU_WG}u / sgs) {{", f"let n0 = nw + g * {len(outs)}u;"]
    lines += [f"let c{i} = min(n0 + {i}u, q.N - 1u);" for i in outs]
    lines += [f"var acc{i}_{r} = vec4<f32>(0.0);" for i in outs for r in ins]
    lines += [f"for (var v = lane; v < q.K / {Q4_SG_STEP}u; v = v + sgs) {{", f"    let k0 = v * {Q4_SG_STEP}u;"]
    for i in outs:
        lines += [f"    let w{i} = wq[c{i} * wprv + v];", f"    let s{i} = wscale(k0, c{i});"]
    for c, word in enumerate("xyzw"[:Q4_SG_WORDS]):  # 8 weights a word: input vec4s 2c and 2c + 1 of the step
        lines.append("    {")
        for r in ins:
            for h in range(2):
                load = f"x4(x{r}_ * kv4 + v * {Q4_SG_STEP // 4}u + {2 * c + h}u)"
                if dq8:  # GEMV_DQ8_X's quantize-dequantize, per component
                    load = f"xq4({load}, inv_row{r}, zp_row{r}, s_row{r})"
                lines.append(f"    let x{r}{'ab'[h]} = {load};")
        for i in outs:
            lines.append(f"    let d{i} = nibbles(w{i}.{word}); let a{i} = d{i}.a * s{i}; let b{i} = d{i}.b * s{i};")
            lines += [f"    acc{i}_{r} = acc{i}_{r} + x{r}a * a{i} + x{r}b * b{i};" for r in ins]
        lines.append("    }")
    lines.append("}")
    for r in ins:
        for i in outs:
            total = f"subgroupAdd((acc{i}_{r}.x + acc{i}_{r}.y) + (acc{i}_{r}.z + acc{i}_{r}.w))"
            lines.append(f"{{ let v0 = {total}; let n = n0 + {i}u; if (lane == 0u && n < q.N && {r}u < rows) {{ out[(r0 + {r}u) * q.N + n] = epilogue(v0, n); }} }}")
    lines.append("}")
    return "\n    ".join(lines)


XQ4 = """
fn xq4(v: vec4<f32>, inv: f32, zp: f32, s: f32) -> vec4<f32> {
    return vec4<f32>(xq(v.x, inv, zp, s), xq(v.y, inv, zp, s), xq(v.z, inv, zp, s), xq(v.w, inv, zp, s));
}
"""


def sg_shader(dq8, zp_packed, has_bias, shape=Q4_SG_GEMV, types=Storage()):
    """The subgroup kernel of `shape`: workgroup z is a group of shape[0] rows;
    K, the weight rows and gs whole steps of Q4_SG_WORDS words; activations f32 or f16."""
    head = _gemv_header(dq8, zp_packed, has_bias, types, vec4=True) + vec4_loader("x", types.x)
    return head + _dequant(dq8, zp_packed, True) + (XQ4 if dq8 else "") + f"""
@compute @workgroup_size({CPU_WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32{SUBGROUP_BUILTINS}) {{
    let r0 = wid.z * {shape[0]}u;
    let rows = min({shape[0]}u, q.M - r0);
    let kv4 = q.K / 4u;
    let wprv = q.wpr / {Q4_SG_WORDS}u;
    let nw = (wid.x + wid.y * nwg.x) * {sg_wg_rows(shape)}u;
    {_sg_body(dq8, shape)}
}}
"""


# The GEMM template's B load: one weight of row n at k, dequantized as dq8 does it.
Q4_B_AT = """
fn b_at(off: u32, n: u32, k: u32, kend: u32) -> f32 {
    if (n < p.N && k < kend) {
        let word = wq[n * q.wpr + k / 8u];
        return (f32((word >> (4u * (k % 8u))) & 15u) - 8.0) * wscale(k, n);
    }
    return 0.0;
}
"""
# Its A load: fp32, or with dq8 quantized and dequantized with the row's (1 / scale, zero point,
# scale), which each invocation computes once for its 4 rows (the setup) into private vec4s.
A_AT = """
fn a_at(off: u32, m: u32, k: u32, kend: u32) -> f32 {
    if (m < p.M && k < kend) { return f32(x[off + m * p.K + k]); }
    return 0.0;
}
"""
DQ8_A_AT = """
var<private> r_inv: vec4<f32>;
var<private> r_zp: vec4<f32>;
var<private> r_s: vec4<f32>;
fn a_at(off: u32, m: u32, k: u32, kend: u32) -> f32 {
    let i = m % 4u;  // the invocation's rows are a_row0.. with a_row0 a multiple of 4
    if (m < p.M && k < kend) { return xq(f32(x[off + m * p.K + k]), r_inv[i], r_zp[i], r_s[i]); }
    return 0.0;
}
"""
DQ8_SETUP = """    for (var i = 0u; i < 4u; i = i + 1u) {
        var s = 1.0;
        var zp = 0.0;
        if (a_row0 + i < p.M) { s = f32(xs[a_row0 + i]); zp = zp_at(a_row0 + i); }
        r_s[i] = s;
        r_zp[i] = zp;
        r_inv[i] = div_rn(1.0, s);
    }
"""


def q4_load(dq8, zp_packed, word_group, types=Storage()):
    """The GEMM template's tile loads for 4-bit weights (kernels/gemm.py)."""
    return TileLoad(
        inputs=_operands(dq8, zp_packed, types),
        functions=_dequant(dq8, zp_packed, word_group) + (DQ8_A_AT if dq8 else A_AT) + Q4_B_AT,
        b_along_k=True,
        setup=DQ8_SETUP if dq8 else "",
    )


def _fail(name, msg):
    raise ValueError(f"{name}: {msg}")


def _add_q4_linear(b, x, xs, xz, weight, scales, group_size, bias):
    """Record both routes of out = x @ dequant(weight).T (+ bias); `xs`/`xz` (per-row activation
    scale and zero point) turn on the dynamic int8 activation quantization."""
    name = b.name
    dq8 = xs is not None
    wt, st, xt = b.graph.values[weight], b.graph.values[scales], b.graph.values[x]
    if wt.dtype not in ("uint8", "int8") or len(wt.dims) != 2:
        _fail(name, f"weight must be packed uint8 [N, K/2], got {wt.dtype}{list(wt.dims)}")
    if not is_float(xt.dtype) or not is_float(st.dtype):
        _fail(name, f"input ({xt.dtype}) and scales ({st.dtype}) must be floating point")
    n, row_bytes = wt.dims
    if row_bytes % 4:
        _fail(name, f"weight rows of {row_bytes} bytes are not whole u32 words (K must be padded to 8)")
    if len(st.dims) != 2 or st.dims[-1] < n:
        _fail(name, f"scales must be [groups, >= N={n}], got {list(st.dims)}")
    groups, sn = st.dims
    gs = int(group_size)
    if gs <= 0:
        _fail(name, f"group size {gs}")
    zp_packed = False
    if dq8:
        zp_packed = b.graph.values[xz].dtype in PACKED
    has_bias = bias is not None
    q, p = b.params(LIN_SIZE), b.params(PARAMS_SIZE)
    operands = [x] + ([xs, xz] if dq8 else []) + [weight, scales]
    tail = [bias] if has_bias else []
    word_group = gs % 8 == 0
    types = Storage(*(storage(b, v) if v is not None else "f32" for v in (x, xs, scales, bias, b.out)))
    gemv = b.dispatch(gemv_shader(dq8, zp_packed, has_bias, word_group, types), [*operands, *tail, b.out, q])
    wpr = row_bytes // 4
    # Devices with subgroups, where K is whole steps of Q4_SG_WORDS words (the hook): CPU adapters
    # take the subgroup kernels at every row count, one row and more; GPUs for 17 to 32 rows
    shapes = ()
    if b.subgroups and wpr % Q4_SG_WORDS == 0 and gs % Q4_SG_STEP == 0:
        shapes = (Q4_SG_GEMV, Q4_SG_GEMM) if b.adapter == CPU else (SG_GPU,) if n >= Q4_SG_GPU_MIN_N else ()
    sgs = [(b.dispatch(sg_shader(dq8, zp_packed, has_bias, shape, types), [*operands, *tail, b.out, q]), shape) for shape in shapes]
    q_binding = len(operands) + len(tail) + 3  # after out, p and the scratch
    q_wgsl = f"{LIN_STRUCT};\n@group(0) @binding({q_binding}) var<uniform> q: Q;\n"
    gemm = GemmRoute(b, q4_load(dq8, zp_packed, word_group, types), operands, bias, b.out, p, gemm_scratch(b, [b.out]), [q], q_wgsl)

    def resize(ctx):
        xd = ctx.dims(x)
        if len(xd) < 1:
            _fail(name, "input must have at least one dim")
        k = xd[-1]
        m = numel_of(xd[:-1])
        if -(-k // 8) > wpr or -(-k // gs) > groups:
            _fail(name, f"input K={k} does not fit weight {list(wt.dims)} / scales {list(st.dims)} (group {gs})")
        if dq8:
            for vid, what in ((xs, "scales"), (xz, "zero points")):
                if ctx.numel(vid) != m:
                    _fail(name, f"input {tuple(xd)} has {m} rows but its activation {what} have {ctx.numel(vid)}")
        if has_bias and ctx.numel(bias) < n:
            _fail(name, f"bias of {ctx.numel(bias)} elements for N={n}")
        sg_shape = None
        if sgs and k % Q4_SG_STEP == 0 and m > 0:
            if b.adapter == CPU:
                sg_shape = Q4_SG_GEMV if m == 1 else Q4_SG_GEMM
            elif SG_GPU_ROWS[0] <= m <= GEMV_MAX_ROWS:
                sg_shape = SG_GPU
        use_gemv = m <= GEMV_MAX_ROWS and sg_shape is None
        use_gemm = m > GEMV_MAX_ROWS and sg_shape is None
        splits, kspan = gemm.plan(m, n, k, 1, use_gemm)
        ctx.set_params(q, struct.pack(LIN_FORMAT, m, n, k, wpr, sn, groups, gs, -(-k // 8)))
        ctx.set_params(p, params_bytes(m, n, k, bias=(0, 0, 1), split=(splits, kspan)))
        ctx.set_grid(gemv, fold_grid(-(-n // GEMV_ROWS))[:2] + (m,) if use_gemv else (0, 0, 0))
        for d, shape in sgs:
            ctx.set_grid(d, fold_grid(-(-n // sg_wg_rows(shape)))[:2] + (-(-m // shape[0]),) if shape == sg_shape else (0, 0, 0))
        gemm.set_grids(ctx, m, n, 1, splits, use_gemm)
        ctx.set_dims(b.out, tuple(xd[:-1]) + (n,))

    b.hook(resize)


@op("et_vk.linear_q4gsw.default", half=True)
def linear_q4gsw(b):
    """[x [..., K], weight u8 [N, Kp/2], scales f32 [groups, Np], group_size Int, bias or None, out]."""
    bias = None if b.is_none(4) else b.args[4]
    _add_q4_linear(b, b.args[0], None, None, b.args[1], b.args[2], b.scalar(3), bias)


@op("et_vk.linear_dq8ca_q4gsw.default", half=True)
def linear_dq8ca_q4gsw(b):
    """[x [..., K], input_scale f32 [M], input_zp int8 [M], weight u8 [N, Kp/2], weight_sums i32
    [groups, N8] (unused: for integer accumulation), scales f32 [groups, Np], group_size Int,
    bias or None, out]."""
    bias = None if b.is_none(7) else b.args[7]
    if not b.is_tensor(1) or not b.is_tensor(2):
        _fail(b.name, "activation scales and zero points must be tensors (dynamic quantization)")
    _add_q4_linear(b, b.args[0], b.args[1], b.args[2], b.args[3], b.args[5], b.scalar(6), bias)


# ---------------------------------------------------------------- choose_qparams_affine

QP_FORMAT = "<IIIiifff"  # blocks, block, mode, qmin, qmax, eps, divisor, zp_sym
QP_SIZE = struct.calcsize(QP_FORMAT)
MODES = {"ASYMMETRIC": 0, "SYMMETRIC": 1, "SYMMETRIC_NO_CLIPPING_ERR": 2}

# 4 blocks per workgroup, 64 threads each: min/max, then torchao's scale and zero point.
CHOOSE_QPARAMS = """
struct P { blocks: u32, block: u32, mode: u32, qmin: i32, qmax: i32, eps: f32, divisor: f32, zp_sym: f32 }
@group(0) @binding(0) var<storage, read> x: array<X_TYPE>;
@group(0) @binding(1) var<storage, read_write> scale: array<SCALE_TYPE>;
@group(0) @binding(2) var<storage, read_write> zpo: array<ZP_TYPE>;
@group(0) @binding(3) var<uniform> p: P;
DIV_RN
var<workgroup> rmin: array<f32, 256>;
var<workgroup> rmax: array<f32, 256>;
var<workgroup> zps: array<i32, 4>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = wid.x + wid.y * nwg.x;
    let lane = li % 64u;
    let slot = li / 64u;
    let blk = g * 4u + slot;
    // min(min(x), 0) and max(max(x), 0)
    var mn = 0.0;
    var mx = 0.0;
    if (blk < p.blocks) {
        let base = blk * p.block;
        for (var k = lane; k < p.block; k = k + 64u) {
            let v = f32(x[base + k]);
            mn = min(mn, v);
            mx = max(mx, v);
        }
    }
    rmin[li] = mn;
    rmax[li] = mx;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            rmin[li] = min(rmin[li], rmin[li + s]);
            rmax[li] = max(rmax[li], rmax[li + s]);
        }
        workgroupBarrier();
    }
    if (lane == 0u) {
        var zp = 0;
        if (blk < p.blocks) {
            let lo = rmin[li];
            let hi = rmax[li];
            let qmin = f32(p.qmin);
            let qmax = f32(p.qmax);
            var sc = 0.0;
            var z = p.zp_sym;
            if (p.mode == 0u) {
                sc = max(div_rn(hi - lo, p.divisor), p.eps);
                z = clamp(qmin - round(div_rn(lo, sc)), qmin, qmax);
            } else if (p.mode == 1u) {
                sc = max(div_rn(max(-lo, hi), p.divisor), p.eps);
            } else {
                let smin = div_rn(lo, qmin);
                let smax = div_rn(hi, qmax);
                sc = select(smax, smin, smin > smax);
                sc = max(sc, p.eps);
            }
            scale[blk] = SCALE_TYPE(sc);
            zp = i32(z);
            ZP_STORE
        }
        zps[slot] = zp;
    }
    ZP_PACK
}
"""
ZP_PACK = """workgroupBarrier();
    if (li == 0u) {
        zpo[g] = (u32(zps[0]) & 0xFFu) | ((u32(zps[1]) & 0xFFu) << 8u) | ((u32(zps[2]) & 0xFFu) << 16u)
               | ((u32(zps[3]) & 0xFFu) << 24u);
    }"""


@op("torchao.choose_qparams_affine.default", half=True)
def choose_qparams_affine(b):
    """[input, mapping_type Str, block_size IntList, target_dtype (None), quant_min, quant_max,
    eps Double or None, scale_dtype, zero_point_dtype, keepdim, ValueList[scale, zero_point]]."""
    name = b.name
    x = b.args[0]
    xt = b.tensor(0)
    if not is_float(xt.dtype):
        _fail(name, f"input dtype {xt.dtype}")
    mapping = b.scalar(1)
    if mapping not in MODES:
        _fail(name, f"mapping type {mapping!r} is not supported")
    block = tuple(b.value(2).items)
    if len(block) != len(xt.dims) or any(int(s) != 1 for s in block[:-1]) or block[-1] <= 0:
        _fail(name, f"block_size {list(block)} for input {list(xt.dims)}: only [1, ..., 1, B] (per row group)")
    bsize = int(block[-1])
    qmin, qmax = b.scalar(4, -128), b.scalar(5, 127)
    eps = b.scalar(6, None)
    eps = 2.0**-126 if eps is None else float(eps)  # torch.finfo(float32).smallest_normal
    outs = b.value(len(b.args) - 1).items
    if len(outs) != 2:
        _fail(name, f"expected 2 outputs, got {len(outs)}")
    sc, zp = outs
    st, zt = b.graph.values[sc], b.graph.values[zp]
    zp_packed = zt.dtype in PACKED
    if not is_float(st.dtype):
        _fail(name, f"scale dtype {st.dtype}")
    mode = MODES[mapping]
    divisor = float(qmax - qmin) if mode == 0 else float(qmax - qmin) / 2
    zp_sym = float(int((qmax + qmin + 1) / 2))
    src = (
        CHOOSE_QPARAMS.replace("DIV_RN", DIV_RN)
        .replace("ZP_TYPE", "u32" if zp_packed else "i32")
        .replace("X_TYPE", wgsl_type(xt.dtype))
        .replace("SCALE_TYPE", wgsl_type(st.dtype))
        .replace("ZP_STORE", "" if zp_packed else "zpo[blk] = zp;")
        .replace("ZP_PACK", ZP_PACK if zp_packed else "")
    )
    params = b.params(QP_SIZE)
    d = b.dispatch(src, [x, sc, zp, params])
    out_rank = len(st.dims)

    def resize(ctx):
        xd = ctx.dims(x)
        k = xd[-1]
        if k % bsize:
            _fail(name, f"input {tuple(xd)} does not split into blocks of {bsize}")
        blocks = numel_of(xd) // bsize
        if out_rank == len(xd):
            dims = tuple(xd[:-1]) + (k // bsize,)
        else:
            dims = tuple(xd[:-1]) + ((k // bsize,) if k != bsize else ())
        if len(dims) != out_rank:
            _fail(name, f"cannot shape {blocks} blocks into rank {out_rank}")
        ctx.set_params(params, struct.pack(QP_FORMAT, blocks, bsize, mode, qmin, qmax, eps, divisor, zp_sym))
        ctx.set_grid(d, fold_grid(-(-blocks // 4)))
        ctx.set_dims(sc, dims)
        ctx.set_dims(zp, dims)

    b.hook(resize)


# ---------------------------------------------------------------- embedding_q4gsw

EMBEDDING_Q4 = f"""
struct P {{ n: u32, dim: u32, rows: u32, wpr: u32, groups: u32, gs: u32, linear: u32, pad: u32 }}
@group(0) @binding(0) var<storage, read> wq: array<u32>;
@group(0) @binding(1) var<storage, read> ws: array<WS_TYPE>;
@group(0) @binding(2) var<storage, read> index: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<OUT_TYPE>;
@group(0) @binding(4) var<uniform> p: P;
{FLAT_INDEX}
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let i = flat_index(gid, nwg, {WG}u);
    if (i >= p.n) {{ return; }}
    let t = i / p.dim;
    let d = i % p.dim;
    // An index outside the table reads its nearest row instead of out-of-bounds memory.
    let row = u32(clamp(index[t], 0, i32(p.rows) - 1));
    let byte = (wq[row * p.wpr + d / 8u] >> (8u * ((d / 2u) % 4u))) & 0xFFu;
    // linear packing: even element in the low nibble; otherwise in the high nibble
    let high = ((d % 2u) == 1u) == (p.linear == 1u);
    let q = select(byte & 15u, byte >> 4u, high);
    out[i] = OUT_TYPE((f32(q) - 8.0) * f32(ws[row * p.groups + min(d / p.gs, p.groups - 1u)]));
}}
"""


def embedding_q4_shader(b, scales, out):
    """EMBEDDING_Q4 over the storage types of the `scales` and `out` tensors (f32 or f16)."""
    return EMBEDDING_Q4.replace("WS_TYPE", storage(b, scales)).replace("OUT_TYPE", storage(b, out))


@op("et_vk.embedding_q4gsw.default", half=True)
def embedding_q4gsw(b):
    """[weight u8 [V, Dp/2], scales f32 [V, groups] (or [V]), group_size Int, indices, is_linear_weight
    Bool, out [..., D]]."""
    name = b.name
    wt, st = b.tensor(0), b.tensor(1)
    gs = int(b.scalar(2))
    indices = b.args[3]
    linear = bool(b.scalar(4, False)) if len(b.args) > 5 else False
    if len(wt.dims) != 2 or wt.dims[1] % 4:
        _fail(name, f"weight must be packed [V, D/2] with whole u32 rows, got {list(wt.dims)}")
    rows, row_bytes = wt.dims
    groups = st.dims[1] if len(st.dims) == 2 else 1
    if st.dims[0] != rows:
        _fail(name, f"scales {list(st.dims)} for {rows} rows")
    dim = b.graph.values[b.out].dims[-1]
    if dim > row_bytes * 2 or -(-dim // gs) > groups:
        _fail(name, f"embedding dim {dim} does not fit weight {list(wt.dims)} / scales {list(st.dims)}")
    params = b.params(32)
    d = b.dispatch(embedding_q4_shader(b, b.args[1], b.out), [b.args[0], b.args[1], indices, b.out, params])

    def resize(ctx):
        shape = ctx.dims(indices) + (dim,)
        n = numel_of(shape)
        ctx.set_params(params, struct.pack("<8I", n, dim, rows, row_bytes // 4, groups, gs, int(linear), 0))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, shape)

    b.hook(resize)
