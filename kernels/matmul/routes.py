"""Which route takes a product's rows: the row counts where the GEMV, the subgroup kernels and the
GEMM take over, on GPUs and on CPU adapters, and how many rows a fused linear normalizes itself.

A route is chosen in the hook by the live row count M (kernels/variants.py): up to a route's rows
its kernel runs, past them the next. What every route keeps: a pass of at most BITWISE_ROWS rows
gives each row the bits it gets alone (a ragged pass of several sessions is bitwise each alone),
but for a model loaded with batch_invariant=False, whose products on f16 tensor cores keep it to
exact_rows' rows.
"""

from ..variants import CPU

# Up to this many rows, a product with an [N, K] weight runs the GEMV for every row: a 64x64 GEMM
# tile row leaves most of a large GPU idle for a few rows (a ragged decode pass of several
# sessions). A workgroup loads its 4 weight rows once for a group of input rows (linear.py's
# GEMV_GROUP_ROWS), and sums each row in the same order as a single-row GEMV: bitwise what the
# row gets alone. Side by side on an H100 (16 and 32 SmolLM2-size sessions, two runs each): 8
# rows per group with one accumulator variable per row decoded 6-16% faster than one row per
# workgroup. (An accumulator array indexed in a loop was 7-13% slower than one row on an H200:
# spills.)
GEMV_MAX_ROWS = 32
Q4_GEMV_MAX_ROWS = 64  # the 4-bit GEMV (q4_linear.py), four rows a workgroup past 32
# ... but only BITWISE_ROWS for 4-bit weights of K >= Q4_GEMM_MIN_K (models from 1B parameters up),
# past which the dequantizing GEMM, which reads a weight once, not once per 2 or 4 input rows:
# such weights do not stay in the L2 cache between the GEMV's row groups. H100, Llama-3.2-1B
# shape 4w (K = 2,048 and 8,192), per-dispatch profile at 64 rows: the fused SwiGLU GEMV 931 us
# (25 GB/s) against 157 us at one row; greedy bursts, two rounds in one call, GEMV to 64 rows
# against this: 32 streams 2,088 / 2,084 -> 2,889 / 2,887 tokens/s, 64 streams 2,200 / 2,204 ->
# 5,482 / 5,431 (results/h100/kernel_choices/q4_gemm_past_16_rows/).
Q4_GEMM_MIN_K = 2048


def q4_wide(k):
    """Whether 4-bit weights of K = k take the dequantizing GEMM past BITWISE_ROWS rows; K counted
    in whole words of 8 weights, as the GEMV's routes (q4_linear.py's gemv_routes) see it."""
    return 8 * -(-k // 8) >= Q4_GEMM_MIN_K


def q4_gemv_rows(k):
    """The most rows the 4-bit GEMVs take for weights of K = k (more: the dequantizing GEMM)."""
    return BITWISE_ROWS if q4_wide(k) else Q4_GEMV_MAX_ROWS

# GPUs with subgroups take the CPU adapters' subgroup kernel (linear.py) for a ragged pass of
# SG_GPU_ROWS rows (several decode sessions, a cached prompt's rest): the fused q/k/v and SwiGLU
# products (fused_linear.py) and the plain and residual float linears narrower than an LM head
# (4-bit ones for Q4_SG_GPU_ROWS, below). Lanes along K and
# a subgroupAdd, where the GEMV reduces 576-long rows across 256 invocations through workgroup
# memory, ~9 barriers a row. H100, SmolLM2 shape, greedy bursts (examples/bench_llm.py, one
# call), the fused products alone: 32 sessions 5,972 -> 7,168 tokens/s; but 16 sessions 4,472 ->
# 4,309 and one row 476 -> 317, so up to 16 rows keep the GEMV (whose rows a pass computes bitwise
# as alone) and more than 128 the tiled GEMM.
# SG_GPU: (input rows, weight rows) a subgroup, and the groups of weight rows a workgroup of
# CPU_WG (64) invocations takes (linear.py's sg_groups): one a subgroup at 32 lanes, where
# llvmpipe's 8 left each subgroup looping over 4 groups in a quarter as many workgroups. H200,
# SmolLM2 fp32, a 32-row pass over 1,056 cached keys 4,701 -> 3,590 us of dispatch time, greedy
# bursts at 32 sessions 7,902 -> 13,094 tokens/s and 64 15,838 -> 18,844, the plain linears taking
# it too; (4, 4, 2) 3,684 us, (8, 4, 2) 4,251, (4, 8, 2) 4,286, (1, 4, 2) 3,898, (2, 2, 2) 3,557
# (BENCHMARKS.md, Products of 17 to 128 rows).
SG_GPU = (2, 4, 2)
SG_GPU_ROWS = (17, 128)
# The 4-bit products (plain and fused, q4_linear.py, q4_fused_linear.py) take the 4-bit subgroup
# kernel for 17 to Q4_GEMV_MAX_ROWS rows, past the GEMV's BITWISE_ROWS, for weights narrower than
# K = Q4_GEMM_MIN_K (wider ones take the dequantizing GEMM there), at Q4_SG_GPU: 4 rows a subgroup,
# in vec2 sums as all the GPUs' 4-bit shapes (q4_linear.py's sg_body; below). H200, SmolLM2 4w,
# greedy bursts, one call, 32 / 64 streams: (2, 4, 2) in vec4 sums 10,801 / 14,517 tokens/s, in
# vec2 sums 10,876 / 14,512, (4, 4, 2) 10,814 / 15,233 (a 32-token prompt 7,035 -> 8,384), (8, 4,
# 2) 8,940 / 11,037 (results/h200/kernel_choices/q4_wide_vec2_sums/). Its fourth element: a lane
# takes one word a step, the lanes' words interleaved, where the shapes of 1 to 16 rows take two (a
# warp's loads of a row's inputs 32 bytes apart, not 64: 8 cache lines a load, not 16; another
# summation order, which no smaller pass shares). H200, SmolLM2 4w, greedy bursts, two rounds in one
# call, 32 / 64 streams 11,064 / 15,751 and 10,734 / 15,251 -> 11,935 / 16,096 and 11,810 / 16,045,
# prompts of 32 / 128 tokens 8,403 / 20,247 and 8,120 / 18,537 -> 9,219 / 20,908 and 9,198 / 21,168
# (results/h200/kernel_choices/q4_subgroup_prefetch/).
Q4_SG_GPU_ROWS = (SG_GPU_ROWS[0], Q4_GEMV_MAX_ROWS)
Q4_SG_GPU = (4, 4, 2, 1)
# 4-bit weights of q4_wide K, and LM heads (GEMV_T4_MIN_N rows or more), take it in place of the
# GEMV for every row count to BITWISE_ROWS, at Q4_SG_GPU_WIDE's shapes (shape_for_rows: one row,
# 2 to 4 rows, more); the fused ones fold their RMS norm into it (q4_linear.py's sg_body), so no
# norm runs a dispatch of its own, and a pass of several rows reads the fold's rows times gamma and
# rstd from one dispatch before it (q4_linear.py's fold_norm_shader, the fold's sums in its order:
# H200, Llama-3.2-1B 4w, greedy bursts, two rounds in each of two calls, 2 / 8 / 16 streams
# 1,412-1,423 / 2,649-2,711 / 3,158-3,217 -> 1,427-1,444 / 2,795-2,857 / 3,401-3,498 tokens/s, one
# stream the same; results/h200/kernel_choices/q4_fold_norm_rows/). They sum in vec2 accumulators
# (an output's sum the same at every shape, so a row of a pass is bitwise the row alone): 4 input rows by 4 weight rows take
# 32 registers of sums, where vec4s took 64 and made (4, 4, 2) lose to (2, 4, 2). H200,
# Llama-3.2-1B shape 4w, greedy bursts, one call, 1 / 2 / 4 / 8 / 16 streams: vec4s at (1, 4, 2)
# and (2, 4, 2) 753 / 1,233 / 1,855 / 2,430 / 2,695 tokens/s, these 749 / 1,214 / 1,870 / 2,593 /
# 3,097; (4, 4, 2) from 3 rows 1,803 at 4, vec2s at (8, 4, 2) from 5 rows 2,109 / 2,600 at 8 / 16,
# scalar sums of dot products 687 at one row; lanes taking one word each side by side (coalesced
# loads) 605-626 at one row, 3,031-3,199 at 16 (results/h200/kernel_choices/q4_wide_vec2_sums/).
# Earlier, vec4s: the GEMV 712 / 2,024-2,036 at 1 / 16 streams. With the norm's own dispatch a
# layer's two norms cost one row what the kernels saved (628 tokens/s). Folding it into the
# 17-64-row kernel of narrower weights cost more than the norm's dispatch (SmolLM2 4w, 64
# streams: 14,437-14,934 -> 13,463-13,991). (8, 2, 2) for 9 to 16 rows (twice the rows a weight's
# nibbles serve): H100, the same export, rounds old / new / new / old in one call, 16 streams 3,426
# / 2,201 / 2,210 / 3,459, 8 the same (results/h100/kernel_choices/q4_eight_rows_two_weights/).
Q4_SG_GPU_WIDE = ((1, 4, 2), (2, 4, 2), (4, 4, 2))
# ... weights of at most Q4_SPLIT_K_MAX_N rows at Q4_SG_GPU_WIDE_SPLIT's: one group of weight rows a
# workgroup, whose subgroups split K (q4_linear.py's sg_body), twice the subgroups on a product:
# such a product's 512-768 subgroups at 4 weight rows each left a 1B model's q/k/v, output and
# down products far from the weights' bandwidth. Every row count splits alike, so a row of a pass
# stays bitwise the row alone; a fused op's weights split alike (fusion.py's kinds). H200,
# Llama-3.2-1B 4w, greedy bursts, two rounds in one call, 1 / 2 / 8 / 16 streams: 835-843 /
# 1,321-1,343 / 2,716-2,738 / 3,353-3,373 -> 932-935 / 1,447-1,458 / 2,647-2,697 / 3,199-3,219
# tokens/s (16 rows wait on the barrier: kept for the one stream); only K >= 4,096 (the down
# product) 890-897 / 3,273-3,298 at 1 / 16; (4, 8, 1) or (8, 4, 1) past 4 rows 2,738-2,757 at 16;
# wide products lose (SwiGLU's 16,384 x 2,048 at one row 15.7 -> 16.2 us alone, the down product's
# 2,048 x 8,192 17.1 -> 12.2) (results/h200/kernel_choices/q4_split_k/).
Q4_SPLIT_K_MAX_N = 4096
Q4_SG_GPU_WIDE_SPLIT = tuple((rows, weights, 1) for rows, weights, _ in Q4_SG_GPU_WIDE)
# ... and ops of at most Q4_NARROW_SPLIT_MAX_N weight rows in all (a fused op's weights together) at
# Q4_SG_GPU_NARROW_SPLIT's, 2 weight rows a workgroup for one and two rows: a 1B's 2,048 rows took 512
# workgroups of 4. H100, Dawn, Llama-3.2-1B 4w of f16 activations loaded with batch_invariant=False,
# GPU time of a pass at 1 / 2 / 4 / 8 rows 1,172 / 1,573 / 2,000 / 3,047 -> 1,079 / 1,437 / 2,023 /
# 3,052 us; greedy bursts, rounds new / old three times in one call, 1 / 2 / 16 streams 949 / 1,353 /
# 6,517, 793 / 1,320 / 6,395, 839 / 1,383 / 6,490, 754 / 1,253 / 6,553, 835 / 1,376 / 6,570, 779 /
# 1,237 / 6,454 tokens/s. Llama-3.1-8B's widths (4,096 rows, q/k/v 6,144) so: one stream the same,
# 2 streams 2,111-2,211 -> 1,955-2,020. One weight row a workgroup cannot rotate q and k in pairs;
# (4, 2, 1) for 3-8 rows no faster; SwiGLU's 8,192 rows split (2, 2, 1): a pass of one row 1,078 ->
# 1,199 us (results/h100/split_k_two_weight_rows/).
Q4_SG_GPU_NARROW_SPLIT = ((1, 2, 1), (2, 2, 1), (4, 4, 1))
Q4_NARROW_SPLIT_MAX_N = 3072


def q4_splits_k(n):
    """Whether the subgroup kernels of a 4-bit weight of N = n rows split K among a workgroup's
    subgroups (Q4_SG_GPU_WIDE_SPLIT or Q4_SG_GPU_NARROW_SPLIT)."""
    return n <= Q4_SPLIT_K_MAX_N


def q4_wide_shapes(n, total):
    """The GPUs' subgroup shapes of a 4-bit weight of N = n rows that takes them to BITWISE_ROWS,
    in an op of `total` weight rows (a fused op's weights together)."""
    if not q4_splits_k(n):
        return Q4_SG_GPU_WIDE
    return Q4_SG_GPU_NARROW_SPLIT if total <= Q4_NARROW_SPLIT_MAX_N else Q4_SG_GPU_WIDE_SPLIT


def shape_for_rows(shapes, m):
    """The index of the subgroup shape of `shapes` (by rows, ascending) that takes a pass of m
    rows: the first of at least m rows, past 2 rows of at least half of them (two groups of rows
    a weight, so twice the workgroups), else the last."""
    least = m if m <= 2 else -(-m // 2)
    return next((i for i, shape in enumerate(shapes) if shape[0] >= least), len(shapes) - 1)


# A pass of at most this many rows computes each row's products as the row alone would, on any
# adapter (the GEMVs, and the CPU subgroup kernels at every shape, sum a row in one order).
BITWISE_ROWS = SG_GPU_ROWS[0] - 1
# On GPUs, weights of at least GEMV_T4_MIN_N rows (an LM head) take linear.py's vec4 GEMV, and
# the GEMM past WIDE_GEMV_ROWS rows: the GEMVs read such a weight once per 8 rows (the vec4 GEMV)
# or once per row (4-bit), the GEMM once. H100, SmolLM2's 49,152 x 576 LM head, per-dispatch
# profile: fp32 the GEMV 335 us at 32 rows, the GEMM 203 us at 64; 4-bit 494 against 233.
GEMV_T4_MIN_N = 8192
WIDE_GEMV_ROWS = BITWISE_ROWS
# A model loaded with batch_invariant=False, on a device with f16 subgroup matrices, runs the
# products that have them (4-bit weights of f16 rows and q4_wide K; f16 weights of K >=
# FLOAT_GEMM_MIN_K) in the GEMM's tensor-core tiles (gemm.py's SHORT_DECODE_MATRIX_TILE,
# DECODE_MATRIX_TILE) past this many rows, where the subgroup kernels and GEMVs take them to
# BITWISE_ROWS: a row of such a pass then sums in another order than alone (its bits may differ).
# H100, Dawn, Llama-3.2-1B 4w of f16 activations, greedy bursts, one call: 16 streams 3,311 ->
# 4,945 tokens/s from 9 rows, 5,036 from 5, 5,130 from 2; 8 streams 2,660 on the subgroup kernels,
# 2,638 on the tiles; 4 streams 1,949 / 1,295; Llama-3.2-1B fp16, 16 streams 3,444-3,490 ->
# 3,856-3,938 (results/h100/batch_variant_rows/).
BATCH_VARIANT_ROWS = 8


def exact_rows(b, matrices):
    """The most rows of a pass that a GPU's subgroup kernels and GEMVs take (each row bitwise the
    row alone) for products built by `b` whose GEMM has f16 matrices past them (`matrices`):
    BITWISE_ROWS, or BATCH_VARIANT_ROWS where `b` is not batch invariant."""
    return BATCH_VARIANT_ROWS if matrices and not b.batch_invariant else BITWISE_ROWS


def q4_exact_rows(b, k, rows):
    """exact_rows of 4-bit weights of K = k over `rows`: f16 matrices take rows of f16 past the
    subgroup kernels of q4_wide K."""
    return exact_rows(b, b.f16_matrices and b.storage(rows) == "f16" and q4_wide(k))


def gpu_gemv_rows(n, most=GEMV_MAX_ROWS):
    """The most rows a GPU's GEMV takes for a weight of N rows (more: the GEMM)."""
    return WIDE_GEMV_ROWS if n >= GEMV_T4_MIN_N else most


# Float weights of K >= FLOAT_GEMM_MIN_K (models from 1B parameters up) take the subgroup kernel
# to WIDE_K_SG_ROWS rows, the GEMM past them: the subgroup kernel's workgroups take 2 input rows
# each, so a pass of 64 rows reads each weight 32 times, and weights of such K do not stay in the
# L2 cache between row groups. H200, Llama-3.2-1B fp16, greedy bursts, two rounds in one call, the
# subgroup kernel to 128 rows against the GEMM past 16: 64 streams 4,265 / 4,219 -> 5,793 / 5,809
# tokens/s, a prompt of 128 tokens 4,694 / 4,687 -> 8,110 / 8,010; but 32 streams 3,948 / 3,929
# -> 3,147 / 3,163 and a prompt of 32 tokens 3,814 / 3,840 -> 3,076 / 3,080; the subgroup kernel
# to 64 rows (its row groups side by side, kernels/wgsl.py's row_groups) 64 streams 5,811 / 5,854
# -> 5,287 / 5,250 (results/h200/kernel_choices/fp16_gemvs/).
FLOAT_GEMM_MIN_K = 2048
WIDE_K_SG_ROWS = GEMV_MAX_ROWS


# ... and, where K is whole groups of 8 (float_wide), below those rows too: the subgroup kernels at
# FLOAT_SG_GPU_WIDE's shapes (shape_for_rows; the weight rows a subgroup at least one output of each
# weight, two with a RoPE epilogue's pairs), every row count in one summation order (lanes along K,
# a subgroupAdd), so a row of a pass of up to WIDE_K_SG_ROWS is bitwise the row alone; f16 weights
# 8 a load, one row with 4 steps' loads in flight (linear.py's wide_sg_shape, sg_unroll). The GEMV
# reduced 4 outputs over 256 lanes through workgroup memory and read a row's inputs once per 4
# outputs. H200, Llama-3.2-1B fp16, greedy bursts, two rounds in one call, against the GEMVs to 16
# rows and (2, 4, 2) past them: 1 stream 637 / 638 -> 655 / 657 tokens/s, 2 981 / 987 -> 1,153 /
# 1,168, 8 1,963-1,979 -> 2,440 / 2,450, 16 2,386-2,401 -> 3,490 / 3,491, 32 4,440-4,473 -> 4,386
# / 4,413; (1, 4, 2) at one row 482 (vec4<f16> loads) to 505, (1, 2, 2) 600, (2, 4, 2) at 2 rows
# 919; 8 // rows steps in flight 7-9% slower at 8-32 rows (results/h200/kernel_choices/float_wide_subgroup/).
FLOAT_SG_GPU_WIDE = ((1, 1, 2), (2, 2, 2), (4, 4, 2))


def float_wide(k):
    """Whether float weights of K = k take FLOAT_SG_GPU_WIDE's subgroup kernels on GPUs: K from
    FLOAT_GEMM_MIN_K, whole groups of 8 (f16 weights read 8 a load, linear.py's PACKED_F16)."""
    return k >= FLOAT_GEMM_MIN_K and k % 8 == 0


def float_subgroup_rows(k, matrices=False, exact=BITWISE_ROWS):
    """The most rows a GPU's subgroup kernel (and GEMV) takes of a float weight of K = k (from
    SG_GPU_ROWS[0]); with `matrices` (f16 rows and weights on a device whose GEMM multiplies them
    on f16 subgroup matrices, gemm.py's DECODE_MATRIX_TILE), `exact` (exact_rows) of K >= FLOAT_GEMM_MIN_K:
    H200, Dawn, Llama-3.2-1B fp16, greedy bursts, 24 / 32 streams 3,917 / 4,620 -> 5,490 / 7,116
    tokens/s; with the tile from 33 rows only 3,820 / 4,538 (results/h200/kernel_choices/f16_matrix_decode_rows/)."""
    if k < FLOAT_GEMM_MIN_K:
        return SG_GPU_ROWS[1]
    return exact if matrices else WIDE_K_SG_ROWS


def float_norm_folds(b, k):
    """Whether a fused float linear of K = k built by `b` normalizes its rows in its GEMV (to
    fused_norm_rows). Not on GPUs at K >= FLOAT_GEMM_MIN_K: each of its workgroups would sum its
    rows' squares (a tree of 7 barriers) for 4 outputs, and `pte_wgpu.rms_norm_for_gemm` runs
    instead. H200, Llama-3.2-1B fp16, greedy bursts, two rounds in one call: 16 streams 1,933 /
    1,928 -> 2,386 / 2,384 tokens/s, one stream 520 / 517 -> 526 / 529, 32 and 64 the same."""
    return b.adapter == CPU or k < FLOAT_GEMM_MIN_K


def f16_matrix_products(b, k, tensors):
    """Whether products of K = k over `tensors` (rows and [N, K] weights) built by `b` have the
    GEMM's tiles on f16 subgroup matrices (gemm.py's MATRIX_TILE, DECODE_MATRIX_TILE): a device
    with them, every tensor stored f16, K whole quads (the tiles' halves loads)."""
    return b.f16_matrices and k % 4 == 0 and all(b.storage(v) == "f16" for v in tensors)


def subgroup_products(b, k, tensors):
    """Whether products of K = k built by `b` can run the subgroup kernels: a device with
    subgroups, K whole vec4s, every tensor of `tensors` stored f32 or f16. CPU variants then take
    them at every row count, GPU ones for SG_GPU_ROWS rows."""
    return b.subgroups and k % 4 == 0 and all(b.storage(v) in ("f32", "f16") for v in tensors)


def fused_norm_rows(b, k, tensors, q4=False):
    """The most rows a fused linear of K = k over `tensors` (`q4`: a 4-bit one, whose GEMV takes up
    to Q4_GEMV_MAX_ROWS rows without subgroups, q4_fused_linear.py) normalizes itself; for more,
    `pte_wgpu.rms_norm_for_gemm` (or `pte_wgpu.rms_norm_for_q4`) writes the normalized rows, which
    the subgroup kernels of more than one row and the GEMM read (GPUs: past BITWISE_ROWS, also for
    the rare 4-bit weights whose rows or groups are not whole subgroup steps, which keep the GEMV
    to Q4_GEMV_MAX_ROWS and normalize themselves there). On CPU adapters with subgroups
    none: their subgroup kernels read the normalized rows at every row count, as normalizing in
    the kernel takes a workgroup barrier, which costs lavapipe more than the norm's own dispatch
    (SmolLM2 4w, one row: the fused SwiGLU 1.94 ms normalizing itself, 0.99 ms reading the rows,
    the norm 45 us; fp32 the same, BENCHMARKS.md). The GPUs' 4-bit subgroup kernels of q4_wide K
    fold the norm in (Q4_SG_GPU_WIDE), to q4_exact_rows' rows as well (several rows through one dispatch
    of their own, q4_fused_linear.py's _FoldNorm). Float ones of float_wide K on GPUs fold it
    in their subgroup kernels (linear.py's gemv_sg_body) to float_subgroup_rows, here of the norm's
    `tensors` (fused_linear.py's _Gemvs takes those rows at least, whatever its own tensors' types);
    other float ones of K >= FLOAT_GEMM_MIN_K on GPUs: none (float_norm_folds)."""
    if not q4 and b.adapter != CPU and float_wide(k) and subgroup_products(b, k, tensors):
        matrices = f16_matrix_products(b, k, tensors)
        return float_subgroup_rows(k, matrices, exact_rows(b, matrices))
    if not (q4 or float_norm_folds(b, k)):
        return 0
    if subgroup_products(b, k, tensors):
        return 0 if b.adapter == CPU else q4_exact_rows(b, k, tensors[-1]) if q4 else BITWISE_ROWS
    return q4_gemv_rows(k) if q4 else GEMV_MAX_ROWS
