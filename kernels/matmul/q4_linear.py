"""4-bit group-symmetric weights (q4gsw) and dynamic int8 activation quantization.

Formats (as `executorch.backends.vulkan.patterns` writes them):
- weight: uint8 [N, Kp / 2] raw bytes, Kp = K padded to a multiple of 8 with zeros; byte b of a row
  holds k = 2b in its low nibble and k = 2b + 1 in its high nibble, each stored as (q + 8), q in
  [-8, 7]. Read in WGSL as u32 words, so word w of a row holds k = 8w + j at bits 4j..4j+3.
- weight scales: f32 [num_groups, Np] (transposed; N padded to a multiple of 4), group = k / gs.
  The dequantized weight is (nibble - 8) * scale, exactly as torchao's dequantize_affine. The
  kernels read them as [Np / 4, num_groups, 4], by quads of weight rows (`scales_in_row_quads`, at
  load).
- `et_vk.embedding_q4gsw` (kernels/tensor/embedding.py): the same nibbles, per-row scales [V, groups] (not transposed); with
  `is_linear_weight` false the even element sits in the high nibble instead.
- `torchao.choose_qparams_affine` (kernels/quant/quantize.py) gives per-block scale (f32) and zero point (int8, stored packed
  4 per word, or int32); `et_vk.linear_dq8ca_q4gsw` quantizes its input with them on the fly,
  q = clamp(round(x * (1 / scale)) + zp, -128, 127), and multiplies (q - zp) * scale by the
  dequantized weight, the math of torchao's quantize_affine / dequantize_affine. The divisions
  are done by `div_rn`, an integer long division that is correctly rounded on every GPU (WGSL
  allows 2.5 ULP for `/`), so the integer activations match the CPU reference exactly.

The two linear ops record GEMV routes (up to Q4_GEMV_MAX_ROWS rows, dq8 GEMV_MAX_ROWS, on GPUs BITWISE_ROWS for weights
of GEMV_T4_MIN_N rows or more, kernels/matmul/routes.py's gpu_gemv_rows; each its own: a workgroup's 256
threads reduce over K for quads of outputs, one u32 word = 8 weights per thread step (half a word
for weights of routes.py's q4_wide K, gemv_step), as many threads a quad as the row count suits,
gemv_routes) and a GEMM route (more rows:
kernels/matmul/gemm.py's template with a B load that dequantizes each weight as it is staged, and with
dq8 an A load that quantizes each activation; split-K as for fp32). On CPU adapters with
subgroups, where K and the group size are multiples of 16 (a lane's step: 2 words), two subgroup
kernels take every row count instead (one row, and Q4_SG_GEMM's shape for more); on GPUs with
subgroups one takes the GEMV's rows past BITWISE_ROWS (routes.py's Q4_SG_GPU_ROWS), and for weights
of q4_wide K or an LM head's rows every row count to BITWISE_ROWS (Q4_SG_GPU_WIDE, no GEMV); dq8
products alike, each row's activations quantized as the kernels read them (where the dq8 GEMV takes
one row a workgroup: H200, Llama-3.2-1B 8da4w, greedy bursts, two rounds in one call, 1 / 16 streams
330-332 / 1,178-1,180 -> 383-387 / 2,297-2,317 tokens/s, 32-64 and prompts the same;
results/h200/kernel_choices/dq8_subgroup_kernels/). The hook zeroes the grids of the routes not taken.

Activations, scales, bias and outputs are stored as their tensors' types (f32, or f16 for
float16, in any mix); every kernel converts at the load and the store, and dequantizes and sums
in f32. An 8da4w product's rows quantized once (kernels/wgsl.py's Int8Rows, an int32 tensor) the
GEMV and the GEMM read as those floats, and the subgroup kernels as int8: a lane's step of 16
weights as dot4I8Packed of the nibbles with the values, exact in i32, then the weights' and the
row's scales in f32 (sg_body's `int8`; every row count in one order, so a row of a pass is still
bitwise the row alone; two roundings where the float products had three). H200, Llama-3.2-1B
shape 8da4w, greedy bursts, two rounds in one call: 1 / 2 / 4 / 16 streams 663-668 / 1,124-1,135
/ 1,806-1,818 / 3,154-3,168 -> 750-753 / 1,249-1,253 / 2,271-2,293 / 4,753-4,764 tokens/s, 32-64
and prompts within 2%; SmolLM2 shape, whose 17-64 rows take the subgroup kernel, 64 streams
14,968-15,353 -> 19,162-19,339 (results/h200/kernel_choices/dq8_integer_dots/).

Kept as one module past 400 lines: the 4-bit formats are read by every kernel here, and the family's variants share them.
"""

import struct
from collections import Counter
from dataclasses import dataclass, replace

from pte_wgpu.resize.shapes import numel_of
from pte_wgpu.resize.values import Tensor

from ..registry import op, value_uses
from ..variants import CPU
from ..wgsl import (
    DIV_RN,
    LAST_TO_ARRIVE,
    PACKED,
    QP_SIZE,
    ROW_INVOCATIONS,
    SUBGROUP_BUILTINS,
    XQ,
    Int8Rows,
    QuantizingRows,
    RowQuantizer,
    affine_args,
    binding_type,
    fill,
    int8_rows_k,
    is_float,
    qp_bytes,
    rounded,
    row_groups,
    row_groups_grid,
    stored_zero_point,
    vec4_loader,
    vec4_type,
    wgsl_type,
)
from . import int8_matrix
from .f16_matrix import STEP as MATRIX_STEP
from .gemm import (
    MATRIX_TILE,
    PARAMS_SIZE,
    WIDEN_MAX_BYTES,
    GemmRoute,
    TileLoad,
    WeightSource,
    bindings,
    dequantized_halves,
    float_a_load,
    gemm_scratch,
    params_bytes,
)
from .linear import CPU_WG, fold_rstd, sg_groups, sg_splits_k, sg_sums, sg_total, sg_wg_rows
from .routes import (
    BITWISE_ROWS,
    GEMV_MAX_ROWS,
    GEMV_T4_MIN_N,
    Q4_GEMV_MAX_ROWS,
    Q4_SG_GPU,
    Q4_SG_GPU_NARROW_SPLIT,
    Q4_SG_GPU_ROWS,
    Q4_SG_GPU_WIDE,
    Q4_SG_GPU_WIDE_SPLIT,
    gpu_gemv_rows,
    q4_exact_rows,
    q4_wide,
    q4_wide_shapes,
    shape_for_rows,
)

# The GEMV spreads a row's words over `lanes` invocations a quad of outputs, so a workgroup of
# GEMV_WG takes 4 * GEMV_WG / lanes outputs; which lanes, by the pass's row count (gemv_routes).
# GEMV_WG lanes leave most of them idle at K = 576 (72 words), which cost several rows dearly; yet
# fewer lanes cost one decode row more in a real pass than the per-dispatch profile shows. H100,
# SmolLM2-shaped 4w export, greedy bursts (one stream, 6 runs; 16 and 32 streams), one call:
# GEMV_WG lanes at every count 537 / 3,467 / 4,203 tokens/s; half the words 504 / 4,900 / 6,574; a
# quarter 449 / 5,230 / 7,180. (The per-dispatch profile of one row: 3,671 us at GEMV_WG lanes,
# 3,037 at a quarter.)
GEMV_WG = 256


def _lanes(words, share):
    """The smallest power of two from 32 holding 1 / `share` of `words`, at most GEMV_WG."""
    lanes = 32
    while lanes < GEMV_WG and share * lanes < words:
        lanes *= 2
    return lanes


NO_TAIL = ("", "")  # a GEMV's (declarations, last statement) without norm_tail's

# Input rows a GEMV workgroup takes past one row, and past GEMV_MAX_ROWS: each weight word is
# dequantized once for them all. A row's sums are the same whatever the count (its own
# accumulators and tree).
GEMV_GROUP_ROWS, GEMV_GROUP_ROWS_PAST_MAX = 2, 4


def gemv_routes(words, grouped=True):
    """The GEMV's dispatches for rows of `words` u32 words, as (most rows, lanes, rows a
    workgroup), by row count: GEMV_WG lanes for one row; up to BITWISE_ROWS rows the lanes
    holding half the words, whose sums are GEMV_WG lanes' bit for bit up to a zero's sign (a lane
    adds its second word where the wider tree's first live step would), so a row of a pass is what
    it gets alone; more rows a quarter of them; past one row GEMV_GROUP_ROWS rows a workgroup,
    past GEMV_MAX_ROWS GEMV_GROUP_ROWS_PAST_MAX (up to Q4_GEMV_MAX_ROWS: H100, SmolLM2 4w, 48 and 64 streams 7,405 and
    9,867 tokens/s with the dequantizing GEMM there, 8,868 and 11,724 with this). Neighbours of the
    same shape are one dispatch. `grouped` False: one row a workgroup, none past GEMV_MAX_ROWS (dq8).
    None past BITWISE_ROWS for weights of kernels/matmul/routes.py's q4_wide K; at such K one row
    takes the lanes of up to BITWISE_ROWS rows too (H100, Llama-3.2-1B shape 4w, one and 16
    streams: 681 / 1,600 tokens/s at GEMV_WG lanes for one row, 706-712 / 1,602-1,609 at half the
    words; a quarter 666-670 / 1,830, an eighth 537-540 / 1,962-1,964:
    results/h100/kernel_choices/q4_gemv_lanes_wide_k/)."""
    routes, group = [], GEMV_GROUP_ROWS if grouped else 1
    if q4_wide(8 * words):  # the GEMM past BITWISE_ROWS; one row at their lanes (their bits)
        shapes = [(1, _lanes(words, 2), 1), (BITWISE_ROWS, _lanes(words, 2), group)]
    else:
        shapes = [(1, GEMV_WG, 1), (BITWISE_ROWS, _lanes(words, 2), group), (GEMV_MAX_ROWS, _lanes(words, 4), group)]
        shapes += [(Q4_GEMV_MAX_ROWS, _lanes(words, 4), GEMV_GROUP_ROWS_PAST_MAX)] if grouped else []
    for most, lanes, rows in shapes:
        if routes and routes[-1][1:] == (lanes, rows):
            routes[-1] = (most, lanes, rows)
        else:
            routes.append((most, lanes, rows))
    return routes


def gemv_step(words):
    """Weights of K a GEMV lane takes at a time for rows of `words` words: a word (8) where the
    routes' lanes hold at most two steps (gemv_routes: their trees agree), 4 for weights of
    q4_wide K, whose routes share their lanes. At 4 a warp's loads of a row's inputs are 16
    bytes apart, not 32: half the cache lines a load (H100, Llama-3.2-1B shape 4w, greedy
    bursts: BENCHMARKS.md)."""
    return 4 if q4_wide(8 * words) else 8


def gemv_route(routes, m):
    """The index of the route of `routes` (gemv_routes) that takes M rows (the last past them)."""
    return next((i for i, (most, _, _) in enumerate(routes) if m <= most), len(routes) - 1)


def gemv_outputs(lanes):
    """Outputs a GEMV workgroup takes at `lanes` lanes a quad."""
    return 4 * GEMV_WG // lanes


# A signed byte of the packed int8 array $ZP_ARRAY.
I8_AT = """
fn i8_at(i: u32) -> i32 {
    let w = $ZP_ARRAY[i / 4u];
    return bitcast<i32>(w << (24u - 8u * (i % 4u))) >> 24u;
}
"""

# ---------------------------------------------------------------- linear_q4gsw / linear_dq8ca_q4gsw

LIN_FIELDS = ("M", "N", "K", "wpr", "groups", "gs", "kw")
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
    x, wq = (sg_x_type(types.x), f"vec{Q4_SG_WORDS}<u32>") if vec4 else (binding_type(types.x), "u32")
    return (("x", x), *acts, ("wq", wq), ("ws", types.ws))


def q4_input(b, x):
    """(storage, most K) of a 4-bit product's input `x`: its float storage type, or wgsl.py's
    Int8Rows for the int8 rows pte_wgpu.quantized_rows writes (an int32 tensor)."""
    v = b.graph.values[x]
    if v.dtype == "int32":
        k = int8_rows_k(v.dims[-1])
        return Int8Rows(k, numel_of(v.dims[:-1])), k
    return b.storage(x), v.dims[-1]


def live_k(b, x, dims):
    """The K of input `x` at live `dims`."""
    return int8_rows_k(dims[-1]) if b.graph.values[x].dtype == "int32" else dims[-1]


def sg_x_type(t):
    """The subgroup kernels' binding of inputs stored as `t`: vec4s, or int8 rows' words in pairs."""
    return "vec2<u32>" if isinstance(t, Int8Rows) else vec4_type(t.t if isinstance(t, QuantizingRows) else t)


def sg_x_loader(t):
    """The subgroup kernels' loader of inputs stored as `t` (binding x)."""
    return t.pairs_loader("x") if isinstance(t, (Int8Rows, QuantizingRows)) else vec4_loader("x", t)


def int8_rows_at(t):
    """The GEMV's `x_at` for inputs stored as `t`: None (its own float loads), or for int8 rows
    their loader's floats."""
    return (lambda r, e: f"x_at(xo{r} + {e})") if isinstance(t, Int8Rows) else None


def int8_rows_loader(t, name="x"):
    """The int8 rows' loader (wgsl.py's Int8Rows) where inputs stored as `t` are such rows."""
    return t.element_loader(name) if isinstance(t, Int8Rows) else ""


def _zero_points(packed):
    """`zp_at(m)`: row m's activation zero point from binding xz (int8 packed 4 a word, or i32)."""
    if packed:
        return fill(I8_AT, ZP_ARRAY="xz") + "fn zp_at(m: u32) -> f32 { return f32(i8_at(m)); }\n"
    return "fn zp_at(m: u32) -> f32 { return f32(xz[m]); }\n"


def _dequant(dq8, zp_packed, gs, scales=(("", "ws"),)):
    """WGSL both routes share: the weights' dequantization over uniform `q`, and with `dq8` the
    activations' quantize-dequantize. `gs`: the group size, a constant of the shader (a shift or a
    multiply, not a division of the uniform's q.gs: the same groups), or None for q.gs, groups of
    whole words. `scales`: (suffix, scale binding) of each weight, scales [N / 4, q.groups, 4]
    (scales_in_row_quads), for its `wscale<suffix>` and `dq8<suffix>` (the fused ops read several
    weights)."""
    group, word_group = (f"{gs}u", gs % 8 == 0) if gs else ("q.gs", True)
    # Nibbles read through a float's mantissa (bitcast of n | 0x4b000000, minus 2^23 + 8: the same
    # bits, no integer-to-float conversion) were no faster: H100, Llama-3.2-1B 4w, greedy bursts,
    # rounds old / new / new / old in one call, 1 / 16 / 64 streams 929 / 3,437 / 8,457 and 924 /
    # 3,425 / 8,378 -> 933 / 3,432 / 8,400 and 908 / 3,409 / 8,264 tokens/s, a prompt of 512
    # tokens 15,637 / 15,591 -> 15,462 / 15,703 (results/h100/kernel_choices/q4_nibbles_through_the_mantissa/).
    src = """
struct W8 { a: vec4<f32>, b: vec4<f32> }
// The 8 weights of one word, k = 8w .. 8w + 7, before their scale: nibble - 8.
fn nibbles(word: u32) -> W8 {
    let v = vec4<u32>(word);
    let lo = vec4<f32>((v >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - vec4<f32>(8.0);
    let hi = vec4<f32>((v >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) - vec4<f32>(8.0);
    return W8(lo, hi);
}
// Word u of a row bound as vec2<u32>s (the subgroup kernels'), from the pair holding it.
fn word_of(pair: vec2<u32>, u: u32) -> u32 { return select(pair.x, pair.y, (u & 1u) == 1u); }
"""
    for suffix, ws in scales:
        at = f"((n >> 2u) * q.groups + min(k / {group}, q.groups - 1u)) * 4u + (n & 3u)"
        src += f"fn wscale{suffix}(k: u32, n: u32) -> f32 {{ return f32({ws}[{at}]); }}\n"
        # the 4 weights k0 .. k0 + 3 (k0 a multiple of 4) in the low 16 bits of `bits`, dequantized
        src += f"fn dq4{suffix}(bits: u32, k0: u32, n: u32) -> vec4<f32> {{\n"
        src += "    let w = vec4<f32>((vec4<u32>(bits) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - vec4<f32>(8.0);\n"
        if word_group:  # gs % 8 == 0: one group per word
            src += f"    return w * wscale{suffix}(k0, n);\n}}\n"
        else:
            src += f"    return w * vec4<f32>({', '.join(f'wscale{suffix}(k0 + {i}u, n)' for i in range(4))});\n}}\n"
    if dq8:
        src += DIV_RN + _zero_points(zp_packed) + XQ
    return src


def _gemv_header(dq8, zp_packed, has_bias, types, vec4=False, residual=False, operands=None):
    """The plain op's bindings (`operands` in place of its read bindings; QuantizingRows' uniform
    after them) and `epilogue(acc, m, n)`: with `residual`, the bias binding holds an [M, N] residual added to the product as
    `pte_wgpu.q4_linear_residual` does it (the product rounded to the output's type first, as the
    add it replaced read it)."""
    operands = operands or _operands(dq8, zp_packed, types, vec4)
    lines = [LIN_STRUCT + ";", *bindings(operands, has_bias, uniform="q: Q", bias=types.bias, out=types.out)]
    if isinstance(types.x, QuantizingRows):  # its uniform after q
        lines.append(types.x.uniform(len(operands) + has_bias + 2))
    total = rounded("acc", types.out) + " + f32(bias[m * q.N + n])" if residual else "acc + f32(bias[n])" if has_bias else "acc"
    lines.append(f"fn epilogue(acc: f32, m: u32, n: u32) -> {types.out} {{ return {types.out}({total}); }}")
    return "\n".join(lines) + "\n"


GEMV_MAIN = """
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {$ROW_GROUPS
    let live = min(${ROWS}u, q.M - m0);$OFFSETS
"""


def gemv_main(rows):
    """The GEMV's entry: workgroup (wg0, group of rows: kernels/wgsl.py's row_groups) takes input
    rows m0 .. m0 + rows - 1, `live` of them, row r at element xo{r} of x."""
    offsets = "".join(f"\n    let xo{r} = (m0 + {r}u) * q.K;" for r in range(rows))
    return fill(GEMV_MAIN, ROWS=rows, ROW_GROUPS=row_groups("q.M", rows, "m0"), OFFSETS=offsets)


def gemv_body(dq8, weights, n, store, lanes, x_at=None, partners=False, rows=1, step=8, quantizing=False):
    """The GEMV's statements for the outputs of workgroup `wg` of N = `n` (WGSL), input rows r <
    `rows` from m0 (gemv_main): each quad of outputs from `n0` summed by `lanes` invocations, over
    `weights` ((word binding, suffix of its `dq4` function) pairs read for the same outputs,
    dequantized once for every row; one accumulator and one tree of `red`'s 256-vec4 slices a
    weight and row, each summed as the plain op's): `store(r)` writes output n of row m0 + r from
    v0, v1, .. (one a weight; with `partners`, pair0, pair1, .. hold output n ^ 1, the other of
    its pair). A lane takes `step` consecutive weights of K at a time (gemv_step). `x_at(r, e)`:
    row r's element at WGSL offset e as f32 (a fused norm's). dq8 takes one row, its scale and
    zero point from xs and xz, or with `quantizing` from a pass over the row (GEMV_QUANTIZING)."""
    assert rows == 1 or not dq8
    x_at = x_at or (lambda r, e: f"f32(x[xo{r} + {e}])")
    ws, chunks = range(len(weights)), range(step // 4)
    slot = lambda j, r: 256 * (j * rows + r)  # noqa: E731  (weight j, row r)'s tree
    lines = [f"let lane = li % {lanes}u;", f"let n0 = wg * {gemv_outputs(lanes)}u + 4u * (li / {lanes}u);"]
    lines += [f"let last = {n} - 1u;", *(f"let c{i} = min(n0{f' + {i}u' if i else ''}, last);" for i in range(4))]
    lines += [(GEMV_QUANTIZING_SETUP if quantizing else GEMV_DQ8_SETUP).strip()] if dq8 else []
    lines += [f"var acc{j}_{r} = vec4<f32>(0.0);" for j in ws for r in range(rows)]
    lines += [f"for (var u = lane; u < (q.K + {step - 1}u) / {step}u; u = u + {lanes}u) {{", f"    let k0 = u * {step}u;"]
    word, shift = ("u", lambda c: f"{16 * c}u") if step == 8 else ("u / 2u", lambda c: "((u % 2u) * 16u)")
    for j, (wq, suffix) in enumerate(weights):
        lines += [f"    let w{j}_{i} = {wq}[c{i} * q.wpr + {word}];" for i in range(4)]
        lines += [f"    let d{j}_{i}_{c} = dq4{suffix}(w{j}_{i} >> {shift(c)}, k0{f' + {4 * c}u' if c else ''}, c{i});" for i in range(4) for c in chunks]
    for r in range(rows):
        lines += [f"    if ({r}u < live) {{", *(f"    var x{c} = vec4<f32>(0.0);" for c in chunks), f"    if (k0 + {step}u <= q.K) {{"]
        lines += [f"        x{c} = vec4<f32>({', '.join(x_at(r, f'k0 + {4 * c + i}u') for i in range(4))});" for c in chunks]
        lines += ["    } else {", "        for (var j = 0u; j < 4u; j = j + 1u) {"]
        lines += [f"            if (k0 + {4 * c}u + j < q.K) {{ x{c}[j] = {x_at(r, f'k0 + {4 * c}u + j')}; }}" for c in chunks]
        lines += ["        }", "    }"]
        lines += [fill(GEMV_DQ8_X, V=f"x{c}").strip() for c in chunks] if dq8 else []
        for j in ws:
            dots = ", ".join(" + ".join(f"dot(x{c}, d{j}_{i}_{c})" for c in chunks) for i in range(4))
            lines.append(f"    acc{j}_{r} = acc{j}_{r} + vec4<f32>({dots});")
        lines.append("    }")
    lines.append("}")
    lines += [f"red[{slot(j, r)}u + li] = acc{j}_{r};" for j in ws for r in range(rows)]
    adds = " ".join(f"red[{slot(j, r)}u + li] = red[{slot(j, r)}u + li] + red[{slot(j, r)}u + li + s];" for j in ws for r in range(rows))
    lines += ["workgroupBarrier();", f"for (var s = {lanes // 2}u; s > 0u; s = s >> 1u) {{ if (lane < s) {{ {adds} }} workgroupBarrier(); }}"]
    for r in range(rows):
        vals = " ".join(f"let v{j} = red[{slot(j, r)}u + li - lane][lane];" for j in ws)
        vals += "".join(f" let pair{j} = red[{slot(j, r)}u + li - lane][lane ^ 1u];" for j in ws if partners)
        lines.append(f"if ({r}u < live && lane < 4u) {{ let n = n0 + lane; if (n < {n}) {{ {vals} {store(r)} }} }}")
    return "\n    ".join(lines)


def gemv_reduce(trees):
    """The workgroup memory of gemv_body's `trees` trees (weights times rows)."""
    return f"\nvar<workgroup> red: array<vec4<f32>, {256 * trees}>;\n"


GEMV_DQ8_SETUP = """    let s_row = f32(xs[m0]);
    let zp_row = zp_at(m0);
    let inv_row = div_rn(1.0, s_row);"""
# ... the row's scale and zero point where the GEMV quantizes a row of floats itself (QuantizingRows'
# row_qp), as kernels/quant/quantized_rows.py does: the row's minimum and maximum through
# workgroup memory (the GEMV runs without subgroups too)
GEMV_QUANTIZING = """
var<workgroup> row_range: array<vec2<f32>, 256>;
fn x_qp(m: u32, li: u32) -> vec3<f32> {
    var range = vec2<f32>(0.0);
    for (var k = li; k < q.K; k = k + 256u) { let v = f32(x[m * q.K + k]); range = vec2<f32>(min(range.x, v), max(range.y, v)); }
    row_range[li] = range;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (li < s) { row_range[li] = vec2<f32>(min(row_range[li].x, row_range[li + s].x), max(row_range[li].y, row_range[li + s].y)); }
        workgroupBarrier();
    }
    return row_qp(row_range[0].x, row_range[0].y);
}
"""
GEMV_QUANTIZING_SETUP = """    let qp_row = x_qp(m0, li);
    let s_row = qp_row.x;
    let zp_row = qp_row.y;
    let inv_row = qp_row.z;"""
GEMV_DQ8_X = """        $V = vec4<f32>(xq($V.x, inv_row, zp_row, s_row), xq($V.y, inv_row, zp_row, s_row),
                       xq($V.z, inv_row, zp_row, s_row), xq($V.w, inv_row, zp_row, s_row));"""


def gemv_shader(dq8, zp_packed, has_bias, gs, lanes, types=Storage(), residual=False, rows=1, step=8, tail=NO_TAIL):
    """A GEMV route (`lanes` invocations reduce over K for each 4 outputs of `rows` rows, `step`
    weights at a time); `gs`: _dequant's; `tail`: norm_tail's (declarations, last statement)."""
    store = lambda r: f"out[(m0 + {r}u) * q.N + n] = epilogue(v0, m0 + {r}u, n);"  # noqa: E731
    quantizing = isinstance(types.x, QuantizingRows)  # a row of floats it quantizes itself, as dq8 with its own scale
    body = gemv_body(dq8 or quantizing, [("wq", "")], "q.N", store, lanes, x_at=int8_rows_at(types.x), rows=rows, step=step, quantizing=quantizing)
    head = _gemv_header(dq8, zp_packed, has_bias, types, residual=residual) + _dequant(dq8, zp_packed, gs) + int8_rows_loader(types.x)
    head += XQ + GEMV_QUANTIZING if quantizing else ""
    return head + tail[0] + gemv_reduce(rows) + gemv_main(rows) + f"    let wg = wg0;\n    {body}\n{tail[1]}}}\n"


def quantize_head(zp_packed, types, out):
    """The head of kernels/matmul/int8_matrix.py's quantizing kernels for a dq8 product: x, its
    scales and zero points, what they write as `out` (WGSL element type `out`), the uniform q."""
    acts = (("xs", types.xs), ("xz", "u32" if zp_packed else "i32"))
    quantize = [LIN_STRUCT + ";", *bindings((("x", types.x), *acts), False, uniform="q: Q", out=out)]
    return "\n".join(quantize) + "\n" + DIV_RN + _zero_points(zp_packed)


def matrix_heads(zp_packed, has_bias, types, residual):
    """The heads of kernels/matmul/int8_matrix.py's two kernels for a dq8 product: QUANTIZE's
    (quantize_head, the words as `out`), and the product's (the plain op's bindings without x, the
    weights as vec4s `wq4`, then the words)."""
    acts = (("xs", types.xs), ("xz", "u32" if zp_packed else "i32"))
    operands = (*acts, ("wq", "vec4<u32>"), ("ws", types.ws))
    product = _gemv_header(True, zp_packed, has_bias, types, residual=residual, operands=operands) + _dequant(True, zp_packed, None)
    return quantize_head(zp_packed, types, "i32"), product + "fn wq4(i: u32) -> vec4<u32> { return wq[i]; }\n"


# CPU adapters with subgroups (kernels/matmul/linear.py's gemv_sg_body, for 4-bit words): the lanes of a
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
# GPUs' shapes of at most PREFETCH_ROWS rows (a decode row or a few, bound by the weights' reads)
# load each lane's next step of words and scales while they sum this one (the same sums). H200,
# Llama-3.2-1B shape 4w, greedy bursts, two rounds in one call, 1 / 4 streams 747-753 / 1,845-1,873
# -> 795-799 / 1,932 tokens/s, 16-64 streams the same; SmolLM2 4w one stream 785 -> 824. Prefetching
# the 4-row shape too: 8 / 16 streams 2,549 / 3,054 -> 2,593 / 3,023, that kernel alone 5-10% slower
# (results/h200/kernel_choices/q4_subgroup_prefetch/).
PREFETCH_ROWS = 2
Q4_SG_GEMV = (1, 8)  # (input rows, weight rows) a subgroup takes: one row (decode)
Q4_SG_GEMM = (8, 8)  # any other row count (prefill, a ragged pass): no tiled GEMM, no barriers
Q4_SG_WORDS = 2  # words a lane loads a step (a vec2<u32>: 16 weights)
Q4_SG_STEP = 8 * Q4_SG_WORDS  # weights a lane step: K and the group size must be whole steps
# GPUs take this kernel at routes.py's Q4_SG_GPU for 17 to Q4_GEMV_MAX_ROWS rows (Q4_SG_GPU_ROWS),
# the plain and the fused 4-bit linears alike (so that those stay bitwise the plain ops); the fused
# ones read the rows rms_norm_for_q4 writes, and the q/k/v group rotates q and k in its epilogue.
# H200, SmolLM2-shaped 4w export, greedy bursts, three rounds in one call, the 4-bit GEMV against
# this kernel at (2, 4, 2) in vec4 sums: 32 sessions 9,474-9,567 -> 10,697-10,802 tokens/s, 64
# sessions 11,990-12,185 -> 14,431-14,508. Normalizing the rows in this kernel instead (each
# workgroup summing its rows' squares, two barriers) cost more than the norm's dispatch: 32
# sessions 7,562 / 7,598. (At 4 x 4, 8 groups of weight rows a workgroup, the
# fitted GEMV had beaten it for 17 to 32 rows on an H100: BENCHMARKS.md.)


def sg_body(dq8, shape, weights=(("wq", "wscale"),), n="q.N", store=None, partners=False, norm=False, int8=False, quantizing=False, rstd=False):
    """The subgroup kernel's statements for `shape` = (input rows, weight rows split among
    `weights`, (word binding, scale fn) pairs read for the same outputs, as SwiGLU's gate and up);
    input row r of the workgroup's group of rows from r0 (rows past `rows` read as the last live
    one, not written). `store(r)` writes row r's output n of N = `n` from v0, v1, .. (one a weight;
    with `partners`, pair0, pair1, .. hold output n ^ 1: linear.py's sg_sums). With `norm`, x
    holds the rows before an RMS norm of weight `gamma4` (and q.eps), folded into the products:
    each sums x * gamma, times its row's rstd from the squares of x its lanes add as they read
    the row (no barrier, no normalized rows); with `rstd`, x holds those rows already times gamma
    and `rstd[row]` their rstd, both as the fold computes them (q4_fused_linear.py's
    fold_norm_shader): the fold's results without its work. The GPUs' shapes (routes.py's, of three elements,
    or four: the words a lane takes a step, else Q4_SG_WORDS) sum in vec2 accumulators, the CPU
    adapters' in vec4s. A shape that splits K (linear.py's sg_splits_k) has the workgroup's
    invocations walk K where a subgroup's lanes do, and adds its subgroups' sums through
    workgroup memory in their order (sg_main's `parts`), for invocation 0 to store. With `int8`,
    x holds int8 rows (kernels/wgsl.py's Int8Rows, bound as vec2<u32>: the two words of 8 values)
    and a lane's step sums with dot4I8Packed (_int8_step), in scalar f32 accumulators; with
    `quantizing` as well, x holds float rows that the kernel quantizes as Int8Rows holds them
    (wgsl.py's QuantizingRows: the workgroup passes over its rows for their scales first)."""
    assert not (int8 and (dq8 or norm or rstd)) and (int8 or not quantizing) and not (norm and rstd)
    ins, outs = range(shape[0]), range(shape[1] // len(weights))
    pairs = len(shape) > 2
    split = sg_splits_k(shape)
    walker, stride, per, steps = sg_walk(shape)
    store = store or (lambda r: f"out[(r0 + {r}u) * q.N + n] = epilogue(v0, r0 + {r}u, n);")
    ws = [(j, i) for j in range(len(weights)) for i in outs]
    lines = [f"let x{r}_ = min(r0 + {r}u, q.M - 1u);" for r in ins]
    if quantizing:  # the rows' scales, zero points and their inverses, before any branch
        lines += [f"let xqp{r} = x_qp(x{r}_, li, lane, sgs); let xsc{r} = xqp{r}.x; let xzp{r} = i32(xqp{r}.y);" for r in ins]
    elif int8:
        lines += [f"let xsc{r} = x_scale(x{r}_); let xzp{r} = x_zp(x{r}_);" for r in ins]
    if dq8:  # GEMV_DQ8_SETUP for each row
        lines += [f"let s_row{r} = f32(xs[x{r}_]); let zp_row{r} = zp_at(x{r}_); let inv_row{r} = div_rn(1.0, s_row{r});" for r in ins]
    if split:  # one group of weight rows
        lines += ["{", "let n0 = nw;"]
    else:
        lines += [f"for (var g = li / sgs; g < {sg_groups(shape)}u; g = g + {CPU_WG}u / sgs) {{", f"let n0 = nw + g * {len(outs)}u;"]
    lines += [f"let c{i} = min(n0 + {i}u, {n} - 1u);" for i in outs]
    width = 1 if int8 else 2 if pairs else 4
    lines += [f"var acc{j}_{i}_{r} = {'0.0' if int8 else f'vec{width}<f32>(0.0)'};" for j, i in ws for r in ins]
    lines += [f"var sq{r} = vec4<f32>(0.0);" for r in ins] if norm else []

    def loads(j, i, v, k):  # weight j's word(s) (one: from the vec2 holding it) and scale for output i at step v, from K = k
        wq, wscale = weights[j]
        word = f"word_of({wq}[c{i} * wprv + {v} / 2u], {v})" if per == 1 else f"{wq}[c{i} * wprv + {v}]"
        return word, f"{wscale}({k}, c{i})"

    prefetch = pairs and shape[0] <= PREFETCH_ROWS
    if prefetch:  # each lane loads its next step's words and scales while it sums this one's
        lines += [f"let vlast = max({steps}, 1u) - 1u;", f"let vfirst = min({walker}, vlast);"]
        for j, i in ws:
            word, scale = loads(j, i, "vfirst", f"vfirst * {8 * per}u")
            lines.append(f"var wnext{j}_{i} = {word}; var snext{j}_{i} = {scale};")
    lines += [f"for (var v = {walker}; v < {steps}; v = v + {stride}) {{", f"    let k0 = v * {8 * per}u;"]
    lines += [f"    let vnext = min(v + {stride}, vlast);"] if prefetch else []
    for j, i in ws:
        if prefetch:
            word, scale = loads(j, i, "vnext", f"vnext * {8 * per}u")
            lines += [f"    let w{j}_{i} = wnext{j}_{i}; let s{j}_{i} = snext{j}_{i};", f"    wnext{j}_{i} = {word}; snext{j}_{i} = {scale};"]
        else:
            word, scale = loads(j, i, "v", "k0")
            lines += [f"    let w{j}_{i} = {word};", f"    let s{j}_{i} = {scale};"]
    for c in range(0 if int8 else per):  # 8 weights a word: input vec4s 2c and 2c + 1 of the step
        lines.append("    {")
        at = [sg_step_vec4(per, c, h) for h in range(2)]
        lines += [f"    let g{'ab'[h]} = gamma4({at[h]});" for h in range(2)] if norm else []  # the norm's weight, once for every row
        for r in ins:
            for h in range(2):
                load = f"x4(x{r}_ * kv4 + {at[h]})"
                if dq8:  # GEMV_DQ8_X's quantize-dequantize, per component
                    load = f"xq4({load}, inv_row{r}, zp_row{r}, s_row{r})"
                if norm:
                    lines.append(f"    let e{r}{'ab'[h]} = {load}; sq{r} = sq{r} + e{r}{'ab'[h]} * e{r}{'ab'[h]};")
                    load = f"e{r}{'ab'[h]} * g{'ab'[h]}"
                lines.append(f"    let x{r}{'ab'[h]} = {load};")
        for j, i in ws:
            t = f"{j}_{i}"
            word = f"w{t}" if per == 1 else f"w{t}.{'xyzw'[c]}"
            lines.append(f"    let d{t} = nibbles({word}); let a{t} = d{t}.a * s{t}; let b{t} = d{t}.b * s{t};")
            if pairs:  # the halves of each vec4 product in turn
                lines += [f"    acc{t}_{r} = acc{t}_{r} + " + " + ".join(f"x{r}{e}.{h} * {e}{t}.{h}" for e in "ab" for h in ("xy", "zw")) + ";" for r in ins]
            else:
                lines += [f"    acc{t}_{r} = acc{t}_{r} + x{r}a * a{t} + x{r}b * b{t};" for r in ins]
        lines.append("    }")
    lines += _int8_step(ins, ws, per, quantizing) if int8 else []
    lines.append("}")
    total, square = None, lambda r: sg_total(f"sq{r}")
    if split:  # the subgroups' sums into invocation 0's
        sums = [(f"acc{j}_{i}_{r}", width) for j, i in ws for r in ins] + ([(f"sq{r}", 4) for r in ins] if norm else [])
        at = {name: k for k, (name, _) in enumerate(sums)}
        lines += split_sums(sums)
        total, square = (lambda j, i, r: f"c{at[f'acc{j}_{i}_{r}']}"), (lambda r: f"c{at[f'sq{r}']}")
    if norm:
        lines += [f"let rstd{r} = {fold_rstd(square(r))};" for r in ins]
    scale = (lambda r: f"rstd{r}") if norm else (lambda r: f"rstd[x{r}_]") if rstd else (lambda r: f"xsc{r}") if int8 else None
    lines += sg_sums(len(weights), ins, outs, n, store, partners, scale, width, total)
    lines.append("}" * (2 if split else 1))
    return "\n    ".join(lines)


def sg_walk(shape):
    """How sg_body's lanes walk K at `shape`: (first step, stride, words a lane takes a step, steps
    of K), WGSL. A shape that splits K has the workgroup's invocations walk it, else each subgroup's lanes."""
    walker, stride = ("li", f"{CPU_WG}u") if sg_splits_k(shape) else ("lane", "sgs")
    per = shape[3] if len(shape) > 3 else Q4_SG_WORDS
    return walker, stride, per, f"q.K / {8 * per}u"


def sg_step_vec4(per, c, h):
    """WGSL: the vec4 of K a lane's step v reads for half h of its word c (`per` words a step)."""
    return f"v * {2 * per}u + {2 * c + h}u"


def split_sums(sums):
    """WGSL of a workgroup that splits K (sg_splits_k) adding up each of `sums` ((name, width) of
    each lane's sums): each subgroup's total (sg_total) through workgroup memory (`parts`), then in
    invocation 0 (the block left open) c0, c1, .. the subgroups' totals added in their order."""
    count = len(sums)
    lines = [f"let t{k} = {sg_total(name, w)};" for k, (name, w) in enumerate(sums)]
    lines.append("if (lane == 0u) { " + " ".join(f"parts[li / sgs * {count}u + {k}u] = t{k};" for k in range(count)) + " }")
    lines += ["workgroupBarrier();", "if (li == 0u) {"] + [f"var c{k} = parts[{k}u];" for k in range(count)]
    lines.append(f"for (var s = 1u; s < {CPU_WG}u / sgs; s = s + 1u) {{ " + " ".join(f"c{k} = c{k} + parts[s * {count}u + {k}u];" for k in range(count)) + " }")
    return lines


FOLD_NORM = """
$PARTS@compute @workgroup_size($CPU_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32$BUILTINS) {
    let row = wid.x;
    let kv4 = q.K / 4u;
    var sq = vec4<f32>(0.0);
    for (var v = $WALKER; v < $STEPS; v = v + $STRIDE) {
$STEP
    }
$TOTAL
}
"""


def fold_norm_shader(shape, head):
    """The rows a pass of sg_body's `rstd` kernels reads, a workgroup a row: x (the rows before the
    norm) times gamma4, and rstd, each computed as the fold at `shape` (of one row) computes it:
    the same walk of K (sg_walk), squares added in the same order, the same subgroup
    and workgroup sums. So a row of a pass stays bitwise the row alone, while the products of
    several rows skip the fold's work: every subgroup re-squaring and re-scaling its rows, which
    took a 1B's fused products at 16 rows 1.2-2.3x the plain ones' time. `head`: the bindings x,
    gamma, normed (vec4<f32>, read-write), rstd (f32, read-write) and the uniform q, with the
    loaders x4 and gamma4."""
    walker, stride, per, steps = sg_walk(shape)
    split = sg_splits_k(shape)
    writes = "" if split else "if (li < sgs) "  # every subgroup walks all of K: the first writes
    step = []
    for c in range(per):
        for h in range(2):
            at = sg_step_vec4(per, c, h)
            step.append(f"        {{ let e = x4(row * kv4 + {at}); sq = sq + e * e; {writes}{{ normed[row * kv4 + {at}] = e * gamma4({at}); }} }}")
    if split:  # sg_body's parts: the subgroups' sums in their order
        total = [f"    {line}" for line in split_sums([("sq", 4)])] + [f"    rstd[row] = {fold_rstd('c0')};", "    }"]
    else:
        total = [f"    let t = {sg_total('sq')};", f"    if (li == 0u) {{ rstd[row] = {fold_rstd('t')}; }}"]
    parts = f"var<workgroup> parts: array<f32, {CPU_WG}>;\n" if split else ""
    body = fill(FOLD_NORM, PARTS=parts, CPU_WG=CPU_WG, BUILTINS=SUBGROUP_BUILTINS, WALKER=walker, STEPS=steps, STRIDE=stride, STEP="\n".join(step), TOTAL="\n".join(total))
    return head + body


def _int8_step(ins, ws, per, quantizing=False):
    """sg_body's step over int8 rows: for each weight word (8 nibbles n, in its order the even and
    odd values' words of x), dot4I8Packed of the low and high nibbles with them; over the step,
    sum((n - 8) * (q - zp)) = sum(n * q) - 8 * sum(q) - zp * (sum(n) - 8 * values), exact in
    i32; times the weight's scale of the step (one group) into the f32 sums. `quantizing`: the
    words from float rows (QuantizingRows)."""
    lines = ["    {", "    let kv8 = q.K / 8u;"]
    for r in ins:
        row = f", xqp{r}.z, xqp{r}.y" if quantizing else ""
        lines += [f"    let xv{r}_{c} = x_pair(x{r}_ * kv8 + v * {per}u + {c}u{row});" for c in range(per)]
        ones = " + ".join(f"dot4I8Packed(xv{r}_{c}.x, ONES) + dot4I8Packed(xv{r}_{c}.y, ONES)" for c in range(per))
        lines.append(f"    let xs{r} = 8 * ({ones});")
    for j, i in ws:
        t = f"{j}_{i}"
        for c in range(per):
            word = f"w{t}" if per == 1 else f"w{t}.{'xyzw'[c]}"
            lines.append(f"    let lo{t}_{c} = {word} & LOW_NIBBLES; let hi{t}_{c} = ({word} >> 4u) & LOW_NIBBLES;")
        nibbles = " + ".join(f"lo{t}_{c} + hi{t}_{c}" for c in range(per))
        lines.append(f"    let ns{t} = i32(dot4U8Packed({nibbles}, ONES)) - {64 * per};")
        for r in ins:
            dots = " + ".join(f"dot4I8Packed(lo{t}_{c}, xv{r}_{c}.x) + dot4I8Packed(hi{t}_{c}, xv{r}_{c}.y)" for c in range(per))
            lines.append(f"    acc{t}_{r} = acc{t}_{r} + f32({dots} - xs{r} - xzp{r} * ns{t}) * s{t};")
    return lines + ["    }"]


XQ4 = """
fn xq4(v: vec4<f32>, inv: f32, zp: f32, s: f32) -> vec4<f32> {
    return vec4<f32>(xq(v.x, inv, zp, s), xq(v.y, inv, zp, s), xq(v.z, inv, zp, s), xq(v.w, inv, zp, s));
}
"""


SG_MAIN = """
@compute @workgroup_size($CPU_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32$BUILTINS) {$ROW_GROUPS
    let rows = min(${ROWS}u, q.M - r0);
    let kv4 = q.K / 4u;
    let wprv = q.wpr / ${Q4_SG_WORDS}u;
"""


def sg_main(shape):
    """The subgroup kernels' entry for `shape`: workgroup (wg0, group of shape[0] rows from r0:
    kernels/wgsl.py's row_groups), `rows` of them live; where it splits K, `parts` holds its
    subgroups' sums (of each output and each row's squares; subgroups of one lane at the most)."""
    parts = f"var<workgroup> parts: array<f32, {CPU_WG * shape[0] * (shape[1] + 1)}>;\n" if sg_splits_k(shape) else ""
    return parts + fill(SG_MAIN, CPU_WG=CPU_WG, BUILTINS=SUBGROUP_BUILTINS, Q4_SG_WORDS=Q4_SG_WORDS, ROWS=shape[0], ROW_GROUPS=row_groups("q.M", shape[0]))


def sg_shader(dq8, zp_packed, has_bias, shape=Q4_SG_GEMV, types=Storage(), residual=False, gs=None):
    """The subgroup kernel of `shape`: a workgroup takes a group of shape[0] rows;
    K, the weight rows and gs whole steps of Q4_SG_WORDS words; activations f32 or f16; `gs`: _dequant's."""
    quantizing = isinstance(types.x, QuantizingRows)
    int8 = quantizing or isinstance(types.x, Int8Rows)
    head = _gemv_header(dq8, zp_packed, has_bias, types, vec4=True, residual=residual) + sg_x_loader(types.x)
    body = sg_body(dq8, shape, int8=int8, quantizing=quantizing)
    return head + _dequant(dq8, zp_packed, gs) + (XQ4 if dq8 else "") + sg_main(shape) + f"    let nw = wg0 * {sg_wg_rows(shape)}u;\n    {body}\n}}\n"


# The GEMM template's B load: the weights k .. k + 3 of row n (k a multiple of 4: in one word),
# dequantized as the GEMV's dq4 does it, with one scale where a word is in one group (gs % 8 == 0)
Q4_B_K_QUAD = """
fn b_k_quad$J(off: u32, n: u32, k: u32, kend: u32) -> vec4<f32> {
    if (n >= p.N || k >= kend) { return vec4<f32>(0.0); }
    $READ
    return select(vec4<f32>(0.0), w, vec4<u32>(k) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(kend));
}
"""


# The f16 matrices' read of a 4-bit weight (gemm.py's TileLoad.words): row r's word holding K = k (past
# the row: its last word, whose products meet zero rows), and the scale of the step from K = k0 (a
# whole step of 32, in one scale group); $ROW defines r from column n (clamped to the product's)
Q4_B_WORDS = """
fn b_word$J(off: u32, n: u32, k: u32) -> u32 {
    $ROW
    return $WQ[r * q.wpr + min(k / 8u, q.wpr - 1u)];
}
fn b_words_scale$J(n: u32, k0: u32) -> f32 {
    $ROW
    return $SCALE(k0, r);
}
"""


def q4_words(gs, x, scales, f32_scales=False):
    """Whether the f16 matrices read 4-bit weights of group `gs` a column's step at a time
    (TileLoad.words): f16 rows and scales (the halves rounded as eager rounds them; with
    `f32_scales` f32 ones too), groups of whole matrix steps."""
    kinds = ("f16", "f32") if f32_scales else ("f16",)
    return x == "f16" and all(t in kinds for t in scales) and gs is not None and gs % MATRIX_STEP == 0


def q4_b_words(row="let r = min(n, p.N - 1u);", suffix="", wq="wq", scale="wscale"):
    """Q4_B_WORDS with `row`, the statement defining r; by default a plain op's (a fused op's
    column group: each product's, `suffix` "_j", its words `wq` and scale fn `scale`)."""
    return fill(Q4_B_WORDS, ROW=row, J=suffix, WQ=wq, SCALE=scale)


def q4_b_k_quad(read="let w = dq4(wq[n * q.wpr + k / 8u] >> (4u * (k % 8u)), k, n);", suffix=""):
    """Q4_B_K_QUAD with `read`, the statements defining w (the weights k .. k + 3 of row n,
    dequantized); by default a plain op's (a fused op's column group reads by n's product, or
    with `suffix` "_j" one product's alone, b_k_quad_j)."""
    return fill(Q4_B_K_QUAD, READ=read, J=suffix)
# Its A load: the float products' from binding x, or with dq8 quantized and dequantized with the
# row's (1 / scale, zero point, scale), which each invocation computes once for its 4 rows (the
# setup) into private vec4s.
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


def q4_load(dq8, zp_packed, gs, k, types=Storage(), f32_scale_words=False):
    """The GEMM template's tile loads for 4-bit weights (kernels/matmul/gemm.py) of group size `gs`
    (_dequant's); the float activations of K `k` (at most) 4 of K a load where that is whole quads,
    and f16 ones so also as halves, with the weights rounded to halves (the f16 matrices' loads; a
    word at a time where q4_words says, of f32 scales too with `f32_scale_words`)."""
    quads = not dq8 and k % 4 == 0
    x, a_functions = float_a_load(types.x, quads, "x")
    inputs = tuple(x if name == "x" else (name, t) for name, t in _operands(dq8, zp_packed, types))
    source = None if dq8 else WeightSource(types.x, inputs[1:], _dequant(False, False, gs) + q4_b_k_quad(), ((LIN_STRUCT, "q: Q"),))
    words = quads and q4_words(gs, types.x, [types.ws], f32_scale_words)  # the f16 matrices' loads: a word at a time, or quads packed
    halves = source.functions + dequantized_halves("x", 0 if words else 1) if quads and types.x == "f16" else ""
    return TileLoad(
        inputs=inputs,
        functions=_dequant(dq8, zp_packed, gs) + (DQ8_A_AT if dq8 else a_functions) + q4_b_k_quad(),
        b_along_k=True,
        setup=DQ8_SETUP if dq8 else "",
        b_k_quads=True,
        dequantizes=True,
        a_k_quads=quads,
        b_source=source,
        halves_functions=halves + (q4_b_words() if words else ""),
        words=words,
        word_scales="f32" if words and types.ws == "f32" else "f16",
    )


@dataclass(frozen=True)
class Q4Weight:
    """A 4-bit weight's checked layout: N rows of `wpr` u32 words, scales [>= N / 4, groups, 4]
    (scales_in_row_quads), group gs."""

    n: int
    wpr: int
    groups: int
    gs: int

    def subgroup_steps(self):
        """Whether its rows and groups are whole steps of the subgroup kernels (K is checked live)."""
        return self.wpr % Q4_SG_WORDS == 0 and self.gs % Q4_SG_STEP == 0

    def check_input(self, b, k):
        if -(-k // 8) > self.wpr or -(-k // self.gs) > self.groups:
            b.fail(f"input K={k} does not fit weight [{self.n}, {4 * self.wpr}] with {self.groups} scale groups of {self.gs}")


def q4_weight(b, x, weight, scales, group_size):
    """The Q4Weight of `weight` and `scales` for input `x`, or ValueError naming what is wrong."""
    wt, st, xt = b.graph.values[weight], b.graph.values[scales], b.graph.values[x]
    if wt.dtype not in ("uint8", "int8") or len(wt.dims) != 2:
        b.fail(f"weight must be packed uint8 [N, K/2], got {wt.dtype}{list(wt.dims)}")
    if not (is_float(xt.dtype) or xt.dtype == "int32") or not is_float(st.dtype):
        b.fail(f"input ({xt.dtype}) must be floating point (or int8 rows, int32) and scales ({st.dtype}) floating point")
    n, row_bytes = wt.dims
    if row_bytes % 4:
        b.fail(f"weight rows of {row_bytes} bytes are not whole u32 words (K must be padded to 8)")
    if len(st.dims) != 3 or st.constant is None or not st.constant.permuted:
        b.fail(f"scales must be a constant [groups, Np] (Np a multiple of 4) read only as 4-bit linears' scales, got {st.dtype}{list(st.dims)}")
    groups, np_ = st.dims[1], 4 * st.dims[0]
    if np_ < n:
        b.fail(f"scales must be [groups, >= N={n}], got {[groups, np_]}")
    gs = int(group_size)
    if gs <= 0:
        b.fail(f"group size {gs}")
    return Q4Weight(n, row_bytes // 4, groups, gs)


def q4_subgroup_shapes(b, w, k, total=None):
    """The subgroup kernel shapes a 4-bit product of weight `w` and inputs of at most K = k builds
    on this device, for one row and for more, or one for some rows: CPU adapters with subgroups
    take them at every row count; GPUs routes.py's q4_wide_shapes (by `total`, the weight rows of
    the op's products together: w's alone by default) to BITWISE_ROWS for weights of q4_wide K or
    an LM head's rows, else Q4_SG_GPU for Q4_SG_GPU_ROWS rows; routes.py."""
    if not (b.subgroups and w.subgroup_steps() and k % Q4_SG_STEP == 0):
        return ()
    if b.adapter == CPU:
        return (Q4_SG_GEMV, Q4_SG_GEMM)
    if q4_wide(8 * w.wpr) or w.n >= GEMV_T4_MIN_N:
        return q4_wide_shapes(w.n, total or w.n)
    return (Q4_SG_GPU,)


def q4_every_row(shapes):
    """Whether q4_subgroup_shapes' `shapes` take every row count to BITWISE_ROWS on a GPU."""
    return shapes in (Q4_SG_GPU_WIDE, Q4_SG_GPU_WIDE_SPLIT, Q4_SG_GPU_NARROW_SPLIT)


def q4_subgroup_shape(b, shapes, m, k, exact_rows=BITWISE_ROWS):
    """The subgroup shape a product built with `shapes` takes for M x K, or None; `exact_rows`:
    the most rows shapes of every row count take (routes.py's q4_exact_rows)."""
    if not shapes or k % Q4_SG_STEP or m < 1:
        return None
    if b.adapter == CPU:  # every row count
        first, last = 1, m
    else:
        first, last = (1, exact_rows) if q4_every_row(shapes) else Q4_SG_GPU_ROWS
    return shapes[shape_for_rows(shapes, m)] if first <= m <= last else None


# The 4-bit ops whose passes of a few rows quantize their int8 rows themselves (Q4Product's
# `quantizing`: its subgroup kernels or GEMV for those rows, reading the rows before the
# quantization; quantizing_rows): a pte_wgpu.quantized_rows that only such ops read runs no
# dispatch for them (kernels/quant/quantized_rows.py), a dispatch fewer a product. H200, Llama-3.2-1B shape 8da4w
# (the output and down products), greedy bursts, two rounds in one call, one stream 746-762 ->
# 853-860 tokens/s; each subgroup passing over the row alone 843-846, 4 loads in flight a lane
# 805-813; without the quantization's dispatches at all (wrong results: the bound) 941-943. The
# rows an RMS norm's rms_norm_quantized_rows writes, quantized in the q/k/v group and SwiGLU
# products the same way (the squares summed in that op's order through workgroup memory, then
# the normalized row's minimum and maximum) lost: 706-714, the group alone 746-762, SwiGLU alone
# 780-783 (results/h200/kernel_choices/dq8_integer_dots/one_row_quantizing/).
ROW_QUANTIZING = ("et_vk.linear_q4gsw.default", "pte_wgpu.q4_linear_residual")
# ... to this many rows on the GPUs' subgroup kernels of every row count (each workgroup passing
# over its group's rows for their scales first); the GEMV quantizes one row. H200, Llama-3.2-1B
# shape 8da4w, greedy bursts, two rounds in one call, 2 / 3 / 4 streams: one row 1,299-1,318 /
# 1,793-1,810 / 2,375-2,397 tokens/s, to 2 rows 1,355-1,358 (3 and 4 as before), to 4 rows
# 1,364-1,370 / 1,775-1,778 / 2,349-2,358; to 16 rows 8 / 16 streams 3,484 -> 2,911 / 4,911 -> 3,723
# (results/h200/kernel_choices/dq8_integer_dots/rows_quantizing/).
QUANTIZING_SG_ROWS = 2


def _writers(b, x):
    """The calls of builder `b`'s graph that write value `x`, (name, args) each."""
    return [(name, args) for name, args in b.graph.calls if args and args[-1] == x]


def quantizing_rows(b):
    """The most rows of a pass whose int8 rows (wgsl.py's Int8Rows, which a pte_wgpu.quantized_rows
    of rows without a norm writes) the op of builder `b` quantizes itself: 0 where it does not;
    QUANTIZING_SG_ROWS where GPU subgroup kernels take every row count (routes.py's
    Q4_SG_GPU_WIDE), else one (the GEMV's, or a CPU adapter's subgroup kernel's)."""
    x = b.args[0]
    x_type, k = q4_input(b, x)
    if b.name not in ROW_QUANTIZING or not isinstance(x_type, Int8Rows):
        return 0
    if [name for name, _ in _writers(b, x)] != ["pte_wgpu.quantized_rows"]:
        return 0
    shapes = () if b.adapter == CPU else q4_subgroup_shapes(b, q4_weight(b, x, b.args[1], b.args[2], b.scalar(3)), k)
    return QUANTIZING_SG_ROWS if q4_every_row(shapes) else 1


def row_quantization(b, x):
    """(rows, QuantizingRows, qp_bytes' arguments) of the pte_wgpu.quantized_rows that writes int8 rows
    `x` (quantizing_rows): the float rows it reads and how it quantizes them
    (kernels/quant/quantized_rows.py)."""
    [(name, args)] = _writers(b, x)
    made = b.part(name, args)
    mode, qmin, qmax, eps, block = affine_args(made)
    rows = QuantizingRows(made.storage(args[0], packed=False), wgsl_type(made.scalar(7)), stored_zero_point(made.scalar(8)), CPU_WG)
    return args[0], rows, (mode, qmin, qmax, eps, 1, block)


# The RMS norms of int8 rows after the residual products whose one-row pass quantizes its input
# (quantizing_rows: one row) on the GEMV: that pass's last workgroup to arrive normalizes and quantizes
# the output row as the norm's own dispatch would (kernels/wgsl.py's RowQuantizer and
# LAST_TO_ARRIVE), and the norm runs no dispatch for one row (kernels/quant/quantized_rows.py); not
# where workgroups merge apart (Dawn), nor where the two quantizations' parameters differ (one
# uniform holds them). H200, SmolLM2 8da4w (the GEMV takes its one row), greedy bursts, two rounds
# in one call: one stream 590-619 -> 654-657 tokens/s. The subgroup kernels' workgroups (64
# invocations) took longer over the row than the norm's dispatch (11.1 against 7.5 us alone): the
# Llama-3.2-1B shape's one stream 847-863 -> 806-817, so they do not
# (results/h200/kernel_choices/dq8_integer_dots/norm_in_the_product/).
NORMALIZED = "pte_wgpu.rms_norm_quantized_rows"


def normalized_row(b):
    """The (name, args) of the pte_wgpu.rms_norm_quantized_rows (of int8 rows) whose one-row pass
    the op of builder `b` runs in its own one-row GEMV (norm_tail), or None."""
    if b.merge_apart or not quantizing_rows(b):
        return None
    x, k = b.args[0], q4_input(b, b.args[0])[1]
    if q4_subgroup_shape(b, q4_subgroup_shapes(b, q4_weight(b, x, b.args[1], b.args[2], b.scalar(3)), k), 1, k) is not None:
        return None  # a subgroup kernel takes the row: 64 invocations, not ROW_INVOCATIONS
    values = b.graph.values
    norms = [(name, args) for name, args in b.graph.calls if name == NORMALIZED and args[0] == b.out and values[args[-1]].dtype == "int32"]
    if len(norms) != 1:
        return None
    [(name, args)] = _writers(b, b.args[0])
    if affine_args(b.part(*norms[0]))[:4] != affine_args(b.part(name, args))[:4]:
        return None
    return norms[0]


def normalized_by_writer(b):
    """Whether the product writing the input of builder `b`'s op (a NORMALIZED) runs that op's
    one-row pass (normalized_row)."""
    writers = _writers(b, b.args[0])
    return len(writers) == 1 and normalized_row(b.part(*writers[0])) == (b.name, tuple(b.args))


NORM_TAIL = """
@group(0) @binding($GAMMA) var<storage, read> gamma: array<$G4>;
@group(0) @binding($ROWS) var<storage, read_write> qr_out: array<vec4<u32>>;
@group(0) @binding($ARRIVALS) var<storage, read_write> arrivals: array<atomic<u32>>;
fn qr_x4(i: u32) -> vec4<f32> { return vec4<f32>(f32(out[4u * i]), f32(out[4u * i + 1u]), f32(out[4u * i + 2u]), f32(out[4u * i + 3u])); }
"""
NORM_TAIL_LAST = "    if (last_to_arrive(li, 0u, nwg.x * nwg.y * nwg.z)) { quantize_row(0u, li); }\n"


def norm_tail(b, norm, out_type, first):
    """(kernel tail, bindings, the norm's eps) of NORMALIZED's call `norm` in the one-row GEMV of
    builder `b`'s product (its output stored as `out_type`), whose bindings from `first` are the
    norm's weight, its int8 rows and the arrival count."""
    assert GEMV_WG == ROW_INVOCATIONS  # quantize_row's workgroup
    _, args = norm
    made = b.part(*norm)
    g_type, rows = made.storage(args[10], packed=False), b.graph.values[args[-1]]
    quantizer = RowQuantizer(int8_rows_k(rows.dims[-1]), out_type, wgsl_type(made.scalar(7)), stored_zero_point(made.scalar(8)), True,
                             numel_of(rows.dims[:-1]), load="qr_x4", out="qr_out")
    head = fill(NORM_TAIL, GAMMA=first, G4=vec4_type(g_type), ROWS=first + 1, ARRIVALS=first + 2)
    head += vec4_loader("gamma", g_type) + LAST_TO_ARRIVE + quantizer.wgsl()
    b.reads(args[10])
    b.writes(args[-1])
    return (head, NORM_TAIL_LAST), [args[10], args[-1], b.arrival_counts(1)], float(made.scalar(11, 1e-6))


def gemv_routes_below(routes, rows):
    """The routes of `routes` (gemv_routes) for row counts up to `rows`, the last taking no more."""
    kept = [r for i, r in enumerate(routes) if i == 0 or routes[i - 1][0] < rows]
    return kept[:-1] + [(min(kept[-1][0], rows), *kept[-1][1:])]


class Q4Product:
    """The routes of one product out = x @ dequant(weight).T (+ bias) as the plain op runs it:
    the GEMV up to its routes' rows (`gemv` False: not built, for a fused op whose own kernel
    takes those rows), the subgroup kernels where the device takes them, the GEMM for more.
    `xs`/`xz` (per-row activation scale and zero point) turn on the dynamic int8 activation
    quantization; with `residual`, `bias` is an [..., N] residual added in the epilogue, to the
    product rounded to the output's type (as the add it replaced read it)."""

    def __init__(self, b, x, xs, xz, weight, scales, group_size, bias, out, residual=False, gemv=True):
        self.b, self.x, self.xs, self.xz, self.bias, self.out, self.residual = b, x, xs, xz, bias, out, residual
        self.w = w = q4_weight(b, x, weight, scales, group_size)
        dq8 = xs is not None
        zp_packed = dq8 and b.graph.values[xz].dtype in PACKED
        has_bias = bias is not None
        self.q, self.p = b.params(LIN_SIZE), b.params(PARAMS_SIZE)
        operands = [x] + ([xs, xz] if dq8 else []) + [weight, scales]
        tail = [bias] if has_bias else []
        types = Storage(*(b.storage(v) if v is not None else "f32" for v in (x, xs, scales, bias, out)))
        x_type, k_most = q4_input(b, x)
        types = replace(types, x=x_type)
        bound = [*operands, *tail, out, self.q]
        gpu = b.adapter != CPU  # GPUs: no subgroup kernel where a fused op's own kernel takes its rows
        self.shapes = () if gpu and not gemv else q4_subgroup_shapes(b, w, k_most)
        self.exact_rows = q4_exact_rows(b, 8 * w.wpr, x)  # the subgroup kernels' rows where they take every count
        self.routes = gemv_routes(w.wpr, grouped=not dq8) if gemv else []
        if self.shapes and gpu:  # the subgroup kernels for every row the GEMV took, or past BITWISE_ROWS
            self.routes = [] if q4_every_row(self.shapes) else gemv_routes_below(self.routes, BITWISE_ROWS)
        most = self.routes[-1][0] if self.routes else 0  # without the GEMV, the GEMM at every row count
        self.gemv_rows = gpu_gemv_rows(w.n, most) if self.routes and gpu else most  # more: the GEMM
        step = gemv_step(w.wpr)
        self.gemvs = [b.dispatch(gemv_shader(dq8, zp_packed, has_bias, w.gs, lanes, types, residual, rows, step), bound) for _, lanes, rows in self.routes]
        self.sgs = [(b.dispatch(sg_shader(dq8, zp_packed, has_bias, shape, types, residual, w.gs), bound), shape) for shape in self.shapes]
        # the subgroup kernels or GEMV of passes of up to quantizing_rows rows, quantizing quantized_rows' input
        # themselves (that op then runs no dispatch): {shape (None: the GEMV's one row): (dispatch, grid of m rows)}
        self.quantizing, self.quantizing_rows = {}, quantizing_rows(b) if gemv else 0
        if self.quantizing_rows:  # the routes those rows take (resize), on the rows before the quantization
            rows, quantizing, qp = row_quantization(b, x)
            t, self.qp_uniform = replace(types, x=quantizing), b.params(QP_SIZE)
            ending, more, norm_eps, norm = NO_TAIL, [], 0.0, normalized_row(b)
            if norm is not None:  # and the norm after it, in its last workgroup
                ending, more, norm_eps = norm_tail(b, norm, types.out, len(bound) + 1)
            b.reads(rows)
            for m in range(1, self.quantizing_rows + 1):
                shape = q4_subgroup_shape(b, self.shapes, m, k_most, self.exact_rows)
                if shape in self.quantizing:
                    continue
                if shape is not None:
                    shader = sg_shader(dq8, zp_packed, has_bias, shape, t, residual, w.gs)
                    grid = lambda m, shape=shape: self.sg_grid(shape, m)  # noqa: E731
                else:
                    _, lanes, per = self.routes[gemv_route(self.routes, 1)]
                    shader = gemv_shader(dq8, zp_packed, has_bias, w.gs, lanes, t, residual, per, step, ending)
                    grid = lambda m, lanes=lanes, per=per: self.gemv_grid(lanes, per, m)  # noqa: E731
                self.quantizing[shape] = (b.dispatch(shader, [rows, *bound[1:], self.qp_uniform, *more]), grid)
            self.qp = qp_bytes(*qp, norm_eps)
        def q_wgsl(reads):  # the uniform q of a GEMM of `reads` read bindings: after those, the tail, out, p and the scratch
            return f"{LIN_STRUCT};\n@group(0) @binding({reads + len(tail) + 3}) var<uniform> q: Q;\n"

        load = q4_load(dq8, zp_packed, w.gs, k_most, types)
        # a ragged pass of 17 to 32 decode rows takes the GEMM (the weights of q4_wide K, LM heads):
        # SMALL_TILE 1.5-1.6x TILE there (H200, SmolLM2's 49,152 x 576 head alone at 17 / 24 / 32
        # rows 7.5 / 10.6 / 14.0 -> 11.9 / 16.8 / 22.1 TFLOP/s; results/h200/kernel_choices/q4_gemm_64_rows/)
        small = (q4_wide(8 * w.wpr) or w.n >= GEMV_T4_MIN_N) and b.adapter != CPU
        most = (w.n, 8 * w.wpr)
        scratch = gemm_scratch(b, [out], most=most)
        self.gemm = GemmRoute(b, load, operands, bias, out, self.p, scratch, [self.q], q_wgsl(len(operands)), residual=residual, small=small, most=most)
        self.halves = None  # the GEMM's rows of a dq8 prompt on f16 subgroup matrices, where the device has them
        if dq8 and b.f16_matrices and k_most % 4 == 0:
            halves = q4_load(False, False, w.gs, k_most, replace(types, x="f16"), f32_scale_words=True)  # over the activations' q - zp as f16
            if halves.words or 2 * w.n * 8 * w.wpr <= WIDEN_MAX_BYTES:  # (else the GEMM would widen no weight for it)
                rows = int8_matrix.halves_scratch(b, x)
                quantize = int8_matrix.quantize_shader(quantize_head(zp_packed, types, "vec2<u32>"), halves=True)
                self.quantize_halves = b.dispatch(quantize, [x, xs, xz, rows, self.q])
                self.halves = GemmRoute(b, halves, [rows, weight, scales], bias, out, self.p, scratch, [self.q], q_wgsl(3), residual=residual, most=most,
                                        tiles=[MATRIX_TILE] if halves.words else [], row_scale=xs)
        self.matrix = None  # the GEMM's rows on int8 subgroup matrices, where the device has them (and not f16 ones)
        if dq8 and b.int8_matrices and self.halves is None and int8_matrix.takes(w.gs, w.wpr):
            words = int8_matrix.words_scratch(b, x)
            quantize, product = matrix_heads(zp_packed, has_bias, types, residual)
            self.quantize = b.dispatch(int8_matrix.quantize_shader(quantize), [x, xs, xz, words, self.q])
            self.matrix = b.dispatch(int8_matrix.matrix_shader(product, len(bound) - 1), [xs, xz, weight, scales, *tail, out, self.q, words])

    def gemv_grid(self, lanes, rows, m):
        """The grid of the GEMV route of `lanes` lanes and `rows` rows a workgroup for m rows."""
        return row_groups_grid(-(-self.w.n // gemv_outputs(lanes)), m, rows)

    def sg_grid(self, shape, m):
        """The grid of the subgroup kernel of `shape` for m rows."""
        return row_groups_grid(-(-self.w.n // sg_wg_rows(shape)), m, shape[0])

    def resize(self, ctx, on=True):
        """Check the live shapes, set the uniforms, dims and grids (every route off unless `on`);
        returns (M, K)."""
        w, xd = self.w, ctx.dims(self.x)
        if len(xd) < 1:
            self.b.fail("input must have at least one dim")
        k, m = live_k(self.b, self.x, xd), numel_of(xd[:-1])
        w.check_input(self.b, k)
        if self.xs is not None:
            for vid, what in ((self.xs, "scales"), (self.xz, "zero points")):
                if ctx.numel(vid) != m:
                    self.b.fail(f"input {tuple(xd)} has {m} rows but its activation {what} have {ctx.numel(vid)}")
        if self.residual and ctx.numel(self.bias) != m * w.n:
            self.b.fail(f"residual of shape {tuple(ctx.dims(self.bias))} for a product of {m} x {w.n}")
        if self.bias is not None and not self.residual and ctx.numel(self.bias) < w.n:
            self.b.fail(f"bias of {ctx.numel(self.bias)} elements for N={w.n}")
        sg_shape = q4_subgroup_shape(self.b, self.shapes, m, k, self.exact_rows) if on else None
        use_gemv = on and m <= self.gemv_rows and sg_shape is None
        past_gemv = on and m > self.gemv_rows and sg_shape is None
        use_halves = past_gemv and self.halves is not None and k % 4 == 0 and self.halves.takes(m, w.n, k)
        use_matrix = past_gemv and self.matrix is not None and k % int8_matrix.STEP == 0 and int8_matrix.wide_enough(m, w.n)
        use_gemm = past_gemv and not (use_matrix or use_halves)
        if use_gemv and not self.gemvs:
            self.b.fail(f"{m} rows need the GEMV route, not built")
        splits, kspan = (self.halves if use_halves else self.gemm).plan(m, w.n, k, 1, use_gemm or use_halves)
        ctx.set_params(self.q, struct.pack(LIN_FORMAT, m, w.n, k, w.wpr, w.groups, w.gs, -(-k // 8)))
        bias_strides = (0, w.n, 1) if self.residual else (0, 0, 1)
        ctx.set_params(self.p, params_bytes(m, w.n, k, bias=bias_strides, split=(splits, kspan)))
        quantizing = on and 1 <= m <= self.quantizing_rows
        chosen = gemv_route(self.routes, m) if use_gemv and not quantizing else None
        for i, (d, (_, lanes, rows)) in enumerate(zip(self.gemvs, self.routes)):
            ctx.set_grid(d, self.gemv_grid(lanes, rows, m) if i == chosen else (0, 0, 0))
        for d, shape in self.sgs:
            ctx.set_grid(d, self.sg_grid(shape, m) if shape == sg_shape and not quantizing else (0, 0, 0))
        if self.quantizing:
            ctx.set_params(self.qp_uniform, self.qp)
        for shape, (d, grid) in self.quantizing.items():
            ctx.set_grid(d, grid(m) if quantizing and shape == sg_shape else (0, 0, 0))
        self.gemm.set_grids(ctx, m, w.n, k, 1, splits, use_gemm)
        if self.halves is not None:
            ctx.set_grid(self.quantize_halves, int8_matrix.quantize_grid(m, k) if use_halves else (0, 0, 0))
            self.halves.set_grids(ctx, m, w.n, k, 1, splits, use_halves)
        if self.matrix is not None:
            ctx.set_grid(self.quantize, int8_matrix.quantize_grid(m, k) if use_matrix else (0, 0, 0))
            ctx.set_grid(self.matrix, int8_matrix.matrix_grid(m, w.n) if use_matrix else (0, 0, 0))
        ctx.set_dims(self.out, ctx.dims(self.bias) if self.residual else tuple(xd[:-1]) + (w.n,))
        return m, k


SCALES_ARG = {"et_vk.linear_q4gsw.default": 2, "et_vk.linear_dq8ca_q4gsw.default": 5}  # a 4-bit linear's scales


def scales_in_row_quads(graph):
    """Rewrite, in place, the scales of the 4-bit linears of `graph` from the file's [groups, Np]
    to [Np / 4, groups, 4], which the kernels read: the subgroup kernels' lanes walk a weight row
    along K, and a lane's scale then lies near its neighbours' (in [groups, Np] a subgroup's 32
    lanes read 32 rows of the table, Np x 4 bytes apart), while the GEMM's neighbouring columns at
    one group stay 16 bytes together. Each scales tensor is a constant read only as such scales
    (what the exporter writes; any other is left, and its linear's build names it): a new
    constant of the same bytes, permuted at load (Constant.permuted); the old one is left with
    no rows."""
    reads = Counter(args[SCALES_ARG[name]] for name, args in graph.calls if name in SCALES_ARG)
    values, uses, quads = graph.values, value_uses(graph), {}
    for vid, count in reads.items():
        t = values[vid]
        if uses[vid] == count and isinstance(t, Tensor) and t.constant is not None and len(t.dims) == 2 and t.dims[1] % 4 == 0:
            groups, rows = t.dims[0], t.dims[1] // 4
            values.append(Tensor(t.dtype, (rows, groups, 4), replace(t.constant, permuted=((groups, rows, 4), (1, 0, 2)))))
            values[vid], quads[vid] = Tensor(t.dtype, (0, t.dims[1])), len(values) - 1
    for k, (name, args) in enumerate(graph.calls):
        if name in SCALES_ARG and args[SCALES_ARG[name]] in quads:
            at = SCALES_ARG[name]
            graph.calls[k] = (name, (*args[:at], quads[args[at]], *args[at + 1 :]))


def _add_q4_linear(b, x, xs, xz, weight, scales, group_size, bias, residual=False):
    """Record the routes of out = x @ dequant(weight).T (+ bias or residual) and the hook."""
    product = Q4Product(b, x, xs, xz, weight, scales, group_size, bias, b.out, residual)
    b.hook(product.resize)


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
        b.fail("activation scales and zero points must be tensors (dynamic quantization)")
    _add_q4_linear(b, b.args[0], b.args[1], b.args[2], b.args[3], b.args[5], b.scalar(6), bias)
