"""The register-tiled GEMM template, shared by every product that runs as tiles (linear, mm, bmm,
addmm, the fused linears' prefill, 4-bit weights), and its split-K reduce.

out[b, m, n] = epilogue(sum_k A[b, m, k] * B[b, k, n]): a 64x64 output tile per 16x16 workgroup,
each invocation a 4x4 register tile (rows 4 * lid.y.., columns 4 * lid.x..); a `Tile` gives other
shapes (32x64 for products of few rows, 64x64 at 8x4 an invocation past 64 rows and for an fp16
export's plain products from 33, 128x128 at 8x8 for large ones). A and B go through workgroup memory in K steps of 16 (the 128x128 tile's 8) as vec4s of 4 rows (columns
of B), rows padded by one vec4 against bank conflicts. Each invocation loads its share of vec4s of each per step (4
rows' one k, or where K is whole quads one row's 4 k: `TileLoad`); the next
step's loads are issued before this step's products, so their latency hides behind the arithmetic. A product with
few tiles (a prompt of a few hundred rows on a GPU with over a hundred cores) also splits K
(`gemm_split`): workgroup z = (batch, split) sums one K range into the op's scratch, and
GEMM_REDUCE adds the ranges in split order and applies the epilogue. H100, SmolLM2 shapes: 1.5-2x
the 64x64 kernel this replaced at 512-2047 rows, before splitting.

How the tiles are read is a parameter, a `TileLoad`: WGSL functions `a_at(off, m, k, kend)` and
`b_at(off, n, k, kend)` giving one element of A and B (0 outside the product; or `b_k_quad`, 4 K
values of B's column at once), and so a plain
load (f32 or f16 storage), a 4-bit dequantizing load (kernels/matmul/q4_linear.py), an implicit im2col
load (kernels/vision/conv_gemm.py), and later int8 loads. Whatever the storage, the tiles, sums and
split-K's scratch are f32 (with load(precision="f16-sums"), HALF_TILES over f16 operands hold
halves and sum each K step in f16 first); `epilogue` ends with an optional clamp (a fused activation)
and converts to the output's storage type.
"""

import dataclasses
import itertools
import math
import struct
from dataclasses import dataclass

from pte_wgpu.resize.shapes import MAX_WORKGROUPS, numel_of

from ..variants import CPU
from ..wgsl import ERF, FLAT_INDEX, GELU, TILE_ORIGIN, WG, clamped, fill, flat_grid, rounded, vec4_loader, vec4_type
from .f16_matrix import STEP as MATRIX_STEP
from .f16_matrix import matrix_body, tile_size
from .routes import FLOAT_GEMM_MIN_K, exact_rows

# The uniform, defined once: (name, WGSL type); struct.pack format follows from the type.
FIELDS = (
    ("M", "u32"), ("N", "u32"), ("K", "u32"), ("batch", "u32"),
    ("a_bs", "u32"), ("b_bs", "u32"), ("c_bs", "u32"), ("bias_bs", "u32"),
    ("bias_sm", "u32"), ("bias_sn", "u32"), ("alpha", "f32"), ("beta", "f32"),
    ("splits", "u32"), ("kspan", "u32"),
)  # fmt: skip
PARAMS_FORMAT = "<" + "".join("I" if t == "u32" else "f" for _, t in FIELDS)
PARAMS_SIZE = struct.calcsize(PARAMS_FORMAT)  # 56
STRUCT = "struct P { " + ", ".join(f"{n}: {t}" for n, t in FIELDS) + " }"

BK = 16  # the K step of the GEMM's tiles
# Split K while a product has fewer than SPLIT_TARGET workgroups, into at most MAX_SPLITS ranges
# of at least MIN_SPLIT_K. The splits' sums then take at most SPLIT_TARGET tiles' outputs.
SPLIT_TARGET, MAX_SPLITS, MIN_SPLIT_K = 256, 8, 64
# A product of one row of tiles (a ragged pass of decode rows over a model's weights) streams
# each weight once whatever its splits, and its few tiles leave an H200 latency-bound: to
# ROW_SPLIT_ROWS rows (dequantizing loads: DEQUANTIZED_ROW_SPLIT_ROWS) it splits toward
# ROW_SPLIT_TARGET workgroups, into at most ROW_MAX_SPLITS ranges. H200, Llama-3.2-1B, greedy
# bursts, two rounds in one call: 4w at 32 streams 5,285 / 5,202 -> 5,863 / 5,892 tokens/s, a
# 32-token prompt 5,153 / 5,042 -> 5,431 / 5,474; fp16 at 64 streams 7,240 / 7,217 -> 7,677 /
# 7,669. 4-bit weights split so to 64 rows lost there (7,729 / 7,586 -> 7,482 / 7,437: a shorter
# K range for the same dequantizing setup); these targets at every row count lost 6-11% on prompts
# of 128-512 tokens; 2,048 workgroups and 32 ranges 4-5% below these at 64 streams
# (results/h200/kernel_choices/gemm_row_splits/).
ROW_SPLIT_TARGET, ROW_MAX_SPLITS, ROW_SPLIT_ROWS, DEQUANTIZED_ROW_SPLIT_ROWS = 1024, 16, 64, 32


def params_bytes(m, n, k, batch=1, a_bs=0, b_bs=0, bias=(0, 0, 0), alpha=1.0, beta=1.0, split=(1, 0)):
    """The uniform P of one product; `bias` is its (batch, row, column) strides, `split` (splits, kspan)."""
    splits, kspan = split
    return struct.pack(PARAMS_FORMAT, m, n, k, batch, a_bs, b_bs, m * n, *bias, alpha, beta, splits, kspan or max(k, 1))


def bindings(inputs, has_bias, uniform="p: P", scratch=False, bias="f32", out="f32"):
    """WGSL binding lines in order: `inputs` ((name, WGSL element type), read), bias, out (of
    storage types `bias` and `out`), the `uniform` and split-K's scratch `part`. The products'
    GEMVs bind the same way."""
    lines = [f"@group(0) @binding({i}) var<storage, read> {name}: array<{t}>;" for i, (name, t) in enumerate(inputs)]
    n = len(inputs)
    if has_bias:
        lines.append(f"@group(0) @binding({n}) var<storage, read> bias: array<{bias}>;")
        n += 1
    lines.append(f"@group(0) @binding({n}) var<storage, read_write> out: array<{out}>;")
    lines.append(f"@group(0) @binding({n + 1}) var<uniform> {uniform};")
    if scratch:
        lines.append(f"@group(0) @binding({n + 2}) var<storage, read_write> part: array<f32>;")
    return lines


def header(has_bias, inputs, scratch=False, bias="f32", out="f32", clamp=None, residual=False, store=None, activation=None, added=None,
           row_scale=None):
    """The uniform P, `bindings`, `epilogue(acc, b, m, n)`: alpha * acc (+ beta * bias) in f32,
    clamped to `clamp` (lo, hi) if given, converted to the output's storage type `out` (with
    `residual`, alpha * acc is rounded to `out` before the bias, a residual, is added, as the add
    that a fused 4-bit residual linear replaced read it; with `added`, the storage type of a tensor
    shaped as the output that the caller binds as `added`, that value rounded to `out` plus the
    tensor's element, before the clamp, as an add after the product read it; with `activation`, a
    GELU's approximation ("none", "tanh": kernels/wgsl.py's GELU), the GELU of the value rounded to
    `out`, as the op it replaced read it; with `row_scale`, the storage type of a tensor of a
    factor a row that the caller binds as `row_scale`, acc times row m's first), and `store(b, m,
    n, acc)`, which writes an output element: `store` if given (WGSL), else out[b, m, n] =
    epilogue(acc, b, m, n)."""
    lines = [STRUCT + ";", *bindings(inputs, has_bias, scratch=scratch, bias=bias, out=out)]
    product = "p.alpha * (f32(row_scale[m]) * acc)" if row_scale is not None else "p.alpha * acc"
    value = rounded(product, out) if residual else product
    value += " + p.beta * f32(bias[b * p.bias_bs + m * p.bias_sm + n * p.bias_sn])" if has_bias else ""
    if added is not None:
        value = rounded(value, out) + " + f32(added[b * p.c_bs + m * p.N + n])"
    if clamp is not None:
        value = clamped(f"({value})", *(None if math.isinf(v) else repr(float(v)) for v in clamp))
    if activation is not None:
        value = f"gelu({rounded(value, out)})"
        lines.append(f"fn gelu(a: f32) -> f32 {{ return {GELU[activation]}; }}" + (ERF if "erf_approx" in GELU[activation] else ""))
    lines.append(f"fn epilogue(acc: f32, b: u32, m: u32, n: u32) -> {out} {{ return {out}({value}); }}")
    lines.append(store or "fn store(b: u32, m: u32, n: u32, acc: f32) { out[b * p.c_bs + m * p.N + n] = epilogue(acc, b, m, n); }")
    return "\n".join(lines) + "\n"


def added_binding(at, storage):
    """WGSL: header's `added`, bound at `at`, of storage type `storage`."""
    return f"@group(0) @binding({at}) var<storage, read> added: array<{storage}>;\n"


@dataclass(frozen=True)
class WeightSource:
    """B alone, for GemmRoute's widening: `a`, A's storage type as the load reads it (float_a_load's);
    `inputs`, B's bindings (name, WGSL element type), which the GEMM binds right after A's, in that
    order; `functions`, WGSL defining `b_k_quad` (TileLoad's) over them and the uniform p;
    `uniforms`, (struct WGSL, declaration "name: Type") of each other uniform that b_k_quad reads,
    bound as the GEMM's `extra` (4-bit weights' q)."""

    a: object
    inputs: tuple
    functions: str
    uniforms: tuple = ()


@dataclass(frozen=True)
class TileLoad:
    """How the template reads A and B. `inputs`: the operand bindings, (name, WGSL element type);
    `functions`: WGSL defining a_at and b_at (and anything they use; GemmRoute's `extra_wgsl`
    declares bindings past the scratch); `b_along_k`: B's neighbouring elements lie along K (an [N, K]
    weight), so neighbouring invocations load along K; `setup`: statements run once per
    invocation before the K loop, knowing `a_row0` and `b_col0`, the first of the 4 A rows and of
    the 4 B columns it loads; `b_k_quads` (with `b_along_k`): `functions` also define
    `b_k_quad(off, n, k, kend)`, the elements (n, k..k + 3) of B (k a multiple of 4; instead of
    b_at), and each invocation loads one column's 4 K values a step instead of 4 columns' one
    (4-bit weights dequantize 4 values of a word with one scale this way); `a_k_quads`:
    `functions` define `a_k_quad(off, m, k, kend)`, A's (m, k..k + 3) (A of K a multiple of 4),
    instead of a_at, and each invocation loads one row's 4 K values a step; `quads`: the same
    product read with B 4 of K a load too (f32 weights), for tiles of `b_quads`; `b_source`: B read
    alone (a WeightSource), for a load of B 4 of K a load that a GPU widens to f32 first (4-bit
    and f16 weights: GemmRoute's widening); `halves`: A and B both stored as f16, so that a GPU's
    tiles may hold them as halves and sum in them (HALF_TILES); `halves_functions` (such a load 4 of
    K a load): WGSL defining `a_k_halves` and `b_k_halves`, a_k_quad's and b_k_quad's quads as
    stored, 4 halves in a vec2<u32> (MATRIX_TILE's loads); `weight_ends` (a column group's, of
    weights each but the last whole MATRIX_TILE tiles): each weight's last column, the halves
    functions then also defining b_k_halves_j, weight j's alone (f16_matrix.matrix_body); `words`
    (4-bit weights of f16 scales, groups of whole K steps of the matrices): the halves functions
    also define b_word and b_words_scale (and b_word_j, b_words_scale_j with `weight_ends`), a word
    of a column's K step and the step's scale (f16_matrix.matrix_body's `words`); `word_scales`
    the scales' storage (f16, or f32: each weight an f32 product rounded to f16)."""

    inputs: tuple
    functions: str
    b_along_k: bool
    setup: str = ""
    b_k_quads: bool = False
    dequantizes: bool = False  # B's quads dequantized (4-bit weights: takes_mid_tile's k_quads)
    a_k_quads: bool = False
    quads: "TileLoad | None" = None
    b_source: WeightSource | None = None
    halves: bool = False
    halves_functions: str = ""
    weight_ends: tuple = ()
    words: bool = False
    word_scales: str = "f16"


# A [M, K], rows of K, as f32 from binding $A at the batch's offset (the float products', the
# 4-bit products' and the implicit-GEMM convolution's A)
FLOAT_A_AT = """
fn a_at(off: u32, m: u32, k: u32, kend: u32) -> f32 {
    if (m < p.M && k < kend) { return f32($A[off + m * p.K + k]); }
    return 0.0;
}
"""


def float_a_at(binding="a"):
    """The GEMM's A load from `binding`, f32 or f16 storage."""
    return fill(FLOAT_A_AT, A=binding)


# The forms a quad of K is read in, {FORM: (its WGSL type, zero, the suffix of the bindings' loaders)}:
# as f32 (vec4_loader's `{name}4`), or an f16 quad as stored, 4 halves in a vec2<u32> (`{name}h`)
QUAD_FORMS = {"quad": ("vec4<f32>", "vec4<f32>(0.0)", "4"), "halves": ("vec2<u32>", "vec2<u32>(0u)", "h")}


def quad_form(template, form, **values):
    """`template` filled for a QUAD_FORMS form (a name past "_" its own, as "halves_1"): $FORM, $T, $ZERO (and $L, where it reads a binding)."""
    t, zero, loader = QUAD_FORMS[form.split("_")[0]]
    return fill(template, FORM=form, T=t, ZERO=zero, **({"L": loader} if "$L" in template else {}), **values)


def halves_loader(name):
    """WGSL `fn {name}h(i: u32) -> vec2<u32>`: element i of binding `name`, f16 bound as vec4_type's vec2<u32>."""
    return f"fn {name}h(i: u32) -> vec2<u32> {{ return {name}[i]; }}\n"


# A [M, K] of K a multiple of 4, 4 of K a load from binding $A bound as vec4s (TileLoad.a_k_quads;
# K ranges end at multiples of 4; GemmRoute refuses a live K of other shapes)
FLOAT_A_K_QUAD = """
fn a_k_$FORM(off: u32, m: u32, k: u32, kend: u32) -> $T {
    if (m < p.M && k < kend) { return ${A}$L((off + m * p.K + k) / 4u); }
    return $ZERO;
}
"""


def float_a_k_quad(binding="a", storage="f32"):
    """The GEMM's A load 4 of K a load (TileLoad.a_k_quads) from `binding`, f32 or f16 storage, bound as vec4_type(storage)."""
    return vec4_loader(binding, storage) + quad_form(FLOAT_A_K_QUAD, "quad", A=binding)


# B [N, K] or [K, N] as f32 ($B_INDEX: element (n, k)'s offset)
FLOAT_B_AT = """
fn b_at(off: u32, n: u32, k: u32, kend: u32) -> f32 {
    if (n < p.N && k < kend) { return f32(bm[off + $B_INDEX]); }
    return 0.0;
}
"""


# B an [N, K] weight of whole K quads, 4 of K a load (TileLoad.b_k_quads): $READS return the quad
# of column n from k (bindings read through their loaders, QUAD_FORMS)
FLOAT_B_K_QUAD = """
fn b_k_$FORM(off: u32, n: u32, k: u32, kend: u32) -> $T {
    if (k >= kend) { return $ZERO; }
$READS    return $ZERO;
}
"""


# B's quad of dequantized weights (b_k_quad$J, f32) rounded to 4 halves: the f16 matrices' B read over
# 4-bit weights of f16 rows, each weight rounded once to f16 as eager dequantizes it
PACKED_B_K_HALVES = """
fn b_k_halves$J(off: u32, n: u32, k: u32, kend: u32) -> vec2<u32> {
    let w = b_k_quad$J(off, n, k, kend);
    return vec2<u32>(pack2x16float(w.xy), pack2x16float(w.zw));
}
"""


def dequantized_halves(a_binding, weights=1):
    """The end of TileLoad.halves_functions (after the WGSL defining b_k_quad, and with `weights` >
    1, a column group's whole-tile weights, matrix_weights, b_k_quad_j, weight j's alone) of a load
    whose B quads are dequantized in f32 and whose A, binding `a_binding`, is f16 read 4 of K a
    load: a_k_halves as stored, b_k_halves (b_k_halves_j) packing b_k_quad's (b_k_quad_j's); with
    `weights` 0 a_k_halves alone (a load whose tiles read B a word at a time, TileLoad.words)."""
    packed = ([""] if weights else []) + ([f"_{j}" for j in range(weights)] if weights > 1 else [])
    return halves_loader(a_binding) + quad_form(FLOAT_A_K_QUAD, "halves", A=a_binding) + "".join(fill(PACKED_B_K_HALVES, J=j) for j in packed)


def matrix_weights(ns):
    """Whether a column group of products of N = `ns` runs the f16 matrices' K loop once a weight
    (TileLoad.weight_ends): each weight but the last is whole tiles (MATRIX_TILE's and
    DECODE_MATRIX_TILE's columns), so each tile reads one."""
    return len(ns) > 1 and not any(n % MATRIX_TILE.bn for n in ns[:-1])


def float_k_quads(weight_types, k):
    """Whether [N, K] weights stored as `weight_types` with rows of K take float_load's `k_quads`:
    f16 ones of K a multiple of 4, whose 4 columns' one took 4 loads of 2 bytes. H200, Llama-3.2-1B
    fp16, two rounds in one call: prompts of 512 and 2,047 tokens 11,307 / 11,434 and 11,951 /
    11,939 -> 13,075 / 13,268 and 13,932 / 14,066 tokens/s, 64 streams (the GEMM past 32 rows) 5,801
    / 5,810 -> 7,268 / 7,200; f32 ones (SmolLM2 fp32) within the runs' spread, 64 streams' LM head
    GEMM 16,081 / 16,060 -> 14,986 / 15,648 (results/h200/kernel_choices/float_gemm_k_quads/)."""
    return k % 4 == 0 and all(t == "f16" for t in weight_types)


def float_a_load(a, a_quads, binding="a"):
    """(A's binding, its WGSL functions) for A stored as `a` in `binding`, read 4 of K a load with
    `a_quads` (TileLoad.a_k_quads)."""
    return ((binding, vec4_type(a)), float_a_k_quad(binding, a)) if a_quads else ((binding, a), float_a_at(binding))


def _k_quad_load(a, weights, reads, a_quads=False):
    """The TileLoad of A stored as `a` and [N, K] weights (binding, storage type) read 4 of K a
    load; `reads(L)`: FLOAT_B_K_QUAD's, the loaders' suffix L; `a_quads`: A too. Weights other than
    f32 are its b_source; A and weights all f16, read 4 of K a load, have its halves_functions."""
    b_inputs = tuple((w, vec4_type(t)) for w, t in weights)
    b_functions = "".join(vec4_loader(w, t) for w, t in weights) + quad_form(FLOAT_B_K_QUAD, "quad", READS=reads("4"))
    a_binding, a_functions = float_a_load(a, a_quads)
    source = WeightSource(a, b_inputs, b_functions) if any(t != "f32" for _, t in weights) else None
    halves = a == "f16" and all(t == "f16" for _, t in weights)
    as_stored = ""
    if halves and a_quads:
        as_stored = "".join(halves_loader(name) for name, _ in (a_binding, *b_inputs)) + quad_form(FLOAT_A_K_QUAD, "halves", A=a_binding[0])
        as_stored += quad_form(FLOAT_B_K_QUAD, "halves", READS=reads("h"))
    return TileLoad(inputs=(a_binding, *b_inputs), functions=a_functions + b_functions, b_along_k=True, b_k_quads=True, a_k_quads=a_quads, b_source=source,
                    halves=halves, halves_functions=as_stored)


def float_load(transposed_b, a="f32", b="f32", k_quads=False, a_quads=False):
    """A [M, K] and B, an [N, K] weight (`transposed_b`) or a [K, N] matrix, stored as WGSL types
    `a` and `b` (f32 or f16), loaded as f32; `k_quads`: an [N, K] weight of K a multiple of 4, read
    4 of K a load (a vec4, or 4 halves as a vec2<u32>; float_k_quads); `a_quads`: A of K a multiple of 4, 4 of K a load."""
    if k_quads:
        return _k_quad_load(a, [("bm", b)], lambda L: f"    if (n < p.N) {{ return bm{L}((off + n * p.K + k) / 4u); }}\n", a_quads)
    b_index = "n * p.K + k" if transposed_b else "k * p.N + n"
    a_binding, a_functions = float_a_load(a, a_quads)
    return TileLoad(
        inputs=(a_binding, ("bm", b)),
        functions=a_functions + fill(FLOAT_B_AT, B_INDEX=b_index),
        b_along_k=transposed_b,
        a_k_quads=a_quads,
        halves=a == b == "f16",
    )


def weight_load(a, b, k):
    """The TileLoad of a product of A stored as `a` by an [N, K] weight stored as `b`, K `k` at
    most: A 4 of K a load where K is whole quads, B too where float_k_quads says so, else for tiles
    of `b_quads` (TileLoad.quads)."""
    quads = k % 4 == 0
    load = float_load(True, a, b, k_quads=float_k_quads([b], k), a_quads=quads)
    return dataclasses.replace(load, quads=float_load(True, a, b, k_quads=True, a_quads=True)) if quads and not load.b_k_quads else load


# column_group's B: $READS returns row n - s_j of w_j for the n of product j
COLUMN_GROUP_B_AT = """
fn b_at(off: u32, n: u32, k: u32, kend: u32) -> f32 {
    if (k >= kend) { return 0.0; }
$READS    return 0.0;
}
"""


def column_ranges(ns):
    """(s_j, e_j): the columns of product j in a column group of products of N = `ns`."""
    ends = list(itertools.accumulate(ns))
    return list(zip([0, *ends[:-1]], ends))


def column_store(ns):
    """A column group's `store` WGSL: column n goes to row n - s_j of out_j, bound as `out` (j = 0)
    and `out1`, `out2`, ... (GemmRoute's `more_outs`); rows of one batch."""
    names = ["out", *(f"out{j}" for j in range(1, len(ns)))]
    writes = " else ".join(
        f"if (n < {e}u) {{ {name}[m * {size}u + n - {s}u] = epilogue(acc, b, m, n); }}" for name, (s, e), size in zip(names, column_ranges(ns), ns)
    )
    return f"fn store(b: u32, m: u32, n: u32, acc: f32) {{ {writes} }}"


def column_group(x, weights, ns, k):
    """(TileLoad, `store` WGSL) of products out_j = x @ w_j.T as one product over their columns
    side by side: column n of the whole is row n - s_j of w_j (an [N_j, K] weight), s_j the N of
    the products before it, and goes to out_j (column_store). `x`, `weights`: WGSL storage types;
    `ns`: the N_j; rows of one batch (a linear's M is every leading dim); K `k` read as weight_load reads it."""
    quads = k % 4 == 0

    def k_quad_load():  # float_load's: K a multiple of 4, 4 of K a load
        def reads(loader):
            return "".join(f"    if (n < {e}u) {{ return w{j}{loader}((off + (n - {s}u) * p.K + k) / 4u); }}\n" for j, (s, e) in enumerate(column_ranges(ns)))

        load = _k_quad_load(x, [(f"w{j}", t) for j, t in enumerate(weights)], reads, a_quads=True)
        if not load.halves_functions or not matrix_weights(ns):
            return load
        # MATRIX_TILE's tiles each within one weight: a reader of each weight alone (matrix_body's weight_ends)
        one = "".join(quad_form(FLOAT_B_K_QUAD, f"halves_{j}", READS=f"    return w{j}h((off + (n - {s}u) * p.K + k) / 4u);\n")
                      for j, (s, _) in enumerate(column_ranges(ns)))
        return dataclasses.replace(load, halves_functions=load.halves_functions + one, weight_ends=tuple(e for _, e in column_ranges(ns)))

    if float_k_quads(weights, k):
        return k_quad_load(), column_store(ns)
    reads = "".join(f"    if (n < {e}u) {{ return f32(w{j}[off + (n - {s}u) * p.K + k]); }}\n" for j, (s, e) in enumerate(column_ranges(ns)))
    a_binding, a_functions = float_a_load(x, quads)
    load = TileLoad(
        inputs=(a_binding, *((f"w{j}", t) for j, t in enumerate(weights))),
        functions=a_functions + fill(COLUMN_GROUP_B_AT, READS=reads),
        b_along_k=True,
        a_k_quads=quads,
        quads=k_quad_load() if quads else None,
        halves=x == "f16" and all(t == "f16" for t in weights),
    )
    return load, column_store(ns)


A_QUAD = """
fn a_quad(off: u32, m: u32, k: u32, kend: u32) -> vec4<f32> {
    return vec4<f32>(a_at(off, m, k, kend), a_at(off, m + 1u, k, kend), a_at(off, m + 2u, k, kend), a_at(off, m + 3u, k, kend));
}
"""
B_QUAD = """
fn b_quad(off: u32, n: u32, k: u32, kend: u32) -> vec4<f32> {
    return vec4<f32>(b_at(off, n, k, kend), b_at(off, n + 1u, k, kend), b_at(off, n + 2u, k, kend), b_at(off, n + 3u, k, kend));
}
"""
# Which (column quad, k) of the B tile invocation li loads: along K for an [N, K] weight, along N
# for a [K, N] matrix (so that neighbouring invocations read neighbouring addresses); with K quads
# (TileLoad.b_k_quads), which (column, k quad). A tile loads more quads than it has invocations
# (fewer rows, or more columns), each loading as invocations li, li + its count, ..: slot j of
# an invocation is named with j; $BQ is the tile's column quads.
B_SLOT_ALONG_K = "let bn4$J = $LI / ${BK}u; let bk$J = $LI % ${BK}u;"
B_SLOT_ALONG_N = "let bn4$J = $LI % ${BQ}u; let bk$J = $LI / ${BQ}u;"
B_SLOT_K_QUADS = "let bn$J = $LI / ${BQK}u; let bk4$J = $LI % ${BQK}u; let bn4$J = bn$J / 4u;"
# (the first load, the next step's load, the store into Bs) of each way
B_QUADS = ("b_quad(boff, n0 + 4u * bn4$J, kbeg + bk$J, kend)", "b_quad(boff, n0 + 4u * bn4$J, k0 + ${BK}u + bk$J, kend)", "Bs[bk$J * ${BP}u + bn4$J] = vec4<${S}>(rb$J);")
B_K_QUADS = (
    "b_k_quad(boff, n0 + bn$J, kbeg + 4u * bk4$J, kend)",
    "b_k_quad(boff, n0 + bn$J, k0 + ${BK}u + 4u * bk4$J, kend)",
    " ".join(f"Bs[(4u * bk4$J + {i}u) * ${{BP}}u + bn4$J][bn$J % 4u] = ${{S}}(rb$J[{i}]);" for i in range(4)),
)
A_SLOT = "let am4$J = $LI / ${BK}u; let ak$J = $LI % ${BK}u;"  # which (row quad, k) of the A tile
A_QUADS = ("a_quad(aoff, m0 + 4u * am4$J, kbeg + ak$J, kend)", "a_quad(aoff, m0 + 4u * am4$J, k0 + ${BK}u + ak$J, kend)", "As[ak$J * ${AP}u + am4$J] = vec4<${S}>(ra$J);")
# With TileLoad.a_k_quads, which (row, k quad) of the A tile, and its loads: one row's 4 K values at once
A_SLOT_K_QUADS = "let am$J = $LI / ${BQK}u; let ak4$J = $LI % ${BQK}u; let am4$J = am$J / 4u;"
A_K_QUADS = (
    "a_k_quad(aoff, m0 + am$J, kbeg + 4u * ak4$J, kend)",
    "a_k_quad(aoff, m0 + am$J, k0 + ${BK}u + 4u * ak4$J, kend)",
    " ".join(f"As[(4u * ak4$J + {i}u) * ${{AP}}u + am4$J][am$J % 4u] = ${{S}}(ra$J[{i}]);" for i in range(4)),
)

GEMM = """
var<workgroup> As: array<vec4<${S}>, ${A_SIZE}>;  // [k][m / 4], ${BK} x ${AP}
var<workgroup> Bs: array<vec4<${S}>, ${B_SIZE}>;  // [k][n / 4], ${BK} x ${BP}

@compute @workgroup_size(16, ${TY})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
$ORIGIN
    $A_SLOT
    $B_SLOT
$SETUP
    $A_FIRST
    $B_FIRST
    $ACCS
    for (var k0 = kbeg; k0 < kend; k0 = k0 + ${BK}u) {
        $A_STORE
        $B_STORE
        workgroupBarrier();
        $A_NEXT
        $B_NEXT
        $PRODUCTS
        $FOLD
        workgroupBarrier();
    }
    let total = p.batch * p.M * p.N;
$STORES
}
"""
# An output quad of the epilogue: row m, columns n .. n + 3 from vec4 $C
STORE_QUAD = """    for (var j = 0u; j < 4u; j = j + 1u) {
        if (m < p.M && n + j < p.N) {
            if (p.splits == 1u) {
                store(b, m, n + j, ${C}[j]);
            } else {
                part[split * total + (b * p.M + m) * p.N + n + j] = ${C}[j];
            }
        }
    }
"""


# Split-K's second dispatch: one invocation per output adds its K ranges in order.
GEMM_REDUCE = fill(
    """
$FLAT_INDEX
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg, ${WG}u);
    let total = p.batch * p.M * p.N;
    if (i >= total) { return; }
    var acc = 0.0;
    for (var s = 0u; s < p.splits; s = s + 1u) { acc = acc + part[s * total + i]; }
    let b = i / (p.M * p.N);
    let m = (i / p.N) % p.M;
    store(b, m, i % p.N, acc);
}
""",
    FLAT_INDEX=FLAT_INDEX,
    WG=WG,
)


@dataclass(frozen=True)
class Tile:
    """A GEMM tile: `ty` rows of 16 invocations, each summing `rq` x `cq` quads of outputs (4 x 4
    each): rows 4 * (lid.y + ty * i).., columns 4 * (lid.x + 16 * j).., so that a subgroup's reads
    of a K step's row of A and of B are contiguous; `unroll`: a K step's k written out one by one,
    not a loop; `bk`: the K step; `b_quads`: the load's `quads` where it has them; `half`: A and B
    in workgroup memory as halves (a TileLoad of `halves`), each K step's products summed in f16,
    then added to the f32 sums (HALF_TILES); `matrix`: f16 operands on subgroup matrices
    (f16_matrix.py, MATRIX_TILE), the tile's shape there (f16_matrix.tile_size: bm x bn);
    `split_target`: the workgroups gemm_split aims at for it, where not the template's targets."""

    ty: int = 16
    rq: int = 1
    cq: int = 1
    unroll: bool = False
    bk: int = BK
    b_quads: bool = False
    half: bool = False
    matrix: tuple = ()
    split_target: int = 0

    @property
    def bm(self):
        return tile_size(self.matrix)[0] if self.matrix else 4 * self.ty * self.rq

    @property
    def bn(self):
        return tile_size(self.matrix)[1] if self.matrix else 64 * self.cq


# 64 x 64 at 4 x 4 outputs an invocation: products of up to its rows (a ragged decode pass), and
# loads with a per-invocation setup (which need one row quad and one column quad an invocation)
TILE = Tile()
SMALL_TILE = Tile(ty=8)  # 32 x 64, for products of few rows (GemmRoute's small)
# 64 x 64 in half the invocations, 8 x 4 outputs each, its K steps unrolled: products of more rows
# (takes_mid_tile). H200, the template alone (BENCHMARKS.md): 4-18% faster than TILE on the
# products of ViT-B/16 (197 and 1,576 rows), of SmolLM2 at 2,047 rows and of Llama-3.2-1B at 512
# and 2,047 rows; 5-7% slower on the 1B's 4-bit products at 48 and 64 rows, and at 512 rows where
# they have a few hundred tiles (fewer invocations to hide the dequantizing loads' latency)
# and f32 weights 4 of K a load (TileLoad.quads): 3-7% on ViT's, SmolLM2's and the 1B's fp32 products
# (TILE 4% slower so; results/h200/kernel_choices/gemm_k_steps/); and f16 weights (an fp16 export's,
# read 4 of K a load) of K >= FLOAT_GEMM_MIN_K at 33 to 64 rows, a ragged pass of decode rows: H200, the
# template alone at 48 / 64 rows, the runtime's K splits, Llama-3.2-1B fp16's products 1.02-1.21x
# TILE's (o 1.07 / 1.10, down 1.13 / 1.15, its head 1.20 / 1.21; the fused q/k/v 1.06 / 1.02 and gate/up
# 1.17 / 1.17 there, but as column groups in the model's pass, each dispatch timed at 64 rows, q/k/v
# 55-59 -> 70-71 us and gate/up 184 -> 186: those keep TILE; results/h200/kernel_choices/f16_gemm_decode_rows/)
MID_TILE = Tile(ty=8, rq=2, unroll=True, b_quads=True)
# 128 x 128, 8 x 8 outputs an invocation: twice the products per workgroup-memory read of TILE,
# its K steps unrolled (the driver unrolls TILE's 16 products a k, not these 64); for products
# that give it enough tiles of long enough K (GemmRoute's big, takes_big_tile). K steps of 8 and
# f32 weights 4 of K a load: H200, the template alone, A 4 of K a load in both, 4096^3 fp32 38.3 ->
# 41.1 TFLOP/s, 4-bit 35.6 -> 36.5 (K steps of 32 28.3; results/h200/kernel_choices/gemm_k_steps/)
BIG_TILE = Tile(rq=2, cq=2, unroll=True, bk=8, b_quads=True)


# the fewest tiles a product of 4-bit weights (TileLoad.dequantizes) takes MID_TILE with, at any row
# count: past 64 rows, and at 33 to 64 (a ragged decode pass) an LM head of 65,536 rows or more.
# H200, the template alone (results/h200/kernel_choices/q4_gemm_64_rows/): Llama-3.2-1B's head
# (128,256 x 2,048) at 64 / 48 rows 27.4 / 21.0 -> 30.9 / 23.4 TFLOP/s in MID_TILE; the 1B's other
# products (at most 512 tiles) 0.88-0.99x TILE's there
MID_MIN_K_QUAD_TILES = 1024
# 64 x 128 at 4 x 8 outputs an invocation, its K steps unrolled: products of 4-bit weights over 33 to
# 64 rows (a ragged pass of that many decode rows) whose N and K are both at least WIDE_ROW_MIN (an
# 8B model's): each weight quad is dequantized once for twice the columns a workgroup. H200, the
# template alone at 48 and 64 rows, the runtime's K splits each
# (results/h200/kernel_choices/q4_gemm_few_rows/): Llama-3.1-8B's products 1.05-1.37x TILE's (6,144
# x 4,096 1.35-1.37x, 28,672 x 4,096 and 4,096 x 14,336 1.10-1.12x, its head 1.05x); Llama-3.2-1B's
# (K or N of 2,048) 0.90-1.05x. The 8B shape (4 of 32 layers, 4w), greedy bursts, two rounds in one
# call: 48 streams 5,881 / 5,840 -> 5,987 / 6,034 tokens/s, 64 streams 7,667 / 7,698 -> 7,937 /
# 7,934, one stream the same; the 1B with its products at 2,048 x 8,192 and its head taking it too
# lost 6% at 64 streams.
WIDE_ROW_TILE = Tile(cq=2, unroll=True)
WIDE_ROW_MIN = 4096
# The tiles that a GPU runs in halves (Tile.half) for operands stored as f16 (TileLoad.halves, an
# fp16 export's products): an f16 multiply-add does two lanes' work an instruction, and workgroup
# memory holds half the bytes. A K step's 16 products of an output sum in f16, then go into its f32
# sum: each rounding about 2^-11 of a step's partial sum, of the order of the f16 output's own
# rounding (within 5e-4 of the largest output at K of 2,048-8,192, against 3e-7 summed in f32).
# Only with load(precision="f16-sums") (OpBuilder.half_sums). H200, the template alone,
# Llama-3.2-1B fp16's products at 48 / 64 rows, the runtime's K splits: TILE 1.14-1.25x, MID_TILE
# 1.10-1.29x the f32 sums; at 512 and 2,047 rows MID_TILE 1.16-1.22x; BIG_TILE in halves
# 0.68-0.90x its f32 sums (a fold every 8 of K); 1B fp16 at 48 / 64 streams +13-15%
# (results/h200/kernel_choices/half_products/).
HALF_TILES = (TILE, SMALL_TILE, MID_TILE)
# 128 x 128 on f16 subgroup matrices (kernels/matmul/f16_matrix.py): products of f16 operands, A and
# B read 4 of K a load, of at least MATRIX_MIN_ROWS rows, where the device offers F16_MATRIX
# (OpBuilder.f16_matrices); they take it in place of the f32 tiles over widened weights (4-bit
# weights of f16 rows: over the weights as stored (TileLoad.words) or widened to f16, HALF_WIDEN_MIN_ROWS).
MATRIX_TILE = Tile(matrix=(2, 2, 4, 4))
MATRIX_MIN_ROWS = 128
# ... and products of fewer rows than that, past those the subgroup kernels and GEMVs take
# (GemmRoute's matrix_from: routes.py's exact_rows; a ragged pass of decode rows, a short prompt)
# in 64 x 128 tiles, four subgroups side by side along N, each 4 x 2 result matrices, K split
# toward 128 workgroups (a tile's loop runs on after a barrier a K step; more
# splits only add the reduce's traffic). H200, Dawn, the template alone, Llama-3.2-1B fp16's
# products at 64 / 33 rows, weights cycled past the L2 cache, each tile at its best K split, us:
# MID_TILE, MATRIX_TILE, this: q/k/v 63 / 58, 47 / 43, 38 / 37; o 47 / 42, 66 / 61, 36 / 34;
# gate/up 214 / 199, 102 / 102, 90 / 92; down 154 / 113, 193 / 183, 78 / 68; the head 1,251 /
# 1,162, 2,408 / 2,384, 676 / 652 (64 x 128 in 2 x 2 subgroups of 2 x 4 matrices the same, 64 x 64
# within 5%, 32 x 128 0.3-1.4x MID_TILE). Llama-3.2-1B fp16, greedy bursts, 48 / 64 streams 5,743 /
# 7,379 -> 9,935 / 12,857 tokens/s (results/h200/kernel_choices/f16_matrix_decode_rows/).
DECODE_MATRIX_TILE = Tile(matrix=(1, 4, 4, 2), split_target=128)
# 4-bit weights of f16 rows (a 4w export of f16 activations) take DECODE_MATRIX_TILE too, the rows
# their GEMVs and subgroup kernels leave (past BITWISE_ROWS at K >= Q4_GEMM_MIN_K), and to 32 rows
# SHORT_DECODE_MATRIX_TILE (32 x 128, 2 x 2 matrices a subgroup): each invocation dequantizing a word
# of a column's K step of 32 (f16_matrix.py's B_WORD_KEEP: the step's one scale, the nibbles through
# f16 mantissas) where the f32 tiles dequantized 4 of K a read. H100, Dawn, Llama-3.2-1B 4w of f16
# activations, greedy bursts, the f32 tiles against these, rounds old / new / new / old in one call,
# 32 / 64 streams 6,134 / 8,025, 7,460 / 13,022, 7,298 / 13,248, 6,227 / 8,156 tokens/s (the 64-row
# tile alone); with the 32-row tile, rounds around it, 32 streams 7,454 / 7,510 -> 8,155 / 8,133 and
# prompts of 32 tokens 5,394-6,040 -> 7,395-7,569, 64 streams the same; the tile reading quads as
# f16 weights' (b_k_halves: a word and a scale a quad) 6,281 / 8,285 -> 4,289 / 8,024; a column's 4
# words an invocation (a warp's loads over 32 rows) where now 4 neighbouring invocations read them:
# H200, rounds old / new / new / old, 24 / 32 / 64 streams 6,324 / 8,102 / 12,864, 7,185 / 9,349 /
# 14,311, 7,106 / 9,338 / 14,361, 6,422 / 8,133 / 12,865, prompts of 128 / 512 / 2,047 tokens
# 12,074-13,181 / 26,116-27,903 / 31,663-31,720 -> 14,871-15,953 / 30,514-30,905 / 35,271-35,398
# (results/h200/q4_f16_matrix_word_reads/). f16 weights
# themselves (read 4 of K a read) lose with the 32-row tile: Llama-3.2-1B fp16, 24 / 32 streams
# 5,676-5,722 / 7,381-7,445 -> 3,404-3,416 / 4,469-4,473; and read a column's step an invocation
# as 4-bit words are, 0.75-0.87x at 24-64 streams and prompts (results/h100/q4_f16_matrix_decode_rows/). Its K
# split toward 128 workgroups: toward 32 / 64 / 256 / 1,024, H100, Dawn, the 1B 4w of f16 activations loaded with
# batch_invariant=False, 16 streams 4,954-5,004 -> 3,219 / 4,103 / 4,708 / 4,058 (results/h100/batch_variant_rows/).
SHORT_DECODE_MATRIX_TILE = Tile(matrix=(1, 4, 2, 2), split_target=128)
# ... and to 16 rows (9-16 where a model is loaded with batch_invariant=False) 16 x 128, a result
# matrix along M a subgroup: the 32-row tile's half that 16 live rows fill. H100, Dawn, the 1B 4w of
# f16 activations loaded so, greedy bursts, rounds old / new / new / old in one call, 16 streams
# 4,227 (a cold first round) / 5,895 / 5,991 / 5,493 tokens/s, 1 and 8 streams the same
# (results/h100/q4_f16_matrix_decode_rows/tiny_tile/).
TINY_DECODE_MATRIX_TILE = Tile(matrix=(1, 4, 1, 2), split_target=128)
# ... but products wide enough to split K toward the same 128 workgroups in 16 x 256 tiles (N of
# 4,096 and more: SwiGLU's gate and up, the LM head) take those, four subgroups of 1 x 4 result
# matrices. Per dispatch, 16 rows of the 1B 4w of f16 activations summed over a pass: the LM head
# 295 -> 241 us, SwiGLU's gate | up 807 -> 763; in 256 columns q/k/v (3,072) 382 -> 380 and o and
# down (2,048, half the workgroups) 743 -> 969 (H100, Dawn, results/h100/tiny_tile_probes/); greedy
# bursts, 16 streams 6,308 -> 6,504 tokens/s, medians of seven rounds each in three calls, one stream
# the same (results/h100/wide_tiny_tile/).
WIDE_TINY_DECODE_MATRIX_TILE = Tile(matrix=(1, 4, 1, 4), split_target=128)


def takes_wide_tiny_tile(n, weight_ends=()):
    """Whether a product of N = `n` (a column group's weights ending at `weight_ends`) takes
    WIDE_TINY_DECODE_MATRIX_TILE where it takes the 16-row tiles: its tiles split K toward the
    tile's split target, each tile within one weight."""
    wide = WIDE_TINY_DECODE_MATRIX_TILE
    return -(-n // wide.bn) * MAX_SPLITS >= wide.split_target and not any(e % wide.bn for e in weight_ends[:-1])


def takes_mid_tile(m, n, k_quads=False, f16_k=0):
    """Whether an M x N product runs faster in MID_TILE than in TILE; `k_quads`: its load
    dequantizes B's K quads (4-bit weights); `f16_k`: K of f16 weights (0: other weights)."""
    if k_quads:
        return -(-m // TILE.bm) * -(-n // TILE.bn) >= MID_MIN_K_QUAD_TILES
    return m > TILE.bm or (m > SMALL_TILE.bm and f16_k >= FLOAT_GEMM_MIN_K)


def takes_wide_row_tile(m, n, k):
    """Whether an M x N x K product of 4-bit weights runs faster in WIDE_ROW_TILE than in TILE."""
    return SMALL_TILE.bm < m <= TILE.bm and n >= WIDE_ROW_MIN and k >= WIDE_ROW_MIN


def takes_big_tile(m, n, k):
    """Whether an M x N x K product runs faster in BIG_TILE than in TILE or MID_TILE (an H200: N and K of 2,048
    from 128 rows; K of 1,536 and N of 512 from 1,024 rows; not K of 576-768, nor N of 576 at 512
    rows, BENCHMARKS.md)."""
    return (m >= 128 and n >= 2048 and k >= 2048) or (m >= 1024 and n >= 512 and k >= 1536)


def gemm_shader(load, has_bias, extra="", bias="f32", out="f32", clamp=None, residual=False, store=None, tile=TILE, activation=None,
                added=None, row_scale=None):
    """The template with `load`'s tile reads; `extra`: WGSL bindings after the scratch; `bias` and
    `out` their storage types; `clamp`: the epilogue's (lo, hi); `store`: header's; `tile`: a Tile
    (a load whose setup reads a_row0, or b_col0, needs one row quad, or column quad, an invocation
    to load)."""
    load = load.quads if tile.b_quads and load.quads else load  # (MATRIX_TILE's b_quads are False: its load as given)
    head = header(has_bias, load.inputs, scratch=True, bias=bias, out=out, clamp=clamp, residual=residual, store=store, activation=activation,
                  added=added, row_scale=row_scale)
    if tile.matrix:
        return "enable chromium_experimental_subgroup_matrix;\n" + head + extra + load.halves_functions + matrix_body(tile.matrix, load.weight_ends, load.words, load.word_scales)
    threads = 16 * tile.ty
    a_slots, b_slots = tile.bm * tile.bk // 4 // threads, tile.bn * tile.bk // 4 // threads
    assert a_slots * threads * 4 == tile.bm * tile.bk and b_slots * threads * 4 == tile.bn * tile.bk, f"{tile}: its invocations do not load whole K steps"
    assert (a_slots == 1 or "a_row0" not in load.setup) and (b_slots == 1 or "b_col0" not in load.setup)
    setup = "    let a_row0 = m0 + 4u * am4;\n    let b_col0 = n0 + 4u * bn4;\n" + load.setup if load.setup else ""
    slot = B_SLOT_K_QUADS if load.b_k_quads else B_SLOT_ALONG_K if load.b_along_k else B_SLOT_ALONG_N
    b_first, b_step, b_store = B_K_QUADS if load.b_k_quads else B_QUADS
    a_slot, (a_first, a_step, a_store) = (A_SLOT_K_QUADS, A_K_QUADS) if load.a_k_quads else (A_SLOT, A_QUADS)
    ap, bp = tile.bm // 4 + 1, tile.bn // 4 + 1
    scalar = "f16" if tile.half else "f32"  # workgroup memory's (the stores convert the loads' f32 to it)

    def lines(text, n, sep):  # the n slots' statements: slot j's names end in J, it loads as invocation LI
        slots = [dict(J=f"_{j}" if j else "", LI=f"(li + {j * threads}u)" if j else "li", AP=ap, BP=bp, BQ=tile.bn // 4, BK=tile.bk, BQK=tile.bk // 4, S=scalar)
                 for j in range(n)]
        return sep.join(fill(text, **{k: v for k, v in slot.items() if f"${k}" in text or f"${{{k}}}" in text}) for slot in slots)

    rows, cols = range(tile.rq), range(tile.cq)
    accs = [f"c{r}_{i}_{c}" for r in rows for i in range(4) for c in cols]

    sums = [f"h{c[1:]}" if tile.half else c for c in accs]  # a half tile's K step sums in f16, then into f32's

    def step(k):  # the products of one k of the tile's K step
        reads = [f"let x{r} = As[{k} * {ap}u + lid.y + {tile.ty * r}u];" for r in rows]
        reads += [f"let y{c} = Bs[{k} * {bp}u + lid.x + {16 * c}u];" for c in cols]
        return reads + [f"{s} = {s} + x{r}.{'xyzw'[i]} * y{c};" for s, (r, i, c) in zip(sums, itertools.product(rows, range(4), cols))]

    if tile.unroll:
        products = [f"{{ {' '.join(step(f'{k}u'))} }}" for k in range(tile.bk)]
    else:
        products = [f"for (var k = 0u; k < {tile.bk}u; k = k + 1u) {{", *("    " + line for line in step("k")), "}"]
    fold = ""
    if tile.half:
        products = [f"var {h} = vec4<f16>(0.0);" for h in sums] + products
        fold = " ".join(f"{c} = {c} + vec4<f32>({h});" for c, h in zip(accs, sums))
    stores = [
        f"    {{ let m = m0 + 4u * (lid.y + {tile.ty * r}u) + {i}u; let n = n0 + 4u * (lid.x + {16 * c}u);\n" + fill(STORE_QUAD, C=f"c{r}_{i}_{c}") + "    }"
        for r in rows for i in range(4) for c in cols
    ]
    body = fill(
        GEMM, ORIGIN=fill(TILE_ORIGIN, BM=tile.bm, BN=tile.bn), S=scalar, FOLD=fold, TY=tile.ty, AP=ap, BP=bp, A_SIZE=tile.bk * ap, B_SIZE=tile.bk * bp, SETUP=setup, BK=tile.bk,
        A_SLOT=lines(a_slot, a_slots, "\n    "), B_SLOT=lines(slot, b_slots, "\n    "),
        A_FIRST=lines(f"var ra$J = {a_first};", a_slots, "\n    "), B_FIRST=lines(f"var rb$J = {b_first};", b_slots, "\n    "),
        A_NEXT=lines(f"ra$J = {a_step};", a_slots, "\n        "), B_NEXT=lines(f"rb$J = {b_step};", b_slots, "\n        "),
        A_STORE=lines(a_store, a_slots, "\n        "), B_STORE=lines(b_store, b_slots, "\n        "),
        ACCS="\n    ".join(f"var {c} = vec4<f32>(0.0);" for c in accs), PRODUCTS="\n        ".join(products), STORES="\n".join(stores),
    )
    return head + extra + load.functions + ("" if load.a_k_quads else A_QUAD) + ("" if load.b_k_quads else B_QUAD) + body


# A product of at least WIDEN_MIN_ROWS rows and WIDEN_MIN_WORK multiply-adds (a prompt's) over
# 4-bit or f16 weights of at most WIDEN_MAX_BYTES as f32 first widens its weight to f32 in a scratch
# of the graph's (one dispatch computing the values the GEMM's loads would: the same sums), then
# runs the f32 weights' GEMM over it, where the dequantizing loads cost the template ~10%. H200,
# three rounds in one call, prompts of 512 / 2,047 tokens: Llama-3.2-1B 4w 15,094-15,218 /
# 15,925-15,970 -> 15,202-15,456 / 17,151-17,260 tokens/s, 8da4w (the GEMM reading int8 rows) +2% /
# +8%, fp16 (2 of its 16 layers) +5-10% / +15%. Widening every product from 256 rows cost SmolLM2's
# prompts of 512 tokens 4% (small products: the widening's dispatches), hence the work bound
# (results/h200/kernel_choices/widened_weights/).
WIDEN_MIN_ROWS, WIDEN_MIN_WORK = 256, 1 << 31
WIDEN_MAX_BYTES = 1 << 29
# Where the device has f16 matrices (OpBuilder.f16_matrices), a product of f16 rows over 4-bit
# weights widens them to f16 instead, each weight rounded once as eager dequantizes them, from
# MATRIX_MIN_ROWS rows whatever its size, and runs MATRIX_TILE over them (a column group's weights
# then one [N, K] matrix, no weight to pick per tile). H200, Dawn, Llama-3.2-1B 4w of f16
# activations, prompts of 512 / 2,047 tokens 20,635 / 23,874 tokens/s (wgpu-native's f32 tiles
# 15,339 / 16,964); MATRIX_TILE reading the 4-bit weights through its loads, dequantizing each
# step, 14,297 / 18,199 (results/h200/q4_f16_matrix_prompts/). Only weights whose loads read 4 of K
# a read do so since (scale groups not whole K steps of the matrices, or f32 scales): those read a
# column's step at a time (TileLoad.words) run MATRIX_TILE over the 4-bit weights themselves. H100,
# Dawn, Llama-3.2-1B 4w of f16 activations, rounds old / new / new / old in one call, prompts of 128
# / 512 / 2,047 tokens 9,441 / 22,767 / 29,061, 13,682-14,516 / 26,494-28,331 / 32,289-33,020,
# 9,120 / 22,830 / 29,575 tokens/s (results/h100/q4_f16_matrix_decode_rows/prompts_without_widening/).
HALF_WIDEN_MIN_ROWS, HALF_WIDEN_MIN_WORK = MATRIX_MIN_ROWS, 0
# The widening's workgroups: H200, the pass alone over the 1B's weights (16,384 x 2,048 / 3,072 x
# 2,048 / 2,048 x 8,192, 4-bit): 64 invocations 133.8 / 24.5 / 90.4 us, 256 55.3 / 13.5 / 31.1
# (2.7 TB/s of reads and writes), two quads an invocation no better (123.1 / 21.3 / 47.4)
WIDEN_WG = 256
WIDEN = """
$FLAT_INDEX
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg, ${WG}u);
    let quads = p.K / 4u;
    if (i >= p.N * quads) { return; }
    wide[i] = $READ(0u, i / quads, 4u * (i % quads), p.K);
}
"""
# b_k_quad's quad rounded to 4 halves in a vec2<u32>, as f16 storage holds them (the widening to f16)
B_K_HALVES_ROUNDED = """
fn b_k_halves(off: u32, n: u32, k: u32, kend: u32) -> vec2<u32> {
    let w = b_k_quad(off, n, k, kend);
    return vec2<u32>(pack2x16float(w.xy), pack2x16float(w.zw));
}
"""


def widen_shader(source, halves=False):
    """WIDEN over a WeightSource: its bindings, then `wide` (the weight [N, K] as f32 vec4s, or with
    `halves` as f16, 4 a vec2<u32>), P and its other uniforms."""
    n = len(source.inputs)
    lines = [STRUCT + ";", *(f"@group(0) @binding({i}) var<storage, read> {name}: array<{t}>;" for i, (name, t) in enumerate(source.inputs))]
    lines += [f"@group(0) @binding({n}) var<storage, read_write> wide: array<{vec4_type('f16' if halves else 'f32')}>;",
              f"@group(0) @binding({n + 1}) var<uniform> p: P;"]
    for j, (struct_text, declaration) in enumerate(source.uniforms):
        lines += [struct_text.strip().rstrip(";") + ";", f"@group(0) @binding({n + 2 + j}) var<uniform> {declaration};"]
    functions = source.functions + (B_K_HALVES_ROUNDED if halves else "")
    return "\n".join(lines) + "\n" + functions + fill(WIDEN, FLAT_INDEX=FLAT_INDEX, WG=WIDEN_WG, READ="b_k_halves" if halves else "b_k_quad")


# A reduce's entry point that sums two columns of a row at a time in split order, as GEMM_REDUCE
# does, stores both, then runs $FINISH on them (a in column c0, z in c1; pair i of p.M * np), for
# a caller's `finish` (GemmRoute) that writes more from the pair: a SwiGLU's gate and up, a RoPE's pair.
PAIR_REDUCE = """
$FLAT_INDEX
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg, ${WG}u);
    let np = p.N / 2u;  // a row's pairs
    if (i >= p.M * np) { return; }
    let total = p.M * p.N;
    let m = i / np;
    let c0 = $FIRST;
    let c1 = $SECOND;
    var a = 0.0;
    var z = 0.0;
    for (var s = 0u; s < p.splits; s = s + 1u) {
        a = a + part[s * total + m * p.N + c0];
        z = z + part[s * total + m * p.N + c1];
    }
    store(0u, m, c0, a);
    store(0u, m, c1, z);
$FINISH
}
"""


def pair_reduce(first, second, finish):
    """PAIR_REDUCE pairing column `first` with `second` (WGSL of i and np), then `finish`."""
    return fill(PAIR_REDUCE, FLAT_INDEX=FLAT_INDEX, WG=WG, FIRST=first, SECOND=second, FINISH=finish)


def gemm_reduce_shader(has_bias, bias="f32", out="f32", clamp=None, residual=False, store=None, extra="", activation=None, added=None,
                       row_scale=None, main=GEMM_REDUCE):
    """Split-K's reduce; `extra`: WGSL bindings after the uniform (those `store` writes, `added`,
    `row_scale`); `main`: its entry point (GEMM_REDUCE, or a caller's that writes more)."""
    head = header(has_bias, (("part", "f32"),), bias=bias, out=out, clamp=clamp, residual=residual, store=store, activation=activation,
                  added=added, row_scale=row_scale)
    return head + extra + main


def gemm_split(m, n, k, batch, tile=TILE, dequantizes=False):
    """(splits, K per split) of a product in `tile`s: more workgroups for a GPU a few tiles leave
    idle; `dequantizes`: its load dequantizes B (TileLoad.dequantizes)."""
    tiles = -(-n // tile.bn) * -(-m // tile.bm) * batch
    if tile.split_target:
        target, most = tile.split_target, MAX_SPLITS
    elif m <= (DEQUANTIZED_ROW_SPLIT_ROWS if dequantizes else ROW_SPLIT_ROWS):
        target, most = ROW_SPLIT_TARGET, ROW_MAX_SPLITS
    else:
        target, most = SPLIT_TARGET, MAX_SPLITS
    splits = max(1, min(most, target // tiles, k // MIN_SPLIT_K))
    step = MATRIX_STEP if tile.matrix else BK  # (the matrices' K loop: whole steps from each range's start)
    kspan = -(-k // splits // step) * step if splits > 1 else max(k, 1)
    return -(-k // kspan) if splits > 1 else 1, kspan


def gemm_grid(name, m, n, batch, splits=1, tile=TILE):
    """(N tiles, M tiles, batch * splits) in `tile`s; ValueError past the per-dimension workgroup limit."""
    grid = (-(-n // tile.bn), -(-m // tile.bm), batch * splits)
    if max(grid) > MAX_WORKGROUPS:
        raise ValueError(f"{name}: GEMM grid {grid} exceeds {MAX_WORKGROUPS} workgroups per dimension")
    return grid


def can_take_big_tile(most):
    """Whether a product of at most (N, K) = `most` takes BIG_TILE at some row count."""
    return takes_big_tile(math.inf, *most)


def gemm_scratch(b, outs, together=False, most=(0, 0)):
    """Split-K's scratch for an op whose products (run one after another; `together`: as one,
    column_group) write `outs`: room for the splits' sums of the largest (of all), at most
    SPLIT_TARGET of the largest tiles its products of at most (N, K) = `most` take, or
    ROW_SPLIT_TARGET of TILE's (gemm_split's bounds: to ROW_SPLIT_ROWS, one row of TILE's); OpBuilder.scratch."""
    sizes = [numel_of(b.graph.values[o].dims) for o in outs]
    total = sum(sizes) if together else max(sizes)
    tile = BIG_TILE if can_take_big_tile(most) else TILE
    most_sums = max(SPLIT_TARGET * tile.bm * tile.bn, ROW_SPLIT_TARGET * TILE.bm * TILE.bn)
    return b.scratch("float32", max(1, min(most_sums, ROW_MAX_SPLITS * total)))


class GemmRoute:
    """The GEMM route of one product: its dispatch, reading through `load`, and split-K's reduce
    over `scratch` (gemm_scratch); `extra` are bindings after the scratch (WGSL `extra_wgsl`);
    `clamp` the epilogue's (lo, hi) or None; `residual`, `store`, `activation`: header's;
    `more_outs`: outputs that `store` writes besides `out`, bound as out1, out2, ... (column_group);
    `added`: the tensor header's `added` adds, bound after them; `row_scale`: header's, bound
    last (a factor a row, as the dynamic-int8 products' activation scales); `small`: also the template in SMALL_TILE,
    which takes products of at most its rows (half the products of a 64-row tile for a ragged pass
    of 17 to 32 decode rows); `most`: the largest (N, K)
    the product takes, which builds BIG_TILE's dispatch where some row count would take it. A load
    without a per-invocation setup also takes BIG_TILE, and on GPUs MID_TILE (measured there; a CPU
    adapter compiles one tile less) and, if it dequantizes, WIDE_ROW_TILE; `tiles` maps each tile
    built to its dispatch, of which `tile` picks one by live shape (`tiles` given: only those). On
    GPUs a load with a `b_source` also builds the widening and the f32 weights' route (`route`), or
    over 4-bit weights of f16 rows where the device has f16 matrices, the f16 weights' on them.
    `finish`: (bindings, main, tensors): split-K's reduce runs the entry point `main` in place of
    GEMM_REDUCE, with `tensors` bound after its other bindings, `bindings(first)` their WGSL from
    binding `first` (a SwiGLU's gate | up columns gated in the reduce: fused_linear.py's
    swiglu_reduce; q/k/v columns rotated and cached: q4_fused_linear.py's rope_reduce)."""

    def __init__(self, b, load, inputs, bias, out, params, scratch, extra=(), extra_wgsl="", clamp=None, residual=False, store=None,
                 more_outs=(), small=False, most=(0, 0), activation=None, added=None, tiles=None, row_scale=None, finish=None):
        self.name = b.name
        tail = [bias] if bias is not None else []
        last = [added] if added is not None else []
        last += [row_scale] if row_scale is not None else []
        epilogue = {"bias": b.storage(bias) if tail else "f32", "out": b.storage(out), "clamp": clamp, "residual": residual, "store": store,
                    "activation": activation, "added": b.storage(added) if added is not None else None,
                    "row_scale": b.storage(row_scale) if row_scale is not None else None}

        def more(first):  # the bindings from `first` on: more_outs, then `added`, then `row_scale`
            outs = "".join(f"@group(0) @binding({first + j}) var<storage, read_write> out{j + 1}: array<{b.storage(o)}>;\n" for j, o in enumerate(more_outs))
            first += len(more_outs)
            outs += added_binding(first, b.storage(added)) if added is not None else ""
            at = first + (added is not None)
            return outs + (f"@group(0) @binding({at}) var<storage, read> row_scale: array<{b.storage(row_scale)}>;\n" if row_scale is not None else "")

        bindings = [*inputs, *tail, out, params, scratch, *extra, *more_outs, *last]
        extra_wgsl += more(len(inputs) + len(tail) + 3 + len(extra))
        halves = load.halves and b.half_sums and b.adapter != CPU
        shader = lambda tile: gemm_shader(load, bias is not None, extra_wgsl, tile=dataclasses.replace(tile, half=halves and tile in HALF_TILES), **epilogue)  # noqa: E731
        matrices = b.f16_matrices and bool(load.halves_functions) and not load.setup
        self.matrix_from = exact_rows(b, matrices) + 1  # the fewest rows the decode rows' matrix tiles take: past the subgroup kernels'
        if tiles is None:
            tiles = [TILE, *([SMALL_TILE] if small else []), *([MID_TILE] if not load.setup and b.adapter != CPU else [])]
            tiles += [BIG_TILE] if can_take_big_tile(most) and not load.setup else []
            tiles += [WIDE_ROW_TILE] if load.dequantizes and not load.setup and b.adapter != CPU and takes_wide_row_tile(TILE.bm, *most) else []
            if matrices:  # (4-bit weights read 4 of K a read: prompts over the weights widened to f16 first, below)
                tiles += [DECODE_MATRIX_TILE] + ([TINY_DECODE_MATRIX_TILE, SHORT_DECODE_MATRIX_TILE] if load.dequantizes else [])
                tiles += [WIDE_TINY_DECODE_MATRIX_TILE] if load.dequantizes and takes_wide_tiny_tile(most[0], load.weight_ends) else []
                tiles += [MATRIX_TILE] if load.words or not load.dequantizes else []
        self.tiles = {tile: b.dispatch(shader(tile), bindings) for tile in tiles}
        self.dequantizes, self.a_k_quads = load.dequantizes, load.a_k_quads
        # f16 weights (a WeightSource, not dequantized) of one product: a column group's (more_outs) load picks
        # its weight per column, which MID_TILE's loads took slower in a model's pass (the note at MID_TILE)
        self.f16 = load.b_source is not None and not load.dequantizes and not more_outs
        reduce_bindings = [scratch, *tail, out, params, *more_outs, *last]
        reduce_extra, main = more(len(tail) + 3), GEMM_REDUCE
        if finish is not None:
            declared, main, finished = finish
            reduce_extra += declared(len(reduce_bindings))
            reduce_bindings += finished
        self.reduce = b.dispatch(gemm_reduce_shader(bias is not None, extra=reduce_extra, main=main, **epilogue), reduce_bindings)
        self.finishing = finish is not None
        self.widened = None  # (the widening dispatch, the widened weights' route, (its least rows, its least work))
        source = load.b_source
        halves = b.f16_matrices and load.dequantizes and not load.words and source is not None and source.a == "f16"  # widened to f16, for MATRIX_TILE
        if source is not None and load.a_k_quads and b.adapter != CPU and (2 if halves else 4) * most[0] * most[1] <= WIDEN_MAX_BYTES and (halves or not matrices):
            assert len(inputs) == 1 + len(source.inputs) and len(extra) == len(source.uniforms), f"{self.name}: B's bindings are not the GEMM's"
            wide = b.scratch("float16" if halves else "float32", most[0] * most[1])
            widen = b.dispatch(widen_shader(source, halves), [*inputs[1:], wide, params, *extra])
            widened = float_load(True, source.a, "f16" if halves else "f32", k_quads=True, a_quads=True)
            tiles = [MATRIX_TILE] if halves else [MID_TILE, *([BIG_TILE] if can_take_big_tile(most) else [])]
            route = GemmRoute(b, widened, [inputs[0], wide], bias, out, params, scratch, clamp=clamp, residual=residual, store=store, more_outs=more_outs,
                              most=most, activation=activation, added=added, tiles=tiles, row_scale=row_scale, finish=finish)
            self.widened = (widen, route, (HALF_WIDEN_MIN_ROWS, HALF_WIDEN_MIN_WORK) if halves else (WIDEN_MIN_ROWS, WIDEN_MIN_WORK))

    def set(self, ctx, shape, on):
        """As a variant's route (kernels/variants.py), for a shape with m, n, k and batch."""
        splits, _ = self.plan(shape.m, shape.n, shape.k, shape.batch, on)
        self.set_grids(ctx, shape.m, shape.n, shape.k, shape.batch, splits, on)

    def route(self, m, n, k, batch=1):
        """The route of an M x N x K product: the widened weights' where it widens them, else this."""
        if self.widened is None or batch != 1:
            return self
        _, route, (rows, work) = self.widened
        return route if m >= rows and m * n * k >= work else self

    def takes(self, m, n, k):
        """Whether one of its tiles, or its widened weights' route, takes an M x N x K product (a
        route built with only some tiles takes the rest elsewhere)."""
        route = self.route(m, n, k)
        return route is not self or self.tile(m, n, k) in self.tiles

    def tile(self, m, n, k):
        if TINY_DECODE_MATRIX_TILE in self.tiles and self.matrix_from <= m <= TINY_DECODE_MATRIX_TILE.bm:
            return WIDE_TINY_DECODE_MATRIX_TILE if WIDE_TINY_DECODE_MATRIX_TILE in self.tiles else TINY_DECODE_MATRIX_TILE  # (built for its N)
        if SHORT_DECODE_MATRIX_TILE in self.tiles and self.matrix_from <= m <= SHORT_DECODE_MATRIX_TILE.bm:
            return SHORT_DECODE_MATRIX_TILE
        if DECODE_MATRIX_TILE in self.tiles and self.matrix_from <= m < MATRIX_MIN_ROWS:
            return DECODE_MATRIX_TILE
        if SMALL_TILE in self.tiles and m <= SMALL_TILE.bm:
            return SMALL_TILE
        if MATRIX_TILE in self.tiles and m >= MATRIX_MIN_ROWS:
            return MATRIX_TILE
        if BIG_TILE in self.tiles and takes_big_tile(m, n, k):
            return BIG_TILE
        if WIDE_ROW_TILE in self.tiles and takes_wide_row_tile(m, n, k):
            return WIDE_ROW_TILE
        return MID_TILE if MID_TILE in self.tiles and takes_mid_tile(m, n, self.dequantizes, k if self.f16 else 0) else TILE

    def plan(self, m, n, k, batch, on=True):
        """(splits, kspan) for the uniform; (1, K) when the route is off."""
        route = self.route(m, n, k, batch)
        return gemm_split(m, n, k, batch, route.tile(m, n, k), route.dequantizes) if on else (1, max(k, 1))

    def finishes(self, splits):
        """Whether a product of `splits` runs the reduce's `finish` (its tensor written)."""
        return self.finishing and splits > 1

    def set_grids(self, ctx, m, n, k, batch, splits, on=True):
        if on and self.a_k_quads and k % 4:
            raise ValueError(f"{self.name}: live K={k} is not a multiple of 4, as its largest K was (the GEMM reads its input 4 of K a load)")
        if self.widened is not None:
            widen, route, _ = self.widened
            widens = on and self.route(m, n, k, batch) is route
            ctx.set_grid(widen, flat_grid(n * k // 4, WIDEN_WG) if widens else (0, 0, 0))
            route.set_grids(ctx, m, n, k, batch, splits, widens)
            on = on and not widens
        tile = self.tile(m, n, k)
        for t, d in self.tiles.items():
            ctx.set_grid(d, gemm_grid(self.name, m, n, batch, splits, t) if on and tile == t else (0, 0, 0))
        ctx.set_grid(self.reduce, flat_grid(batch * m * n) if on and splits > 1 else (0, 0, 0))
