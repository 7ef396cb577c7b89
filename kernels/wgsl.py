"""What every WGSL kernel shares: storage types, the folded flat index, parameter packing, and the
filling of shader templates.

A shader template is a plain string with `$NAME` placeholders (UPPER_CASE; `${NAME}u` where a
letter follows), filled by `fill(template, NAME=value, ...)`: WGSL never uses `$`, so its braces
stay single, and a placeholder or a value without its counterpart fails when the shader is built.
Lines generated one by one in Python loops (a statement a row, a binding a tensor) are f-strings.
"""

import struct
from dataclasses import dataclass
from string import Template

from pte_wgpu.resize.shapes import broadcast_strides, fold_grid

WG = 64  # workgroup size of the flat elementwise-style kernels


# A GEMM tile's origin, for a kernel of workgroup_id `wid` and the uniform P of kernels/matmul/gemm.py:
# its batch and K split (grid z), its first row and column (tiles of $BM x $BN), its K range
TILE_ORIGIN = """    let b = wid.z / p.splits;
    let split = wid.z % p.splits;
    let m0 = wid.y * ${BM}u;
    let n0 = wid.x * ${BN}u;
    let aoff = b * p.a_bs;
    let boff = b * p.b_bs;
    let kbeg = split * p.kspan;
    let kend = min(p.K, kbeg + p.kspan);"""


def fill(template, **values):
    """`template` with each `$NAME` (or `${NAME}`) replaced by `str(values[NAME])`, in one pass
    (a value's own text is not searched for placeholders). KeyError for a placeholder without a
    value, ValueError for a value that names no placeholder and for a `$` that starts none."""
    names = set()
    for m in Template.pattern.finditer(template):
        if m.group("invalid") is not None:
            raise ValueError(f"a '$' that starts no placeholder at offset {m.start()} of the template")
        names.add(m.group("named") or m.group("braced"))
    names.discard(None)  # "$$", an escaped "$"
    if missing := names - values.keys():
        raise KeyError(f"no value for the placeholders {sorted(missing)}")
    if unused := values.keys() - names:
        raise ValueError(f"values for no placeholder of the template: {sorted(unused)}")
    return Template(template).substitute({name: str(value) for name, value in values.items()})


# f32 x rounded to the nearest f16 (ties to even) and read back as f32, in integer operations: f16s
# past 65,504 are infinite, below 2^-14 multiples of 2^-24
ROUND_HALF = """
fn round_half(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    let sign = b & 0x80000000u;
    let e = (b >> 23u) & 0xFFu;
    if (e == 255u) { return x; }
    if (e >= 113u) {
        let r = (b + 0xFFFu + ((b >> 13u) & 1u)) & 0xFFFFE000u;
        if ((r & 0x7FFFFFFFu) >= 0x47800000u) { return bitcast<f32>(sign | 0x7F800000u); }
        return bitcast<f32>(r);
    }
    let s = 126u - e;
    if (s >= 25u) { return bitcast<f32>(sign); }
    let m = (b & 0x7FFFFFu) | 0x800000u;
    let q = (m + (1u << (s - 1u)) - 1u + ((m >> s) & 1u)) >> s;
    return bitcast<f32>(sign | bitcast<u32>(f32(q) * 5.9604644775390625e-8));
}
"""


def is_nan(value, lanes=1):
    """WGSL true where `value` (a scalar of any type, or a vec4<f32> with `lanes=4`) is a NaN
    (LIBRARY's is_nan: read from its bits)."""
    return f"is_nan4({value})" if lanes == 4 else f"is_nan(f32({value}))"


def clamped(value, lo, hi, lanes=1):
    """WGSL of `value` clamped to [lo, hi] as torch clamps: a NaN stays NaN and -0.0 stays -0.0;
    `hi` wins where lo > hi. WGSL's clamp, max and min may return the other operand for a NaN
    (lavapipe's clamp(NaN, -1, 1) is -1, its max(NaN, 0) 0) and +0.0 for -0.0, and so may a select
    that a compiler reads as one: NVIDIA's turn select(x, 0, x < 0) into a max. Each condition
    also tests the bits for a NaN (`is_nan`), which keeps the select a select. A bound of None
    leaves that side open (WGSL has no literal for an infinity). `value` is repeated: give a name
    or an expression the compiler can keep once; `lanes=4` for a vec4<f32>."""
    number = f"!{is_nan(value, lanes)}"
    out = value
    if lo is not None:
        out = f"select({out}, {lo}, ({value} < {lo}) & {number})"
    if hi is not None:
        out = f"select({out}, {hi}, ({out} > {hi}) & {number})"
    return out


def maximum(a, b):
    """WGSL of the larger of `a` and `b` as torch's maximum: NaN if either is (`is_nan`)."""
    return f"select(select({b}, {a}, {a} > {b} || {is_nan(a)}), {b}, {is_nan(b)})"


def minimum(a, b):
    """WGSL of the smaller of `a` and `b` as torch's minimum: NaN if either is."""
    return f"select(select({b}, {a}, {a} < {b} || {is_nan(a)}), {b}, {is_nan(b)})"


def relu(value, zero="0.0"):
    """WGSL of max(value, zero) as torch's relu: NaN and -0.0 pass through (`clamped`)."""
    return clamped(value, zero, None)


def rounded(value, t):
    """WGSL of the f32 `value` rounded to storage type `t` (f32 or f16) and read back as f32, as an
    op that stored it and the op after it that read it would have it: for f16 through ROUND_HALF's
    round_half (pipelines add its definition to a kernel that calls it). Not f32(f16(value)), nor
    through pack2x16float and back: NVIDIA's Vulkan driver drops either round trip and keeps the
    f32 value (H200, under naga and Tint alike; results/h200/q4_fused_f16_bitwise/rounding.py)."""
    return f"round_half({value})" if t == "f16" else f"f32({t}({value}))"


# NaN tests on the bits: WGSL lets a compiler assume no NaN, and NVIDIA's drivers do, under naga and
# Tint alike: select(x, 0, x < 0) becomes a max that answers 0 for a NaN, !(x == x) may fold to
# false. Integer operations on the bits stay. An integer converts to a finite f32: never NaN.
IS_NAN = """
fn is_nan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7FFFFFFFu) > 0x7F800000u; }
"""
IS_NAN4 = """
fn is_nan4(x: vec4<f32>) -> vec4<bool> { return (bitcast<vec4<u32>>(x) & vec4<u32>(0x7FFFFFFFu)) > vec4<u32>(0x7F800000u); }
"""
# The functions a kernel may call without defining them: the pipelines add each one it calls.
LIBRARY = {"round_half": ROUND_HALF, "is_nan": IS_NAN, "is_nan4": IS_NAN4}


# How each tensor dtype is stored on the GPU: 4-byte elements, except raw bytes of packed weights
# and float16 (f16, 2 bytes). A device without `shader-f16` never sees float16: the load widens
# those tensors to float32 first (async_runtime/program/graph.py widen_half).
STORAGE = {
    "float32": "f32",
    "float64": "f32",
    "float16": "f16",
    "int32": "i32",
    "int64": "i32",
    "int16": "i32",
    "bool": "u32",
    "uint8": "u32",  # packed: 4 bytes per u32 word
    "int8": "u32",
}
PACKED = {"uint8", "int8"}


def elem_bytes(dtype):
    return 1 if dtype in PACKED else 2 if dtype == "float16" else 4


def copy_bytes(numel, dtype):
    """The bytes an in-graph copy of `numel` elements moves: whole 4-byte words (WebGPU copies
    multiples of 4; every buffer is padded to 4 bytes)."""
    return -(-numel * elem_bytes(dtype) // 4) * 4


def wgsl_type(dtype):
    return STORAGE[dtype]


def is_float(dtype):
    return STORAGE[dtype] in ("f32", "f16")


def type_aliases(values, **tensors):
    """WGSL `alias NAME = <storage type>;` lines naming each tensor's storage type (`tensors`: alias
    name -> value id in `values`): a kernel written over the aliases (bindings `array<QT>` or
    `array<vec4<QT>>`, loads through `f32(...)` or `vec4<f32>(...)`, stores through `QT(...)`)
    serves f32 and f16 tensors, and any mix of them, with one text."""
    return "".join(f"alias {name} = {wgsl_type(values[vid].dtype)};\n" for name, vid in tensors.items())


# The flat invocation index of a folded (x, y) grid; `WG` must match the kernel's workgroup size.
FLAT_INDEX = """
fn flat_index(gid: vec3<u32>, nwg: vec3<u32>, wg: u32) -> u32 {
    return gid.x + gid.y * nwg.x * wg;
}
"""


def flat_grid(threads, wg=WG):
    """Folded grid covering `threads` invocations of a `wg`-wide kernel."""
    return fold_grid(-(-threads // wg))


# The products' GEMVs run a workgroup for each (group of outputs, group of input rows): the row
# groups of one output group are neighbours in the grid, so they run side by side and all but the
# first read its weights from the L2 cache. In the order of output groups first, a pass of several
# row groups read weights larger than the L2 (a 1B model's) from memory once a group. H200,
# Llama-3.2-1B fp16, the fused GEMVs, greedy bursts, two rounds in one call: 32 streams 3,998 /
# 3,966 -> 4,420 / 4,465 tokens/s, a prompt of 32 tokens 3,808 / 3,930 -> 4,342 / 4,457; the
# 4-bit GEMVs of its 4w export, whose layers fit the L2, within the runs' spread.
ROW_GROUPS = """
    let groups = ($M + ${ROWS}u - 1u) / ${ROWS}u;
    let flat = wid.x + wid.y * nwg.x;
    let $FIRST = (flat % groups) * ${ROWS}u;  // the first input row
    let wg0 = flat / groups;  // the group of outputs"""


def row_groups(m, rows, first="r0"):
    """WGSL statements defining `first`, the workgroup's first input row (groups of `rows` of the
    live `m`, a WGSL expression), and wg0, its group of outputs; expects `wid` and `nwg`."""
    return fill(ROW_GROUPS, M=m, ROWS=rows, FIRST=first)


def row_groups_grid(output_groups, m, rows):
    """The grid of row_groups' kernels: every group of outputs for each group of `rows` of m rows."""
    return fold_grid(output_groups * -(-m // rows))


FLAT_KERNEL = """
struct P { $FIELDS }
$BINDINGS
@group(0) @binding($UNIFORM) var<uniform> p: P;
$DECLARATIONS$FLAT_INDEX$FUNCTIONS
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let $INDEX = flat_index(gid, nwg, ${WG}u);
    if ($INDEX >= p.$COUNT) { return; }$BODY}
"""


def flat_kernel(fields, bindings, body, count="n", index="i", declarations="", functions=""):
    """A flat kernel, one invocation an item over a folded grid (`flat_grid`): `struct P { fields }`,
    the storage `bindings`, (name, WGSL element type, "read" or "read_write") from @binding(0) on,
    the uniform `p: P` bound after them, `declarations` (bindings numbered past the uniform, say),
    FLAT_INDEX, `functions`, then the entry point: invocation `index` at or past `p.<count>`
    returns, the others run `body` (WGSL statements, from a newline on). Placeholders ($NAME) in
    any of them stay in the text for a later `fill`."""
    lines = [f"@group(0) @binding({k}) var<storage, {access}> {name}: array<{t}>;" for k, (name, t, access) in enumerate(bindings)]
    return fill(
        FLAT_KERNEL,
        FIELDS=fields,
        BINDINGS="\n".join(lines),
        UNIFORM=len(bindings),
        DECLARATIONS=declarations,
        FLAT_INDEX=FLAT_INDEX,
        FUNCTIONS=functions,
        WG=WG,
        INDEX=index,
        COUNT=count,
        BODY=body,
    )


# Flat kernels over many elements take PER_INVOCATION of them, a grid apart: one element per
# 64-invocation workgroup made a 1 GiB tensor 4M workgroups, and launching them bounded an H100 at
# 850 GB/s (tools/bench/streaming.py) against 2.97 TB/s for a vec4 copy kernel. Such a kernel defines
# `fn element(i: u32)` and takes SPREAD_MAIN as its entry point, dispatched over `spread_grid(n)`.
PER_INVOCATION = 4
SPREAD_MAIN = fill(
    """
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let first = flat_index(gid, nwg, ${WG}u);
    let threads = nwg.x * nwg.y * ${WG}u;
    for (var e = 0u; e < ${PER_INVOCATION}u; e = e + 1u) { element(first + e * threads); }
}
""",
    WG=WG,
    PER_INVOCATION=PER_INVOCATION,
)


def spread_grid(n):
    """The grid of a SPREAD_MAIN kernel over n elements."""
    return flat_grid(-(-n // PER_INVOCATION))


def pack_u32x8(values):
    """Up to 8 u32s as the 32 bytes of a WGSL `array<vec4<u32>, 2>`; unused slots are 0."""
    values = list(values)
    if len(values) > 8:
        raise ValueError(f"rank {len(values)} exceeds 8")
    return struct.pack("<8I", *(values + [0] * (8 - len(values))))


def pack_strides(shape, out_shape):
    return pack_u32x8(broadcast_strides(shape, out_shape))


# Turning a flat output index into operand offsets through strides (see pack_strides), in one
# helper: `strided_offsets` gives i's offsets through up to three stride arrays (pass any array
# for an unused one), its row-major coordinates over the first `rank` of `sizes` dotted with each.
# Rank 0 means every operand is read at i itself (contiguous, nothing broadcast).
STRIDED = """
fn at8(a: array<vec4<u32>, 2>, i: u32) -> u32 { return a[i / 4u][i % 4u]; }
fn strided_offsets(i: u32, rank: u32, sizes: array<vec4<u32>, 2>, s0: array<vec4<u32>, 2>,
                   s1: array<vec4<u32>, 2>, s2: array<vec4<u32>, 2>) -> vec3<u32> {
    if (rank == 0u) { return vec3<u32>(i); }
    var rem = i;
    var o = vec3<u32>(0u);
    for (var d = i32(rank) - 1; d >= 0; d = d - 1) {
        let size = at8(sizes, u32(d));
        let c = rem % size;
        rem = rem / size;
        o = o + c * vec3<u32>(at8(s0, u32(d)), at8(s1, u32(d)), at8(s2, u32(d)));
    }
    return o;
}
"""


# Correctly rounded a / b for finite a and normal b (subnormal quotients flush to 0, overflow
# gives inf). The 24-bit quotient q of the mantissas is the float division's estimate (WGSL allows
# it 2.5 ULP), corrected by the exact remainder ma 2^23 - q mb, which wrapping u32 arithmetic
# gives since it is small; where the estimate is further off, restoring division. Then rounded to
# nearest even by twice the remainder against mb. (Restoring division alone, 24 steps: the one-row
# RMS norm and quantization's kernel, three divisions in qparams and the inverse scale, took 9.7 us
# a dispatch against 7.3-7.5 now on an H200: results/h200/kernel_choices/dq8_integer_dots/norm_in_the_product/.)
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
    var q = u32(f32(ma) / f32(mb) * 8388608.0);  // ma < 2^25 with its last bit 0: exact as f32
    var r = bitcast<i32>((ma << 23u) - q * mb);
    for (var i = 0u; i < 4u && r < 0; i = i + 1u) { q = q - 1u; r = r + i32(mb); }
    for (var i = 0u; i < 4u && r >= i32(mb); i = i + 1u) { q = q + 1u; r = r - i32(mb); }
    if (r < 0 || r >= i32(mb)) {
        q = 0u;
        var rest = ma;
        for (var i = 0u; i < 24u; i = i + 1u) {
            q = q << 1u;
            if (rest >= mb) { rest = rest - mb; q = q | 1u; }
            rest = rest << 1u;
        }
        r = i32(rest >> 1u);
    }
    let twice = 2u * u32(r);
    if (twice > mb || (twice == mb && (q & 1u) == 1u)) {
        q = q + 1u;
        if (q == 0x1000000u) { q = 0x800000u; e = e + 1; }
    }
    if (e <= 0) { return bitcast<f32>(sign); }
    if (e >= 255) { return bitcast<f32>(sign | 0x7F800000u); }
    return bitcast<f32>(sign | (u32(e) << 23u) | (q & 0x7FFFFFu));
}
"""


# An activation quantized to int8 with its row's (1 / scale, zero point, scale) and dequantized
# again, torchao's quantize_affine then dequantize_affine in f32: what an 8da4w product multiplies
# (kernels/matmul/q4_linear.py), and what kernels/quant/quantized_rows.py writes for it.
XQ = """
fn xq(v: f32, inv: f32, zp: f32, s: f32) -> f32 {
    return (clamp(round(v * inv) + zp, -128.0, 127.0) - zp) * s;
}
"""

# Dynamic activation quantization, choose_qparams' parameters and arithmetic: kernels/quant's ops'
# and the 4-bit products' that quantize their rows as they read them (QuantizingRows).
# The modes: torchao's mapping types (ASYMMETRIC is also determine_qparams' per-tensor affine rule
# of quantized_decomposed.choose_qparams), and the XNNPACK-style per-token asymmetric rule of
# choose_qparams_per_token_asymmetric.
MODES = {"ASYMMETRIC": 0, "SYMMETRIC": 1, "SYMMETRIC_NO_CLIPPING_ERR": 2, "PER_TOKEN_ASYMMETRIC": 3}
QP_FORMAT = "<IIIiiffff3I"  # blocks, block, mode, qmin, qmax, eps, divisor, zp_sym, norm_eps (quantized_rows.py), pad
QP_SIZE = struct.calcsize(QP_FORMAT)

# The parameters of kernels/quant's choose_qparams and quantized_rows kernels, and `qparams`: the
# scale and zero point of a block of minimum `lo` and maximum `hi` (each taken with 0), with
# torch's f32 arithmetic (divisions correctly rounded by div_rn).
QP_STRUCT = """
struct P { blocks: u32, block: u32, mode: u32, qmin: i32, qmax: i32, eps: f32, divisor: f32, zp_sym: f32,
           norm_eps: f32, pad0: u32, pad1: u32, pad2: u32 }
"""
QPARAMS = """
fn qparams(lo: f32, hi: f32) -> vec2<f32> {
    let qmin = f32(p.qmin);
    let qmax = f32(p.qmax);
    var sc = 0.0;
    var z = p.zp_sym;
    if (p.mode == 0u || p.mode == 3u) {
        sc = max(div_rn(hi - lo, p.divisor), p.eps);
        if (p.mode == 0u) {
            z = clamp(qmin - round(div_rn(lo, sc)), qmin, qmax);
        } else {
            let dmin = div_rn(lo, sc);
            let dmax = div_rn(hi, sc);
            z = round(clamp(select(qmax - dmax, qmin - dmin, (qmin + dmin) + (qmax + dmax) > 0.0), qmin, qmax));
        }
    } else if (p.mode == 1u) {
        sc = max(div_rn(max(-lo, hi), p.divisor), p.eps);
    } else {
        let smin = div_rn(lo, qmin);
        let smax = div_rn(hi, qmax);
        sc = select(smax, smin, smin > smax);
        sc = max(sc, p.eps);
    }
    return vec2<f32>(sc, z);
}
"""


def qp_bytes(mode, qmin, qmax, eps, blocks, block, norm_eps=0.0):
    """The uniform P of `blocks` blocks of `block` elements."""
    divisor = float(qmax - qmin) / (2 if mode in (1, 2) else 1)
    zp_sym = float(int((qmax + qmin + 1) / 2))
    return struct.pack(QP_FORMAT, blocks, block, mode, qmin, qmax, eps, divisor, zp_sym, norm_eps, 0, 0, 0)


def stored_zero_point(dtype):
    """WGSL of qparams' zero point `qp.y` (f32) as a zero point stored as `dtype` reads back."""
    return "f32((i32(qp.y) << 24u) >> 24u)" if dtype in PACKED else "f32(i32(qp.y))"


def affine_args(b):
    """(mode, qmin, qmax, eps, block) of choose_qparams_affine's arguments 0-6 (those of
    kernels/quant/quantized_rows.py's ops too), or ValueError naming what is not supported."""
    xt = b.tensor(0)
    if not is_float(xt.dtype):
        b.fail(f"input dtype {xt.dtype}")
    mapping = b.scalar(1)
    if mapping not in MODES or mapping == "PER_TOKEN_ASYMMETRIC":
        b.fail(f"mapping type {mapping!r} is not supported")
    block = tuple(b.value(2).items)
    if len(block) != len(xt.dims) or any(int(s) != 1 for s in block[:-1]) or block[-1] <= 0:
        b.fail(f"block_size {list(block)} for input {list(xt.dims)}: only [1, ..., 1, B] (per row group)")
    qmin, qmax = b.scalar(4, -128), b.scalar(5, 127)
    eps = b.scalar(6, None)
    eps = 2.0**-126 if eps is None else float(eps)  # torch.finfo(float32).smallest_normal
    return MODES[mapping], qmin, qmax, eps, int(block[-1])


# Subgroup kernels: each invocation's lane and the subgroup's size, added to an entry point's
# builtins; vec4 loads of a tensor stored as f32 or f16.
SUBGROUP_BUILTINS = ", @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sgs: u32"


@dataclass(frozen=True)
class Int8Rows:
    """The storage of rows quantized to int8 (kernels/quant/quantized_rows.py's int32 tensor
    [..., k + k / 4 + 2], at most `rows` rows of `k`), in four parts: the rows as floats, (q - zp)
    * scale (the values wgsl.py's XQ gives), [rows, k]; the int8 values, k / 4 words a row, every
    8 in two words, the even ones then the odd ones (a 4-bit weight word's nibbles in that order:
    low nibbles with the first, high with the second); the rows' scales (f32 bits); their zero
    points (i32). The float kernels read the first part, the integer products the others."""

    k: int
    rows: int

    def loader(self, name):
        """WGSL `{name}4(i)`: floats 4i .. 4i + 3 of the rows, from binding `name` bound as vec4<u32>."""
        return f"fn {name}4(i: u32) -> vec4<f32> {{ return bitcast<vec4<f32>>({name}[i]); }}\n"

    def element_loader(self, name):
        """WGSL `{name}_at(e)`: float e of the rows, from binding `name` bound as u32."""
        return f"fn {name}_at(e: u32) -> f32 {{ return bitcast<f32>({name}[e]); }}\n"

    def offsets(self):
        """The words where the int8 values, the scales and the zero points start."""
        values = self.rows * self.k
        scales = values + values // 4
        return values, scales, scales + self.rows

    def pairs_loader(self, name):
        """WGSL for the integer products over binding `name` bound as vec2<u32>: `{name}_pair(i)`,
        the two words of the rows' values 8i .. 8i + 7, and `{name}_scale(r)`, `{name}_zp(r)`."""
        values, scales, zps = self.offsets()
        return fill(INT8_ROWS_PAIRS, NAME=name, PAIRS=values // 2, SCALES=scales, ZPS=zps)


@dataclass(frozen=True)
class QuantizingRows:
    """Float rows (stored as `t`) that a 4-bit product's kernel quantizes as it reads them (a
    subgroup kernel to int8 words, the GEMV to the values XQ gives), each row as
    kernels/quant/quantized_rows.py writes it into Int8Rows: bitwise the same values, scale and
    zero point (the row's minimum and maximum are exact in any order). The kernel binds the rows
    (as vec4s, `vec4_type(t)`, in a subgroup kernel) and a uniform `p: P` (QP_STRUCT, qp_bytes of
    one block: a row); `scale_type` and `zp`: how the scales and zero points were stored (wgsl
    types; zp a WGSL expression of qp.y, as quantized_rows.py's)."""

    t: str
    scale_type: str
    zp: str
    invocations: int  # the kernel's workgroup size

    def uniform(self, binding):
        """WGSL of the uniform `p: P` at `binding`, div_rn, qparams, and `row_qp(lo, hi)`: a row's
        (scale, zero point, 1 / scale) from its minimum and maximum."""
        qp = fill(ROW_QP, SCALE=rounded("qp.x", self.scale_type), ZP=self.zp)
        return QP_STRUCT + f"@group(0) @binding({binding}) var<uniform> p: P;\n" + DIV_RN + QPARAMS + qp

    def pairs_loader(self, name):
        """WGSL over binding `name` (the subgroup kernels', after `uniform`): `{name}_qp(r, li, lane,
        sgs)`, row r's row_qp from a pass of the workgroup over the row (every invocation calls it,
        in uniform control flow), and `{name}_pair(i, inv, zp)`, the int8 values 8i .. 8i + 7 of
        the rows as Int8Rows' two words (the even values', the odd ones')."""
        return vec4_loader(name, self.t) + fill(QUANTIZING_ROWS, NAME=name, LOADS=QUANTIZING_LOADS, WG=self.invocations)


ROW_QP = """
fn row_qp(lo: f32, hi: f32) -> vec3<f32> {
    let qp = qparams(lo, hi);
    let s = ${SCALE};
    return vec3<f32>(s, ${ZP}, div_rn(1.0, s));
}
"""
QUANTIZING_LOADS = 16  # quads an invocation loads at once in QuantizingRows' pass over a row
QUANTIZING_ROWS = """
var<workgroup> ${NAME}_ranges: array<vec2<f32>, ${WG}>;  // each subgroup's minimum and maximum of the row
fn ${NAME}_qp(r: u32, li: u32, lane: u32, sgs: u32) -> vec3<f32> {
    let quads = p.block / 4u;
    let last = r * quads + quads - 1u;
    var mn = vec4<f32>(0.0);
    var mx = vec4<f32>(0.0);
    for (var j = r * quads + li; j <= last; j = j + ${LOADS}u * ${WG}u) {
        for (var u = 0u; u < ${LOADS}u; u = u + 1u) {  // unrolled: the loads in flight together
            let a = ${NAME}4(min(j + u * ${WG}u, last));
            mn = min(mn, a);
            mx = max(mx, a);
        }
    }
    let lo = subgroupMin(min(min(mn.x, mn.y), min(mn.z, mn.w)));
    let hi = subgroupMax(max(max(mx.x, mx.y), max(mx.z, mx.w)));
    if (lane == 0u) { ${NAME}_ranges[li / sgs] = vec2<f32>(lo, hi); }
    workgroupBarrier();
    var range = ${NAME}_ranges[0];
    for (var g = 1u; g < ${WG}u / sgs; g = g + 1u) { range = vec2<f32>(min(range.x, ${NAME}_ranges[g].x), max(range.y, ${NAME}_ranges[g].y)); }
    workgroupBarrier();  // before another row's ranges
    return row_qp(range.x, range.y);
}
fn ${NAME}_pair(i: u32, inv: f32, zp: f32) -> vec2<u32> {
    let a = vec4<i32>(clamp(round(${NAME}4(2u * i) * inv) + zp, vec4<f32>(-128.0), vec4<f32>(127.0)));
    let b = vec4<i32>(clamp(round(${NAME}4(2u * i + 1u) * inv) + zp, vec4<f32>(-128.0), vec4<f32>(127.0)));
    return vec2<u32>(pack4xI8(vec4<i32>(a.xz, b.xz)), pack4xI8(vec4<i32>(a.yw, b.yw)));
}
const LOW_NIBBLES = 0x0F0F0F0Fu;
const ONES = 0x01010101u;
"""


def int8_rows_k(last):
    """The K of int8 rows whose tensor's last dim is `last` (Int8Rows)."""
    return 4 * (last - 2) // 5


def int8_rows_dim(k):
    """The last dim of the int8 rows tensor of rows of `k` (Int8Rows)."""
    return k + k // 4 + 2


INT8_ROWS_PAIRS = """
fn ${NAME}_pair(i: u32) -> vec2<u32> { return ${NAME}[${PAIRS}u + i]; }
fn ${NAME}_word(i: u32) -> u32 { return ${NAME}[i / 2u][i % 2u]; }
fn ${NAME}_scale(r: u32) -> f32 { return bitcast<f32>(${NAME}_word(${SCALES}u + r)); }
fn ${NAME}_zp(r: u32) -> i32 { return bitcast<i32>(${NAME}_word(${ZPS}u + r)); }
const LOW_NIBBLES = 0x0F0F0F0Fu;
const ONES = 0x01010101u;
"""


# kernels/quant/quantized_rows.py's rows as one function, `quantize_row(row, li)`, called by every
# invocation of a workgroup of ROW_INVOCATIONS (in uniform control flow): the row held in
# registers, 4 elements a load; with an RMS norm first, its squares' tree; the minimum and
# maximum's tree; one write. Its op's dispatch runs it, and so does the last workgroup of a 4-bit
# product's one-row GEMV (same size; kernels/matmul/q4_linear.py's normalized_row): the same sums
# in the same order, so the same bits.
ROW_INVOCATIONS = 256
QUANTIZE_ROW = """
var<workgroup> qr_lo: array<f32, ${WG}>;
var<workgroup> qr_hi: array<f32, ${WG}>;
$PACKED
fn quantize_row(row: u32, li: u32) {
    let base = row * ${QUADS}u;
    var v: array<vec4<f32>, ${HELD}>;  // quads li, li + WG, ..; zeros past the row
    for (var i = 0u; i < ${HELD}u; i = i + 1u) {
        let j = li + i * ${WG}u;
        if (j < ${QUADS}u) { v[i] = ${LOAD}(base + j); }
    }
$NORM
    var mn = vec4<f32>(0.0);
    var mx = vec4<f32>(0.0);
    for (var i = 0u; i < ${HELD}u; i = i + 1u) { mn = min(mn, v[i]); mx = max(mx, v[i]); }
    qr_lo[li] = min(min(mn.x, mn.y), min(mn.z, mn.w));
    qr_hi[li] = max(max(mx.x, mx.y), max(mx.z, mx.w));
    workgroupBarrier();
    for (var s = ${HALF}u; s > 0u; s = s >> 1u) {
        if (li < s) { qr_lo[li] = min(qr_lo[li], qr_lo[li + s]); qr_hi[li] = max(qr_hi[li], qr_hi[li + s]); }
        workgroupBarrier();
    }
    let qp = qparams(qr_lo[0], qr_hi[0]);
    let s = ${SCALE};
    let zp = ${ZP};
    let inv = div_rn(1.0, s);
$STORE
}
"""
# the norm: rstd from the row's squares (qr_lo holds the invocations' sums, read before it is
# reused), then each element x * rstd * gamma as the norm stored it
ROW_NORM = """    var q = 0.0;
    for (var i = 0u; i < ${HELD}u; i = i + 1u) { q = q + dot(v[i], v[i]); }
    qr_lo[li] = q;
    workgroupBarrier();
    for (var s = ${HALF}u; s > 0u; s = s >> 1u) {
        if (li < s) { qr_lo[li] = qr_lo[li] + qr_lo[li + s]; }
        workgroupBarrier();
    }
    let rstd = inverseSqrt(qr_lo[0] / f32(${BLOCK}u) + p.norm_eps);
    workgroupBarrier();
    for (var i = 0u; i < ${HELD}u; i = i + 1u) {
        let j = li + i * ${WG}u;
        if (j < ${QUADS}u) { v[i] = vec4<f32>(vec4<${X_TYPE}>(v[i] * rstd * gamma4(j))); }
    }"""
# The rows as the products multiply them (f32), each element by XQ
ROW_FLOATS = """    for (var i = 0u; i < ${HELD}u; i = i + 1u) {
        let j = li + i * ${WG}u;
        let e = v[i];
        if (j < ${QUADS}u) { ${OUT}[base + j] = vec4<f32>(xq(e.x, inv, zp, s), xq(e.y, inv, zp, s), xq(e.z, inv, zp, s), xq(e.w, inv, zp, s)); }
    }"""
# ... or as Int8Rows: the floats as above (their bits), and each quad's int8 values packed into
# workgroup memory, from where every 4 quads (16 values) leave as 4 words (of each 8 values, the
# even ones, then the odd ones); then the row's scale and zero point
ROW_INT8 = """    for (var i = 0u; i < ${HELD}u; i = i + 1u) {
        let j = li + i * ${WG}u;
        if (j < ${QUADS}u) {
            let c = clamp(round(v[i] * inv) + zp, vec4<f32>(-128.0), vec4<f32>(127.0));  // xq's, a quad at a time
            ${OUT}[base + j] = bitcast<vec4<u32>>((c - zp) * s);
            qr_packed[j] = pack4xI8(vec4<i32>(c));
        }
    }
    workgroupBarrier();
    for (var t = li; t < ${QUADS}u / 4u; t = t + ${WG}u) {
        let a = unpack4xI8(qr_packed[4u * t]);
        let b = unpack4xI8(qr_packed[4u * t + 1u]);
        let c = unpack4xI8(qr_packed[4u * t + 2u]);
        let d = unpack4xI8(qr_packed[4u * t + 3u]);
        ${OUT}[(${WORDS}u + base) / 4u + t] = vec4<u32>(pack4xI8(vec4<i32>(a.xz, b.xz)), pack4xI8(vec4<i32>(a.yw, b.yw)),
                                                        pack4xI8(vec4<i32>(c.xz, d.xz)), pack4xI8(vec4<i32>(c.yw, d.yw)));
    }
    if (li == 0u) {
        ${OUT}[(${SCALES}u + row) / 4u][(${SCALES}u + row) % 4u] = bitcast<u32>(s);
        ${OUT}[(${ZPS}u + row) / 4u][(${ZPS}u + row) % 4u] = bitcast<u32>(i32(zp));
    }"""


@dataclass(frozen=True)
class RowQuantizer:
    """kernels/quant/quantized_rows.py's rows of `block` elements (a multiple of 4) stored as
    `x_type`, an RMS norm first with `norm` (WGSL gamma4(j), the uniform's p.norm_eps), quantized
    by qparams (uniform p: QP_STRUCT, DIV_RN, QPARAMS) with scales and zero points stored as
    `scale_type` and `zp` (a WGSL expression of qp.y: stored_zero_point), written to binding `out`
    (vec4s) as Int8Rows of at most `rows` rows, or with `rows` 0 as the floats XQ gives: WGSL of
    QUANTIZE_ROW's `quantize_row(row, li)`, reading the row's quads through the WGSL function
    `load`."""

    block: int
    x_type: str
    scale_type: str
    zp: str
    norm: bool
    rows: int
    load: str = "x4"
    out: str = "out"

    def wgsl(self):
        quads = self.block // 4
        loop = dict(HELD=-(-quads // ROW_INVOCATIONS), WG=ROW_INVOCATIONS, QUADS=quads)
        norm = fill(ROW_NORM, HALF=ROW_INVOCATIONS // 2, BLOCK=self.block, X_TYPE=self.x_type, **loop) if self.norm else ""
        packed = ""
        if self.rows:
            values, scales, zps = Int8Rows(self.block, self.rows).offsets()
            store = fill(ROW_INT8, OUT=self.out, WORDS=values, SCALES=scales, ZPS=zps, **loop)
            packed = f"var<workgroup> qr_packed: array<u32, {quads}>;  // the row's int8 values, a quad a word"
        else:
            store = fill(ROW_FLOATS, OUT=self.out, **loop)
        return fill(QUANTIZE_ROW, HALF=ROW_INVOCATIONS // 2, PACKED=packed, LOAD=self.load, NORM=norm, SCALE=rounded("qp.x", self.scale_type), ZP=self.zp,
                    STORE=store, **loop)


# Whether the calling workgroup is the last of `count` to arrive at counter `slot` of binding
# `arrivals` (array<atomic<u32>>, zeros), after its storage writes: that one then reads what the
# others wrote (naga's storage barrier orders storage accesses at device scope; not where
# merge_apart: async_runtime/backend.py) and sets the counter back to 0. Every invocation calls it,
# in uniform control flow.
LAST_TO_ARRIVE = """
var<workgroup> arrived_last: u32;
fn last_to_arrive(li: u32, slot: u32, count: u32) -> bool {
    storageBarrier();
    if (li == 0u) { arrived_last = u32(atomicAdd(&arrivals[slot], 1u) == count - 1u); }
    if (workgroupUniformLoad(&arrived_last) == 0u) { return false; }
    storageBarrier();
    if (li == 0u) { atomicStore(&arrivals[slot], 0u); }
    return true;
}
"""


def binding_type(t):
    """The WGSL element type a kernel binds a tensor stored as `t` with, one element a load."""
    return "u32" if isinstance(t, Int8Rows) else t.t if isinstance(t, QuantizingRows) else t


def vec4_type(t):
    """The array element type a subgroup kernel binds a tensor stored as `t` with: vec4<f32>, or
    for f16 vec2<u32> (4 halves, unpacked by `vec4_loader`): on lavapipe a vec4<f16> load is four
    16-bit loads a lane and made a one-row f16 GEMV slower than f32's (LM head 47 against 36
    CPU-ms), a vec2<u32> two 32-bit loads; int8 rows' floats as vec4<u32>."""
    return "vec4<u32>" if isinstance(t, Int8Rows) else {"f32": "vec4<f32>", "f16": "vec2<u32>"}[t]


def vec4_loader(name, t):
    """WGSL `fn {name}4(i: u32) -> vec4<f32>`: vec4 i of binding `name` (bound as vec4_type(t))."""
    if isinstance(t, Int8Rows):
        return t.loader(name)
    value = f"{name}[i]" if t == "f32" else f"vec4<f32>(unpack2x16float({name}[i].x), unpack2x16float({name}[i].y))"
    return f"fn {name}4(i: u32) -> vec4<f32> {{ return {value}; }}\n"


# GELU of `a` by torch's approximations ("none": erf; "tanh"), the elementwise op's and a linear's epilogue's
GELU = {
    "none": "0.5 * a * (1.0 + erf_approx(a * 0.70710678118654752))",
    "tanh": "0.5 * a * (1.0 + tanh(clamp(0.7978845608028654 * (a + 0.044715 * a * a * a), -20.0, 20.0)))",
}
# erf with |error| < 1.2e-7 (Numerical Recipes erfc), so gelu matches torch to ~1e-7.
ERF = """
fn erf_approx(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
            t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
            t * (-0.82215223 + t * 0.17087277)))))))));
    return select(r - 1.0, 1.0 - r, x >= 0.0);
}
"""
