"""int8 x int8 products with exact int32 sums in workgroup tiles: the q8ta convolutions of one
group as an implicit GEMM (kernels/quant/int8_conv.py) and the q8ta linears, on every adapter.

For image b, sums[b, m, n] = sum over k of (B[n, k] - zp) * A[m, k]: A the weights, one row an
output channel (as the partitioner stores them, K along the row), B the activations' operand
(im2col of the input for a convolution), with a zero point zp; both int8, read four a 32-bit word
(`a_pair(m, kw)`, `b_pair(b, n, kw)`: two words, elements 4kw .. 4kw + 7, zero past K). The tiles
sum B * A with dot4I8Packed and subtracts zp times the sum of A's row over the same K, so its
result is the integer sum the direct kernel takes (padding taps read as zp and add nothing),
exactly, in any order. The sums go to `parts` (i32), one slice a K split; the op's word kernel
adds the slices and finishes each output as the direct kernel does (scale, bias, requantize), so
an output is bitwise the direct kernel's. Where one split sums all of K and no output word
straddles two tiles, the product finishes its outputs itself (FINISH), with the word kernel's
arithmetic, and the word kernel does not run. The q8ta linears (kernels/quant/per_channel_linear.py)
take it too: B their input rows, read as int8 or quantized as they are read.

A workgroup of 256 invocations takes a TILE x TILE tile of outputs; each K step stages STEP values
of TILE rows of A and of B in workgroup memory, the next step's words loaded into registers while
the products run. The invocations that stage a row of A also sum its words (dot4I8Packed with
ones), added into the row's sum in workgroup memory at the end. The products, two ways:
- dot4I8Packed on every adapter: each invocation sums 4 x 4 outputs (rows ty + 16i, columns
  tx + 16j: a warp's reads of a staged row are 16 words ROW apart, on 16 banks);
- where the device offers int8 subgroup matrices (kernels/matmul/int8_matrix.py's INT8_MATRIX,
  Dawn on NVIDIA's tensor cores): each of the 8 subgroups multiplies one 16-row matrix of A by two
  16-column matrices of B a step, with int32 sums over all of K (no scales to fold: a q8ta
  product's scales are per output); the sums leave through workgroup memory at the end. Matrix
  loads want rows 16 bytes apart (MATRIX_ROW words).
Both take ~21 KB of workgroup memory (the tile's sums 16 KB): past WebGPU's default limit of 16 KB,
within what desktop and mobile GPUs and lavapipe offer (the runtime opens devices at the adapter's
limits).
"""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..wgsl import fill

TILE = 64  # outputs a workgroup along M and along N
STEP = 32  # K values a step stages: 8 words a row
ROW = STEP // 4 + 1  # words a staged row takes (8, then 1 of padding: rows on distinct banks)
MATRIX_ROW = STEP // 4 + 4  # ... for matrix loads: 48 bytes
# Split K while a product has fewer than SPLIT_TARGET workgroups (ResNet's last stage at batch 1:
# 512 channels of 7 x 7 pixels, 8 tiles over K = 4,608), into at most MAX_SPLITS ranges of at
# least MIN_SPLIT_K.
SPLIT_TARGET, MAX_SPLITS, MIN_SPLIT_K = 256, 16, 256

# M, N, K, batch, K span a split (a multiple of STEP), splits, the zero point, the weight rows'
# words (A's), whether the product finishes the outputs itself (`finishes`), then the caller's
FIELDS = "M: u32, N: u32, K: u32, batch: u32, kspan: u32, splits: u32, zp: i32, row_words: u32, finish: u32"
FORMAT = "<6Ii2I"

# A: the int8 weight `w` as the partitioner stores it, a row of g.row_words words an output, read
# as zeros past K (a row's padding)
WEIGHT_ROWS = """
fn a_word(m: u32, kw: u32) -> u32 {
    let k = 4u * kw;
    if (m >= g.M || k >= g.K) { return 0u; }
    let word = w[m * g.row_words + kw];
    return select(word & ((1u << (8u * (g.K - k))) - 1u), word, g.K - k >= 4u);
}
fn a_pair(m: u32, kw: u32) -> vec2<u32> { return vec2<u32>(a_word(m, kw), a_word(m, kw + 1u)); }
"""

PRODUCT = """
const ONES = 0x01010101u;
var<workgroup> As: array<${T}, ${A_WORDS}>;
var<workgroup> Bs: array<${T}, ${A_WORDS}>;
var<workgroup> row_sums: array<atomic<i32>, ${TILE}>;
var<workgroup> sums: array<i32, ${SUMS}>;  // the tile's sums, [TILE][TILE]
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32$BUILTINS) {
    let b = wid.z / g.splits;
    let split = wid.z % g.splits;
    let m0 = wid.y * ${TILE}u;
    let n0 = wid.x * ${TILE}u;
    let tx = li % 16u;
    let ty = li / 16u;
    let lr = li / 4u;  // the row of A and of B this invocation stages, and its two words of a step
    let lw = 2u * (li % 4u);
    let kw_beg = split * (g.kspan / 4u);
    let kw_end = min((g.K + 3u) / 4u, kw_beg + g.kspan / 4u);
    if (li < ${TILE}u) { atomicStore(&row_sums[li], 0); }
$SETUP
    var a = a_pair(m0 + lr, kw_beg + lw);
    var bw = b_pair(b, n0 + lr, kw_beg + lw);
    var row_sum = 0;
$ACCS
    for (var kw0 = kw_beg; kw0 < kw_end; kw0 = kw0 + ${STEP_WORDS}u) {
        As[lr * ${ROW}u + lw] = ${T}(a.x);
        As[lr * ${ROW}u + lw + 1u] = ${T}(a.y);
        Bs[lr * ${ROW}u + lw] = ${T}(bw.x);
        Bs[lr * ${ROW}u + lw + 1u] = ${T}(bw.y);
        row_sum = row_sum + dot4I8Packed(a.x, ONES) + dot4I8Packed(a.y, ONES);
        workgroupBarrier();
        if (kw0 + ${STEP_WORDS}u < kw_end) {
            a = a_pair(m0 + lr, kw0 + ${STEP_WORDS}u + lw);
            bw = b_pair(b, n0 + lr, kw0 + ${STEP_WORDS}u + lw);
        }
$PRODUCTS
        workgroupBarrier();
    }
    atomicAdd(&row_sums[lr], row_sum);
    let total = g.batch * g.M * g.N;
$TO_SUMS
    workgroupBarrier();
    if (g.finish == 0u) {  // each invocation stores outputs li, li + 256, .. (neighbours along N)
        for (var t = li; t < ${SUMS}u; t = t + 256u) {
            let m = m0 + t / ${TILE}u;
            let n = n0 + t % ${TILE}u;
            if (m < g.M && n < g.N) {
                parts[split * total + part_index(b, m, n)] = sums[t] - g.zp * atomicLoad(&row_sums[t / ${TILE}u]);
            }
        }
    }$FINISH
}
"""
# With `finishes`, where g.finish (one K split, output words along N that no tile boundary cuts):
# each invocation finishes whole 8-bit output words, 4 neighbours along N, through the caller's
# `finish(sum, e)`, as its word kernel would
FINISH = """ else {
        for (var t = li; t < ${SUMS}u / 4u; t = t + 256u) {
            let ml = t / (${TILE}u / 4u);
            let nl = 4u * (t % (${TILE}u / 4u));
            if (m0 + ml < g.M && n0 + nl < g.N) {
                let e = part_index(b, m0 + ml, n0 + nl);
                let zp_sum = g.zp * atomicLoad(&row_sums[ml]);
                var word = 0u;
                for (var j = 0u; j < 4u; j = j + 1u) {
                    word = word | ((u32(finish(sums[ml * ${TILE}u + nl + j] - zp_sum, e + j)) & 0xFFu) << (8u * j));
                }
                out[e / 4u] = word;
            }
        }
    }"""


def _dot_products():
    """(accumulators, a step's products, the sums into workgroup memory) of the dot4I8Packed way."""
    accs = [f"    var c{i}{j} = 0;" for i in range(4) for j in range(4)]
    products = []
    for w in range(STEP // 4):
        loads = [f"let x{i} = As[(ty + {16 * i}u) * {ROW}u + {w}u];" for i in range(4)]
        loads += [f"let y{j} = Bs[(tx + {16 * j}u) * {ROW}u + {w}u];" for j in range(4)]
        sums = [f"c{i}{j} = c{i}{j} + dot4I8Packed(x{i}, y{j});" for i in range(4) for j in range(4)]
        products.append("        { " + " ".join(loads + sums) + " }")
    to_sums = [f"    sums[(ty + {16 * i}u) * {TILE}u + tx + {16 * j}u] = c{i}{j};" for i in range(4) for j in range(4)]
    return accs, products, to_sums


# The matrix way's sums: each subgroup's two result matrices
MATRIX_TO_SUMS = """
    let sums_at = 16u * (sg / 2u) * ${TILE}u + 32u * (sg % 2u);
    subgroupMatrixStore<row_major>(&sums, sums_at, c0, ${TILE}u);
    subgroupMatrixStore<row_major>(&sums, sums_at + 16u, c1, ${TILE}u);"""


def _matrix_products():
    """(accumulators, a step's products, the sums into workgroup memory) of the subgroup-matrix way:
    subgroup sg takes rows 16 (sg / 2) and columns 32 (sg % 2) .. + 31 of the tile."""
    accs = ["    var c0 = subgroup_matrix_result<i32, 16, 16>();", "    var c1 = subgroup_matrix_result<i32, 16, 16>();"]
    left = f"subgroupMatrixLoad<subgroup_matrix_left<i8, {STEP}, 16>, row_major>(&As, 16u * (sg / 2u) * {MATRIX_ROW}u, {MATRIX_ROW}u)"
    right = [
        f"subgroupMatrixLoad<subgroup_matrix_right<i8, 16, {STEP}>, col_major>(&Bs, (32u * (sg % 2u) + {16 * j}u) * {MATRIX_ROW}u, {MATRIX_ROW}u)"
        for j in range(2)
    ]
    products = [
        f"        {{ let l = {left}; let r0 = {right[0]}; let r1 = {right[1]};",
        "          c0 = subgroupMatrixMultiplyAccumulate(l, r0, c0); c1 = subgroupMatrixMultiplyAccumulate(l, r1, c1); }",
    ]
    return accs, products, [fill(MATRIX_TO_SUMS, TILE=TILE)]


def product_shader(head, setup="", matrices=False, finishes=False):
    """The tiled product: `head` declares the uniform `g` (a struct starting with FIELDS), the
    operands' bindings and `a_pair`, `b_pair` (and what they use), `part_index(b, m, n)` (an
    output's index in a slice of `parts`) and `parts`, a read_write array<i32>; `setup` runs once
    per invocation before the first load, knowing n0 + lr, the column of B it stages; `matrices`:
    the products on int8 subgroup matrices (the module docstring); `finishes`: `head` also
    declares `finish(sum: i32, e: u32) -> i32` and the 8-bit output `out` (array<u32>), FINISH's."""
    accs, products, to_sums = _matrix_products() if matrices else _dot_products()
    body = fill(
        PRODUCT, T="i32" if matrices else "u32", A_WORDS=TILE * (MATRIX_ROW if matrices else ROW), TILE=TILE,
        ROW=MATRIX_ROW if matrices else ROW, STEP_WORDS=STEP // 4, SETUP=setup, ACCS="\n".join(accs),
        PRODUCTS="\n".join(products), TO_SUMS="\n".join(to_sums), SUMS=TILE * TILE,
        FINISH=fill(FINISH, TILE=TILE, SUMS=TILE * TILE) if finishes else "",
        BUILTINS=", @builtin(subgroup_id) sg: u32" if matrices else "",
    )
    return ("enable chromium_experimental_subgroup_matrix;\n" if matrices else "") + head + body


def split(m, n, k, batch):
    """(splits, K span a split) of an M x N x K product over `batch` images."""
    tiles = max(1, -(-m // TILE) * -(-n // TILE) * batch)
    splits = max(1, min(MAX_SPLITS, SPLIT_TARGET // tiles, k // MIN_SPLIT_K))
    kspan = -(-k // splits // STEP) * STEP
    return -(-k // kspan), kspan


def takes(row):
    """Whether weight rows of `row` int8 values are whole words (WEIGHT_ROWS)."""
    return row % 4 == 0


def params(m, n, k, batch, zp, row, words_along_n=False):
    """(the uniform's FIELDS for weight rows of `row` values, the splits, whether the product
    finishes the outputs itself: one split, and `words_along_n` (the caller's 8-bit output words
    are 4 neighbours along N) with N a multiple of 4, so that no word straddles two tiles)."""
    splits, kspan = split(m, n, k, batch)
    finish = splits == 1 and words_along_n and n % 4 == 0
    return struct.pack(FORMAT, m, n, k, batch, kspan, splits, zp, row // 4, finish), splits, finish


def grid(m, n, batch, splits):
    return (-(-n // TILE), -(-m // TILE), batch * splits)


def parts_scratch(b, out):
    """The products' sums for output `out` at its largest: a slice an output while it has tiles
    enough, else at most SPLIT_TARGET tiles' outputs a split (`split`)."""
    total = numel_of(b.graph.values[out].dims)
    return b.scratch("int32", max(1, min(MAX_SPLITS * total, max(total, SPLIT_TARGET * TILE * TILE))))
