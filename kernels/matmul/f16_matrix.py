"""Products of f16 operands on subgroup matrices (tensor cores): GemmRoute's MATRIX_TILE, for a
device that offers f16 x f16 -> f32 products of 16 x 16 x 16 (F16_MATRIX; Dawn's
chromium_experimental_subgroup_matrix, which lists them on NVIDIA with the toggle
vulkan_enable_f16_on_nvidia, async_runtime/backend.py): f16 rows by f16 weights, or by 4-bit
weights, which GemmRoute widens to f16 first for prompts and which the decode rows' tiles
dequantize as they read them (each weight rounded to f16 once, as eager dequantizes it).

A workgroup of subgroups takes a tile of outputs, each subgroup some result matrices of 16 x 16
with f32 sums (tile_size; gemm.py's MATRIX_TILE: 2 x 2 subgroups of 4 x 4, 128 x 128 for prompts;
its DECODE_MATRIX_TILE: 1 x 4 of 4 x 2, 64 x 128 for fewer rows). Each K step of 32 its
invocations read the A rows and B columns through the product's TileLoad (a_k_halves,
b_k_halves: 4 halves of K a load, as stored), two steps ahead in registers (4-bit words one),
into double-buffered workgroup memory; the subgroups then multiply 16 of K at a time. The sums
leave the matrices through workgroup memory, a result matrix at a time, to the lanes, which
write them through the template's epilogue (`store`) or, with K split, into split-K's scratch;
a decode tile stores only the result matrices that hold live rows, split-K's whole ones
straight into the scratch. The products are the f16 products of the stored operands summed in
f32, as the GEMM's f32 sums of the same halves, in another order.

H200, Dawn, robustness on (results/h200/f16_subgroup_matrix_gemm/): the tile alone 47-68 TFLOP/s
on Llama-3.2-1B's prompt products (Dawn's f32 tiles 16-29 on the same operands; the GEMM's best
on wgpu-native 41 at 4096^3), the 1B fp16's prompts of 512 / 2,047 tokens 1.35x / 1.53x
wgpu-native's; without it (the runtime's default since, async_runtime/backend.py) 1.77x / 2.02x.
Reading the operands as f32 quads halved the tile; a column group picking its weight each load
cost it 2-3x.
"""

from ..wgsl import TILE_ORIGIN, fill

# The subgroup-matrix configuration this kernel uses, as async_runtime's DeviceInfo lists them:
# (component, result, M, N, K, subgroup size).
F16_MATRIX = ("f16", "f32", 16, 16, 16, 32)
STEP = 32  # K a step stages
ROW = STEP + 8  # halves a staged row takes: the step, then 8 of padding (rows 80 bytes apart)
QUADS = STEP // 4  # K quads of a staged row


def tile_size(shape):
    """(rows, columns) of the tile of `shape` = (subgroups along M, along N, result matrices a
    subgroup takes along M, along N)."""
    sgm, sgn, tm, tn = shape
    return 16 * sgm * tm, 16 * sgn * tn


MAIN = """
var<workgroup> a_tile: array<f16, ${A_HALVES}>;  // two buffers of [${BM} rows][${ROW}]
var<workgroup> b_tile: array<f16, ${B_HALVES}>;  // two buffers of [${BN} columns][${ROW}]
var<workgroup> sums: array<f32, ${SUMS}>;  // a 16 x 16 result matrix a subgroup, on its way out

@compute @workgroup_size(${THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
$ORIGIN
    let a_at = (sg / ${SGN}u) * ${TM_ROWS}u;  // this subgroup's first row and column in the tile
    let b_at = (sg % ${SGN}u) * ${TN_COLS}u;
$ACCS
$LOOPS
    let total = p.batch * p.M * p.N;
    let mine = sg * 256u;
$STORES
}
"""

# the K loop: its A and B quads read one step ahead ($FIRST, $NEXT), kept in workgroup memory ($KEEP);
# or two ahead ($SECOND the step after the first, $NEXT the one after that into registers of its own,
# $ROLL moving them on after $KEEP), so that a step's loads have two steps' products and barriers to
# arrive in, where one step of a few products gave them little more than their latency (f16 weights)
LOOP = """$FIRST
    var buf = 0u;
$KEEP
$SECOND
    workgroupBarrier();
    for (var k0 = kbeg; k0 < kend; k0 = k0 + ${STEP}u) {
$NEXT
        let a_buf = buf * ${A_BUF}u + a_at * ${ROW}u;
        let b_buf = buf * ${B_BUF}u + b_at * ${ROW}u;
        for (var kk = 0u; kk < ${STEP}u; kk = kk + 16u) {
$PRODUCTS
        }
        buf = 1u - buf;
        if (k0 + ${STEP}u < kend) {
$KEEP
        }
$ROLL
        workgroupBarrier();
    }"""

# each lane's 8 elements of a result matrix in `sums`, written out
STORE_MATRIX = """    subgroupMatrixStore<row_major>(&sums, mine, c${I}_${J}, 16u);
    workgroupBarrier();
    for (var t = 0u; t < 8u; t = t + 1u) {
        let e = lane + 32u * t;
        let m = m0 + a_at + ${I16}u + e / 16u;
        let n = n0 + b_at + ${J16}u + e % 16u;
        if (m < p.M && n < p.N) {
            if (p.splits == 1u) {
                store(b, m, n, sums[mine + e]);
            } else {
                part[split * total + (b * p.M + m) * p.N + n] = sums[mine + e];
            }
        }
    }
    workgroupBarrier();"""


# a whole result matrix of split-K's sums straight into the scratch, rows p.N apart: where its 16 rows
# are live and the tile's columns whole, so it writes nothing of another batch's, split's or tile's,
# and N a multiple of 4 (Vulkan's cooperative-matrix stores: address and stride 16-byte aligned)
DIRECT_STORE = """        subgroupMatrixStore<row_major>(&part, split * total + (b * p.M + m0 + ${I16}u) * p.N + n0 + b_at + ${J16}u, c${I}_${J}, p.N);"""


# A word of a 4-bit weight's column step (word V % 4 of the step's column V / 4: 8 nibbles, n - 8 the
# weight before its scale) into halves: two neighbouring nibbles at a time, moved 16 bits apart, as the
# mantissas of 1024 + n (f16 0x6400 | n), less 1032, times the f16 scale: exact but for the one
# rounding of the product, as eager dequantizes (and as pack2x16float of the f32 product rounds).
# The word's 8 halves go to the tile in order, where nibbles j and j + 4 paired (one shift a pair)
# went to places 4 apart: H100, Dawn, Llama-3.2-1B 4w of f16 activations loaded with
# batch_invariant=False, greedy bursts, rounds old / new / new / old in one call, 16 / 32 / 64
# streams 5,055 / 9,556 / 14,832, 5,428 / 10,165 / 15,854, 5,435 / 10,189 / 15,845, 5,002 / 9,514 /
# 14,723 tokens/s, prompts of 512 / 2,047 tokens 27,396-28,125 / 35,608-35,688 -> 34,441-34,846 /
# 37,901-38,011 (results/h100/q4_word_halves_in_order/).
B_WORD_KEEP = """    { let s = vec2<f16>(f16(${S})); let at = buf * ${B_BUF}u + (${V} / 4u) * ${ROW}u + 8u * (${V} % 4u); let w = ${W};
      let h0 = (bitcast<vec2<f16>>((w & 0x0000000Fu) | ((w << 12u) & 0x000F0000u) | 0x64006400u) - vec2<f16>(1032.0h)) * s;
      let h1 = (bitcast<vec2<f16>>(((w >> 8u) & 0x0000000Fu) | ((w << 4u) & 0x000F0000u) | 0x64006400u) - vec2<f16>(1032.0h)) * s;
      let h2 = (bitcast<vec2<f16>>(((w >> 16u) & 0x0000000Fu) | ((w >> 4u) & 0x000F0000u) | 0x64006400u) - vec2<f16>(1032.0h)) * s;
      let h3 = (bitcast<vec2<f16>>(((w >> 24u) & 0x0000000Fu) | ((w >> 12u) & 0x000F0000u) | 0x64006400u) - vec2<f16>(1032.0h)) * s;
      b_tile[at] = h0.x; b_tile[at + 1u] = h0.y; b_tile[at + 2u] = h1.x; b_tile[at + 3u] = h1.y;
      b_tile[at + 4u] = h2.x; b_tile[at + 5u] = h2.y; b_tile[at + 6u] = h3.x; b_tile[at + 7u] = h3.y; }"""
# ... and of f32 scales: each weight (n - 8) * s in f32 (exact), rounded once to f16, as the widening to f16 rounds it
B_WORD_KEEP_F32 = """    { let s = ${S}; let at = buf * ${B_BUF}u + (${V} / 4u) * ${ROW}u + 8u * (${V} % 4u); let w = vec4<u32>(${W});
      let lo = vec4<f16>((vec4<f32>((w >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - vec4<f32>(8.0)) * s);
      let hi = vec4<f16>((vec4<f32>((w >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) - vec4<f32>(8.0)) * s);
      b_tile[at] = lo.x; b_tile[at + 1u] = lo.y; b_tile[at + 2u] = lo.z; b_tile[at + 3u] = lo.w;
      b_tile[at + 4u] = hi.x; b_tile[at + 5u] = hi.y; b_tile[at + 6u] = hi.z; b_tile[at + 7u] = hi.w; }"""


def matrix_body(shape, weight_ends=(), words=False, word_scales="f16"):
    """The kernel of a tile of `shape` (tile_size) after the template's header and the load's
    halves_functions (a_k_halves, b_k_halves; with `weight_ends`, the column group's weights' last
    columns, each but the last a whole number of tiles, also b_k_halves_j of its weight j: each
    tile then reads one weight, its K loop written once a weight, where b_k_halves picks a weight
    each load, 3x slower on an H200). With `words` (4-bit weights, TileLoad.words) B's invocations
    each take a word of a column's step of 32, a column's 4 words side by side: b_word (b_word_j) and
    b_words_scale (b_words_scale_j) the step's one scale, dequantized into the tile as B_WORD_KEEP does
    (B_WORD_KEEP_F32 where `word_scales` are f32); each K
    range starts a whole step in (gemm_split)."""
    sgm, sgn, tm, tn = shape
    bm, bn = tile_size(shape)
    threads = 32 * sgm * sgn
    a_loads, b_loads = bm * QUADS // threads, bn * QUADS // threads  # quads an invocation loads a step
    assert a_loads * threads == bm * QUADS and b_loads * threads == bn * QUADS, f"{shape}: its invocations do not load whole K steps"
    b_columns = bn // threads  # with `words`: columns an invocation loads a step
    assert not words or b_columns * threads == bn, f"{shape}: its invocations do not load whole columns"
    tiles = [(i, j) for i in range(tm) for j in range(tn)]
    products = [f"            let l{i} = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>(&a_tile, a_buf + {16 * i * ROW}u + kk, {ROW}u);"
                for i in range(tm)]
    products += [f"            let r{j} = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, col_major>(&b_tile, b_buf + {16 * j * ROW}u + kk, {ROW}u);"
                 for j in range(tn)]
    products += [f"            c{i}_{j} = subgroupMatrixMultiplyAccumulate(l{i}, r{j}, c{i}_{j});" for i, j in tiles]

    def loop(suffix):  # the K loop reading B through its readers of that suffix ("_j": weight j's alone)
        first, second, next_, keep, roll = [], [], [], [], []
        # K steps the loads run ahead: two for halves (a 16-row fp16 decode pass -12%, the 1B fp16's prompts of 512
        # tokens +17-27%, results/h100/f16_decode_tile_probes/, f16_prompt_tile_probes/), one for 4-bit words (8-10%
        # slower at two in decode tiles)
        ahead = 1 if words else 2
        sides = [("a", "a_k_halves", "aoff", "m0", a_loads, bm * ROW)] + ([] if words else [("b", f"b_k_halves{suffix}", "boff", "n0", b_loads, bn * ROW)])
        for i in range(4 * b_columns if words else 0):  # a word of a column's step an invocation, a column's 4 side by side
            v = f"({i}u * {threads}u + li)"
            for reads, k in ((first, "kbeg"), (next_, f"k0 + {STEP}u")):
                word = f"b_word{suffix}(boff, n0 + {v} / 4u, {k} + 8u * ({v} % 4u))"
                scale = f"b_words_scale{suffix}(n0 + {v} / 4u, {k})"
                reads.append(f"    var bw{i} = {word}; var bs{i} = {scale};" if reads is first else f"        bw{i} = {word}; bs{i} = {scale};")
            keep.append(fill(B_WORD_KEEP_F32 if word_scales == "f32" else B_WORD_KEEP, S=f"bs{i}", W=f"bw{i}", V=v, B_BUF=bn * ROW, ROW=ROW))
        for x, fn, off, base, loads, buf in sides:
            tile = f"{x}_tile"
            for i in range(loads):
                v = f"({i}u * {threads}u + li)"  # the step's quad v: row (or column) v / QUADS, K quad v % QUADS
                read = lambda k: f"{fn}({off}, {base} + {v} / {QUADS}u, {k} + 4u * ({v} % {QUADS}u), kend)"  # noqa: E731  (quad v of the step from K k)
                first.append(f"    var {x}q{i} = {read('kbeg')};")
                if ahead == 2:
                    second.append(f"    {x}q{i} = {read(f'kbeg + {STEP}u')};")
                    next_.append(f"        let {x}q{i}n = {read(f'k0 + {2 * STEP}u')};")
                    roll.append(f"        {x}q{i} = {x}q{i}n;")
                else:
                    next_.append(f"        {x}q{i} = {read(f'k0 + {STEP}u')};")
                at = f"buf * {buf}u + ({v} / {QUADS}u) * {ROW}u + 4u * ({v} % {QUADS}u)"
                pairs = f"let lo = bitcast<vec2<f16>>({x}q{i}.x); let hi = bitcast<vec2<f16>>({x}q{i}.y);"
                keep.append(f"    {{ let at = {at}; {pairs} {tile}[at] = lo.x; {tile}[at + 1u] = lo.y; {tile}[at + 2u] = hi.x; {tile}[at + 3u] = hi.y; }}")
        return fill(LOOP, STEP=STEP, A_BUF=bm * ROW, B_BUF=bn * ROW, ROW=ROW, FIRST="\n".join(first), SECOND="\n".join(second), NEXT="\n".join(next_), KEEP="\n".join(keep), ROLL="\n".join(roll),
                    PRODUCTS="\n".join(products))

    if weight_ends:
        branches = [f"if (n0 < {e}u) {{\n{loop(f'_{j}')}\n    }}" for j, e in enumerate(weight_ends[:-1])]
        loops = "    " + " else ".join([*branches, f"{{\n{loop(f'_{len(weight_ends) - 1}')}\n    }}"])
    else:
        loops = loop("")
    # with one subgroup along M, whether result matrices i hold live rows is uniform: a pass of fewer rows
    # than the tile's stores only those (at 16 rows 2 of the 64-row tile's 8, each store two barriers;
    # the products stay unguarded, a branch around them made the NVIDIA compiler's loop 1.5x slower),
    # and split-K's whole matrices go straight to the scratch, no barrier (DIRECT_STORE)
    stores = [f"    let direct = p.splits > 1u && n0 + {bn}u <= p.N && p.N % 4u == 0u;"] if sgm == 1 else []
    for i in range(tm):
        row = [fill(STORE_MATRIX, I=i, J=j, I16=16 * i, J16=16 * j) for j in range(tn)]
        if sgm == 1:
            direct = [fill(DIRECT_STORE, I=i, J=j, I16=16 * i, J16=16 * j) for j in range(tn)]
            live = "" if i == 0 else f" if (m0 + {16 * i}u < p.M)"
            row = [f"    if (direct && m0 + {16 * i + 16}u <= p.M) {{", *direct, f"    }} else{live} {{", *row, "    }"]
        stores += row
    return fill(
        MAIN, ORIGIN=fill(TILE_ORIGIN, BM=bm, BN=bn), A_HALVES=2 * bm * ROW, B_HALVES=2 * bn * ROW, SUMS=256 * sgm * sgn, BM=bm, BN=bn, ROW=ROW, THREADS=threads, SGN=sgn,
        TM_ROWS=16 * tm, TN_COLS=16 * tn, ACCS="\n".join(f"    var c{i}_{j} = subgroup_matrix_result<f32, 16, 16>();" for i, j in tiles),
        LOOPS=loops, STORES="\n".join(stores),
    )
