"""Dynamic-int8 x 4-bit products on subgroup matrices (tensor cores): the prompt route of
`et_vk.linear_dq8ca_q4gsw` (8da4w) where the device offers int8 matrix products (Dawn's
chromium_experimental_subgroup_matrix, INT8_MATRIX) and not f16 ones; where it offers those, the
prompts take them over the activations quantized here as halves (HALVES, below).

Two dispatches. QUANTIZE writes each activation once as int8, q = clamp(round(x / s) + zp), with
its row's scale and zero point (the GEMV's integer-exact division), four a 32-bit word. The
product then stages, each K step of 32, a tile of those words and a tile of weights widened from
nibbles to int8 in workgroup memory, and each subgroup multiplies TM x TN matrices of 16 x 16
with int32 sums. At the end of each scale group (gs a multiple of 32) the sums go through
workgroup memory to the lanes, which add

    ws[g, n] * (sum_k q[m, k] w[n, k] - zp[m] * sum_k w[n, k])

in f32: the zero point's share is exact in int32 (each lane sums its column's weights of the step
from the staged tile), so a group's sum is the integer sum of (q - zp) w, where the other routes
sum dequantized products in f32 (results agree within f32 rounding, not bit for bit). The output
is s[m] times that, through the plain op's epilogue (bias or residual).

A weight word holds k = 8w + j at bits 4j; it widens to the int8 words (k = 8w, 8w + 2, 8w + 4,
8w + 6) and (8w + 1, 8w + 3, ..): masks and a sign extension, no byte shuffles. QUANTIZE writes
the activations in that order, and a dot product does not care. Matrix loads of int8 count
offsets and strides in 32-bit words, offsets uniform across the workgroup; the lanes' share of a
stored 16 x 16 result assumes subgroups of 32.

H200, Dawn, 8da4w exports (results/h200/int8_matrix_prompts/): Llama-3.2-1B's prompts of 512 and
2,047 tokens 1.6x the dequantizing GEMM's (15,927 and 19,234 tokens/s against 10,117 and 12,427);
the kernel alone 34-48 TOPS on that shape's products, twice that without the fold. The fold every
group is what keeps it there: a subgroup holds 2 x 2 result matrices (16 KB of sums a workgroup),
where a GEMM without scales takes 4 x 4 (results/h100/int8_subgroup_matrix_gemm/).
"""

from pte_wgpu.resize.shapes import fold_grid, numel_of

from ..wgsl import fill, flat_grid

# The subgroup-matrix configuration these kernels use, as async_runtime's DeviceInfo lists them:
# (component, result, M, N, K, subgroup size).
INT8_MATRIX = ("i8", "i32", 16, 16, 32, 32)
STEP = 32  # K a matrix product takes: the staged tiles' step; K and the group size are whole steps
ROW = STEP // 4 + 4  # words a staged row takes: 8, then 4 of padding (rows 48 bytes apart)
# (subgroups along M, along N, matrices along M, along N) a workgroup takes: 64 x 64 outputs, 128
# invocations; the sums of 16 matrices go through 16 KB of workgroup memory each group.
SHAPE = (2, 2, 2, 2)

# a quad of K's activations an invocation, quantized with its row's scale and zero point, written by $WRITE
QUANTIZE = """
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let kw = q.K / 4u;
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= q.M * kw) { return; }
    let m = i / kw;
    let inv = div_rn(1.0, f32(xs[m]));
    let zp = zp_at(m);
$WRITE
}
"""
# ... as an int8 word
INT8_WORD = """    let k = 8u * ((i % kw) / 2u) + (i % 2u);  // this word's k, k + 2, k + 4, k + 6 (the module docstring)
    var word = 0u;
    for (var j = 0u; j < 4u; j = j + 1u) {
        let v = clamp(round(f32(x[m * q.K + k + 2u * j]) * inv) + zp, -128.0, 127.0);
        word = word | ((u32(i32(v)) & 0xFFu) << (8u * j));
    }
    out[i] = bitcast<i32>(word);"""

MATRIX_MAIN = """
@group(0) @binding(${WORDS}) var<storage, read> xw: array<vec4<i32>>;
var<workgroup> a_tile: array<i32, ${A_WORDS}>;
var<workgroup> b_tile: array<i32, ${B_WORDS}>;
var<workgroup> sums: array<i32, ${SUM_WORDS}>;

// 8 nibbles (each q + 8) as int8 q: the even k's word, then the odd k's
fn widen(word: u32) -> vec2<u32> {
    let e = (word & 0x0F0F0F0Fu) ^ 0x08080808u;
    let o = ((word >> 4u) & 0x0F0F0F0Fu) ^ 0x08080808u;
    return vec2<u32>(e | ((e & 0x08080808u) * 0x1Eu), o | ((o & 0x08080808u) * 0x1Eu));
}

@compute @workgroup_size(${THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let wg = wid.x + wid.y * nwg.x;
    let m0 = wid.z * ${BM}u;
    let n0 = wg * ${BN}u;
    if (n0 >= q.N) { return; }
    let sm = sg / ${SGN}u;
    let sn = sg % ${SGN}u;
    let a_at = sm * ${TM_ROWS}u;  // the subgroup's first row and column in the tiles
    let b_at = sn * ${TN_COLS}u;
    let lane_row = lane / 16u;  // a lane's elements of a stored 16 x 16: rows lane_row + 2t, column lane % 16
    let lane_col = lane % 16u;
    let mine = sg * ${SUMS_A_SUBGROUP}u;
    let kv = q.K / 16u;  // vec4s of a row of activation words
    // the step's global loads, a step ahead of the products: A row li / 2's half li % 2, B row li
    let a_row = li / 2u;
    let a_ok = li < ${A_THREADS}u && m0 + a_row < q.M;
    let a_from = (m0 + a_row) * kv + li % 2u;
    let b_ok = li < ${BN}u && n0 + li < q.N;
    let b_from = (n0 + li) * (q.wpr / 4u);
    var a_next = vec4<i32>(0);
    var b_next = vec4<u32>(0u);
    if (a_ok) { a_next = xw[a_from]; }
    if (b_ok) { b_next = wq4(b_from); }
$ACCS
    let steps = q.K / ${STEP}u;
    let group_steps = q.gs / ${STEP}u;
    for (var t = 0u; t < steps; t = t + 1u) {
        let k0 = t * ${STEP}u;
        if (t % group_steps != 0u) {
            workgroupBarrier();  // the last step's tiles are read (past a fold, its barrier saw to that)
        }
        if (li < ${A_THREADS}u) {
            let at = a_row * ${ROW}u + 4u * (li % 2u);
            a_tile[at] = a_next.x; a_tile[at + 1u] = a_next.y; a_tile[at + 2u] = a_next.z; a_tile[at + 3u] = a_next.w;
        }
        if (li < ${BN}u) {
            let at = li * ${ROW}u;
            let w0 = widen(b_next.x); let w1 = widen(b_next.y); let w2 = widen(b_next.z); let w3 = widen(b_next.w);
            b_tile[at] = bitcast<i32>(w0.x); b_tile[at + 1u] = bitcast<i32>(w0.y);
            b_tile[at + 2u] = bitcast<i32>(w1.x); b_tile[at + 3u] = bitcast<i32>(w1.y);
            b_tile[at + 4u] = bitcast<i32>(w2.x); b_tile[at + 5u] = bitcast<i32>(w2.y);
            b_tile[at + 6u] = bitcast<i32>(w3.x); b_tile[at + 7u] = bitcast<i32>(w3.y);
        }
        workgroupBarrier();
        if (t + 1u < steps) {
            if (a_ok) { a_next = xw[a_from + 2u * (t + 1u)]; }
            if (b_ok) { b_next = wq4(b_from + t + 1u); }
        }
        if (t % group_steps == 0u) {
$ZERO
        }
$LOADS
$PRODUCTS
$WSUMS
        if ((t + 1u) % group_steps == 0u || t + 1u == steps) {
$STORES
            workgroupBarrier();
            let g = min(k0 / q.gs, q.groups - 1u);
$FOLD
        }
    }
$OUT
}
"""


# Where the device multiplies f16 subgroup matrices, the prompts take them instead (q4_linear.py's
# Q4Product): QUANTIZE writes each activation's q - zp, an integer of at most 255 in
# magnitude and so exact in f16, 4 a vec2<u32> in the order of K; the GEMM's f16 tiles
# (f16_matrix.py) sum those times the 4-bit weights rounded once to f16 (as an fp16 export's
# products round them) in f32, and take the row's scale in their epilogue (GemmRoute's row_scale):
# no scale fold a group, where the int8 route's sums leave the matrices every 32 of K.
HALVES = """    let at = m * q.K + 4u * (i % kw);
    let v = vec4<f32>(f32(x[at]), f32(x[at + 1u]), f32(x[at + 2u]), f32(x[at + 3u]));
    let h = clamp(round(v * inv) + zp, vec4<f32>(-128.0), vec4<f32>(127.0)) - zp;
    out[i] = vec2<u32>(pack2x16float(h.xy), pack2x16float(h.zw));"""


def quantize_shader(head, halves=False):
    """QUANTIZE: `head` binds x, xs, xz, the words as `out` (i32; with `halves` vec2<u32>, 4
    halves) and q, with zp_at and div_rn."""
    return head + fill(QUANTIZE, WRITE=HALVES if halves else INT8_WORD)


def matrix_shader(head, words, shape=SHAPE):
    """The product: `head` is the plain op's bindings without x, its epilogue and dequantization
    helpers (q4_linear.py's, with dq8) and `wq4(i)`, the weights' vec4 of u32 i; `words` the
    binding of QUANTIZE's words; `shape` (SGM, SGN, TM, TN) as SHAPE."""
    sgm, sgn, tm, tn = shape
    bm, bn, threads = 16 * sgm * tm, 16 * sgn * tn, 32 * sgm * sgn
    assert 2 * bm <= threads and bn <= threads, shape  # one global vec4 an invocation a step
    tiles = [(i, j) for i in range(tm) for j in range(tn)]
    accs = [f"    var acc{i}_{j}_{t} = 0.0;" for i, j in tiles for t in range(8)]
    accs += [f"    var c{i}_{j} = subgroup_matrix_result<i32, 16, 16>();" for i, j in tiles]
    accs += [f"    var wsum{j} = 0;" for j in range(tn)]
    for i in range(tm):  # the zero points of a lane's rows
        for t in range(8):
            m = f"m0 + a_at + {16 * i + 2 * t}u + lane_row"
            accs.append(f"    let zp{i}_{t} = select(0, i32(zp_at({m})), {m} < q.M);")
    zero = [f"            c{i}_{j} = subgroup_matrix_result<i32, 16, 16>();" for i, j in tiles]
    zero += [f"            wsum{j} = 0;" for j in range(tn)]
    loads = [f"        let l{i} = subgroupMatrixLoad<subgroup_matrix_left<i8, 32, 16>, row_major>(&a_tile, (a_at + {16 * i}u) * {ROW}u, {ROW}u);" for i in range(tm)]
    loads += [f"        let r{j} = subgroupMatrixLoad<subgroup_matrix_right<i8, 16, 32>, col_major>(&b_tile, (b_at + {16 * j}u) * {ROW}u, {ROW}u);" for j in range(tn)]
    products = [f"        c{i}_{j} = subgroupMatrixMultiplyAccumulate(l{i}, r{j}, c{i}_{j});" for i, j in tiles]
    wsums = []  # each lane's column's weights of the step, summed (dot with four ones)
    for j in range(tn):
        words_of = " + ".join(f"dot4I8Packed(bitcast<u32>(b_tile[(b_at + {16 * j}u + lane_col) * {ROW}u + {w}u]), 0x01010101u)" for w in range(8))
        wsums.append(f"        wsum{j} = wsum{j} + {words_of};")
    stores = [f"            subgroupMatrixStore<row_major>(&sums, mine + {256 * (i * tn + j)}u, c{i}_{j}, 16u);" for i, j in tiles]
    fold = [f"            let scale{j} = wscale(k0, min(n0 + b_at + {16 * j}u + lane_col, q.N - 1u));" for j in range(tn)]
    for i, j in tiles:
        for t in range(8):
            at = f"mine + {256 * (i * tn + j) + 32 * t}u + lane"
            fold.append(f"            acc{i}_{j}_{t} = acc{i}_{j}_{t} + scale{j} * f32(sums[{at}] - zp{i}_{t} * wsum{j});")
    out = []
    for i, j in tiles:
        out.append(f"    {{ let n = n0 + b_at + {16 * j}u + lane_col;")
        for t in range(8):
            m = f"m0 + a_at + {16 * i + 2 * t}u + lane_row"
            out.append(f"      if ({m} < q.M && n < q.N) {{ out[({m}) * q.N + n] = epilogue(f32(xs[{m}]) * acc{i}_{j}_{t}, {m}, n); }}")
        out.append("    }")
    body = fill(
        MATRIX_MAIN, WORDS=words, A_WORDS=bm * ROW, B_WORDS=bn * ROW, SUM_WORDS=256 * len(tiles) * sgm * sgn, BM=bm, BN=bn,
        THREADS=threads, A_THREADS=2 * bm, SGN=sgn, TM_ROWS=16 * tm, TN_COLS=16 * tn, SUMS_A_SUBGROUP=256 * len(tiles), STEP=STEP,
        ROW=ROW, ACCS="\n".join(accs), ZERO="\n".join(zero), LOADS="\n".join(loads), PRODUCTS="\n".join(products),
        WSUMS="\n".join(wsums), STORES="\n".join(stores), FOLD="\n".join(fold), OUT="\n".join(out))
    return "enable chromium_experimental_subgroup_matrix;\n" + head + body


# Fewer tiles than this leave a large GPU idle where the GEMM splits K: the GEMM takes them. H200,
# SmolLM2 shape 8da4w (N = 576 and 1,536), every product on the matrices against this: prompts of 128
# and 256 tokens 8,906 / 17,854 against 13,988 / 23,345 tokens/s (the GEMM alone 11,686 / 23,217).
MIN_TILES = 128


def wide_enough(m, n, shape=SHAPE):
    """Whether an M x N product has tiles enough for the route (MIN_TILES)."""
    grid = matrix_grid(m, n, shape)
    return grid[0] * grid[1] * grid[2] >= MIN_TILES


def takes(gs, wpr):
    """Whether the route takes weights of group size `gs` and rows of `wpr` u32 words: whole
    matrix steps a group and a row (K is checked live: whole steps too)."""
    return gs % STEP == 0 and wpr % (STEP // 8) == 0


def words_scratch(b, x):
    """QUANTIZE's output for input `x` at its largest."""
    return b.scratch("int32", max(1, numel_of(b.graph.values[x].dims) // 4))


def halves_scratch(b, x):
    """QUANTIZE's halves for input `x` at its largest."""
    return b.scratch("float16", max(4, numel_of(b.graph.values[x].dims)))


def quantize_grid(m, k):
    return flat_grid(m * k // 4, 256)


def matrix_grid(m, n, shape=SHAPE):
    """Workgroups for M x N: output column tiles over x and y, row tiles along z."""
    sgm, sgn, tm, tn = shape
    return fold_grid(-(-n // (16 * sgn * tn)))[:2] + (-(-m // (16 * sgm * tm)),)
