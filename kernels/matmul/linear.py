"""Matrix multiplication: linear, mm, bmm and addmm, with a GEMV route and a GEMM route.

Every op is one batched product out[b, m, n] = alpha * sum_k A[b, m, k] * B[b, k, n] + beta * bias,
where B is either row-major [K, N] (mm, bmm, addmm) or a transposed [N, K] weight (linear). Which
layout is fixed at build time; M, N, K and the batch come from live shapes through one uniform.

Each op records a route group the hook picks from by the live row count:
- GEMV (M == 1, decode; and up to GEMV_MAX_ROWS rows with an [N, K] weight): a 256-thread workgroup
  reduces over K for a few outputs in shared memory; for a [N, K] weight, 4 weight rows per
  workgroup with the input row reused from registers (f16 weights 8 a load: gemv_step); for a [K, N] matrix, 32 columns per
  workgroup with K split over 8 slices. On GPUs with subgroups, weights of rows from
  FLOAT_GEMM_MIN_K (routes.py's float_wide) take subgroup kernels instead (lanes along K, a
  subgroupAdd), one shape by the row count, every shape summing a row in one order.
- GEMM (more rows, prefill): kernels/matmul/gemm.py's register-tiled template with fp32 tile loads.
The unused route gets a (0, 0, 0) grid.

Each operand and the output is stored as its tensor's type (f32, or f16 for float16: `Storage`);
every kernel converts at the load and the store and sums in f32.

Kept as one module past 400 lines: the GEMV kernels and the route table of every product live together (the fused linears build on them).
"""

import struct
from dataclasses import dataclass

from pte_wgpu.resize.shapes import MAX_WORKGROUPS, broadcast_strides, fold_grid, numel_of

from ..registry import op
from ..variants import ANY, CPU, CPU_ONLY, GPU_ONLY, Routes, Variant
from ..wgsl import GELU, SUBGROUP_BUILTINS, fill, is_float, vec4_loader, vec4_type
from .gemm import PARAMS_FORMAT, PARAMS_SIZE, GemmRoute, added_binding, float_load, gemm_scratch, header, weight_load
from .routes import (
    BITWISE_ROWS,
    FLOAT_SG_GPU_WIDE,
    GEMV_MAX_ROWS,
    GEMV_T4_MIN_N,
    SG_GPU,
    SG_GPU_ROWS,
    exact_rows,
    f16_matrix_products,
    float_subgroup_rows,
    float_wide,
    gpu_gemv_rows,
    shape_for_rows,
)


@dataclass(frozen=True)
class Storage:
    """The WGSL storage types of a product's A, B, bias and output (f32 or f16 each)."""

    a: str = "f32"
    b: str = "f32"
    bias: str = "f32"
    out: str = "f32"
    added: str | None = None  # a residual's, added after the bias (gemm.py's header); None: none


F32 = Storage()

GEMV_ROWS = 4  # outputs per workgroup, [N, K] weight
GEMV_COLS, GEMV_SLICES = 32, 8  # outputs per workgroup and K slices, [K, N] matrix
GEMV_GROUP_ROWS = 8


# [N, K] weights: each workgroup computes 4 outputs (weight rows) for up to GEMV_GROUP_ROWS input
# rows, the weight element reused across the rows; rows past N are clamped to N - 1 (valid memory)
# and never written. `kernels/matmul/fused_linear.py` builds its fused products from the same pieces.
# The accumulators' sums: one shared-memory tree sums TREE_WIDTH of them at once (4 x 256 vec4s
# is 16 KiB, WebGPU's default workgroup storage), each in the same order as a tree of its own.
# Per-row trees cost ~9 barriers a row, which dominated a GEMV of 8 rows.
TREE_WIDTH = 4
GEMV_REDUCE = fill(
    """
var<workgroup> red: array<vec4<f32>, $SIZE>;
""",
    SIZE=TREE_WIDTH * 256,
)


def _trees(accs, rows_first, partners=False):
    """Sum `accs` (WGSL vec4 names) over the workgroup, TREE_WIDTH per tree; thread li < 4 gets lane
    li of each in v<name> (with `partners`, lane li ^ 1 in pair<name> too: the other of its pair).
    A tree runs only if its first accumulator's row `rows_first[i]` is live."""
    lines = [f"var {p}{acc} = 0.0;" for acc in accs for p in (("v", "pair") if partners else ("v",))]
    for c in range(0, len(accs), TREE_WIDTH):
        chunk = accs[c : c + TREE_WIDTH]
        slots = [f"red[{i * 256}u + li]" for i in range(len(chunk))]
        adds = " ".join(f"{x} = {x} + red[{i * 256}u + li + s];" for i, x in enumerate(slots))
        lines.append(f"if ({rows_first[c]}u < rows) {{")
        lines += [f"    {x} = {acc};" for x, acc in zip(slots, chunk)]
        lines.append("    workgroupBarrier();")
        lines.append(f"    for (var s = 128u; s > 0u; s = s >> 1u) {{ if (li < s) {{ {adds} }} workgroupBarrier(); }}")
        lines += [f"    v{acc} = red[{i * 256}u][min(li, 3u)];" for i, acc in enumerate(chunk)]
        lines += [f"    pair{acc} = red[{i * 256}u][min(li, 3u) ^ 1u];" for i, acc in enumerate(chunk) if partners]
        lines.append("    workgroupBarrier();")
        lines.append("}")
    return lines


def gemv_t_body(weights, n, k, store, base="0u", scale=None, group_rows=GEMV_GROUP_ROWS, partners=False, step=1):
    """WGSL statements of the [N, K]-weight GEMV for the weight bindings `weights` (N rows of `n`,
    K of `k`, from `base`): one accumulator variable per (weight, row), written out (a private
    array indexed in a loop can spill to local memory). Expects `n0`, `rows`, `aoff` and `li`;
    `store(r)` is the statement that writes row r's output n from lanes v0, v1, ... (one a weight;
    with `partners`, pair0, pair1, ... hold output n ^ 1, the other of its pair: n0 is a multiple of 4).
    `scale(r, i, x)`, if given, turns input element i of row r, loaded as f32 expression x, into
    what is multiplied (a fused norm). The kernel takes `group_rows` input rows per workgroup.
    `step`: weights an invocation loads at a time, 1, or PACKED_F16 (the weights bound as
    vec4<u32> of f16 pairs, K and `base` multiples of it: gemv_step)."""
    rows = range(group_rows)
    lines = []
    for j, w in enumerate(weights):
        lines += [f"let {w}_{i} = {base} / {step}u + min(n0 + {i}u, {n} - 1u) * ({k} / {step}u);" for i in range(4)]
        lines += [f"var acc{j}_{r} = vec4<f32>(0.0);" for r in rows]
    lines.append(f"for (var kv = li; kv < {k} / {step}u; kv = kv + 256u) {{")
    lines.append(f"    let k = kv * {step}u;")
    for j, w in enumerate(weights):
        if step == 1:
            lines.append(f"    let wv{j}_0 = vec4<f32>({', '.join(f'f32({w}[{w}_{i} + kv])' for i in range(4))});")
            continue
        lines += [f"    let u{j}_{i} = {w}[{w}_{i} + kv];" for i in range(4)]
        for h in range(step // 2):  # weights k + 2h and k + 2h + 1 of the 4 rows
            pairs = [f"unpack2x16float(u{j}_{i}[{h}u])" for i in range(4)]
            lines.append(f"    let wv{j}_{2 * h} = vec4<f32>({', '.join(f'{x}.x' for x in pairs)});")
            lines.append(f"    let wv{j}_{2 * h + 1} = vec4<f32>({', '.join(f'{x}.y' for x in pairs)});")
    for r in rows:
        fmas = []
        for e in range(step):
            x = f"f32(a[aoff + {r}u * {k} + k + {e}u])"
            x = scale(r, f"(k + {e}u)", x) if scale else x
            fmas.append(f"let x{e} = {x}; " + " ".join(f"acc{j}_{r} = acc{j}_{r} + x{e} * wv{j}_{e};" for j in range(len(weights))))
        lines.append(f"    if ({r}u < rows) {{ {' '.join(fmas)} }}")
    lines.append("}")
    order = [(j, r) for r in rows for j in range(len(weights))]
    lines += _trees([f"acc{j}_{r}" for j, r in order], [r for _, r in order], partners)
    for r in rows:
        lanes = " ".join(f"let {p}{j} = {p}acc{j}_{r};" for j in range(len(weights)) for p in (("v", "pair") if partners else ("v",)))
        lines.append(f"if ({r}u < rows) {{ {lanes} let n = n0 + li; if (li < 4u && n < {n}) {{ {store(r)} }} }}")
    return "\n    ".join(lines)


PACKED_F16 = 8  # f16 weights a load of the [N, K] GEMV: a vec4<u32> of f16 pairs


def gemv_step(weight_type, k):
    """The weights an invocation of the [N, K] GEMV loads at a time (gemv_t_body's `step`) for a
    weight stored as `weight_type` with rows of K: f16 rows of whole PACKED_F16s take 16 bytes a
    load, where one f16 a load moved 64 bytes a warp. H200, Llama-3.2-1B fp16, greedy bursts, one
    call: one stream 370 -> 522 tokens/s, 16 streams 1,763 -> 1,920
    (results/h200/kernel_choices/fp16_gemvs/)."""
    return PACKED_F16 if weight_type == "f16" and k % PACKED_F16 == 0 else 1


def weight_binding_type(weight_type, step):
    """The WGSL element type a GEMV of `step` binds its weights as."""
    return "vec4<u32>" if step == PACKED_F16 else weight_type


ROWS_MAIN = """
@compute @workgroup_size($SIZE)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32$BUILTINS) {
    let groups = (p.M + ${GROUP_ROWS}u - 1u) / ${GROUP_ROWS}u;  // z runs over (batch, group of rows)
    let b = wid.z / groups;
    let r0 = (wid.z % groups) * ${GROUP_ROWS}u;
    let rows = min(${GROUP_ROWS}u, p.M - r0);
"""


def rows_main(size, group_rows, builtins=""):
    """The [N, K] GEMVs' entry: workgroup z is (batch b, group of rows from r0, `rows` of them live).
    `builtins`: more entry-point arguments (SUBGROUP_BUILTINS)."""
    return fill(ROWS_MAIN, SIZE=size, GROUP_ROWS=group_rows, BUILTINS=builtins)


GEMV_ROWS_MAIN = rows_main(256, GEMV_GROUP_ROWS)

def gemv_t(step, group_rows=GEMV_GROUP_ROWS):
    """The [N, K]-weight GEMV's kernel, `step` weights a load (gemv_step), `group_rows` input rows
    a workgroup."""
    store = lambda r: f"out[b * p.c_bs + (r0 + {r}u) * p.N + n] = epilogue(v0, b, r0 + {r}u, n);"  # noqa: E731
    body = gemv_t_body(["bm"], "p.N", "p.K", store, "b * p.b_bs", group_rows=group_rows, step=step)
    return GEMV_REDUCE + rows_main(256, group_rows) + f"""    let n0 = (wid.x + wid.y * nwg.x) * 4u;
    let aoff = b * p.a_bs + r0 * p.K;
    {body}
}}
"""


# [N, K] weights with K a multiple of 4 (aten.linear's decode route): 32 weight rows per workgroup,
# 8 invocations a row, each summing every 8th vec4 of its row for up to GEMV_GROUP_ROWS input rows,
# then the 8 partial sums of a row added in a fixed order. A row's sum does not depend on how many
# rows the pass has, so a ragged batch's rows are bitwise what each row gets alone. Against the
# 4-rows-per-workgroup kernel above (a 256-wide tree of barriers for 4 outputs): the 113 MB
# SmolLM2 LM head 124 -> 49 us on an H100 (0.9 -> 2.3 TB/s). With few rows (N / 32 workgroups)
# it is slower: a 576 x 1536 weight 7.6 -> 27 us. So only N >= GEMV_T4_MIN_N takes it (a fixed
# choice per weight, whatever the row count).
# An f16 weight with K a multiple of 8 is read 8 weights (16 bytes) a load, as a vec4<u32> of f16
# pairs: a vec4<f16> load moves half the bytes of the f32 kernel's vec4 per loop step.
GEMV_T4_ROWS, GEMV_T4_LANES = 32, 8
def f16_halves(u):
    """WGSL of the 8 f16 weights of `u` (a vec4<u32> of f16 pairs) as two vec4<f32>: 0-3, 4-7."""
    return tuple(f"vec4<f32>(unpack2x16float({u}.{a}), unpack2x16float({u}.{c}))" for a, c in ("xy", "zw"))


# The loop step's weight load and each row's accumulation, per weights a load (4 or 8).
_LOW_HALF, _HIGH_HALF = f16_halves("u")
T4_STEPS = {
    4: ("let w = vec4<f32>(bm[w0 + kv]);", "w * row_of_a(x)"),
    8: (f"let u = bm[w0 + kv]; let w = {_LOW_HALF}; let w1 = {_HIGH_HALF};", "w * row_of_a(x) + w1 * row_of_a(x + 4u)"),
}


GEMV_T4 = """
var<workgroup> red: array<f32, $RED>;

fn row_of_a(i: u32) -> vec4<f32> { return vec4<f32>(f32(a[i]), f32(a[i + 1u]), f32(a[i + 2u]), f32(a[i + 3u])); }
$ROWS_MAIN    let lane = li % ${LANES}u;
    let n = (wid.x + wid.y * nwg.x) * ${T4_ROWS}u + li / ${LANES}u;
    let kvs = p.K / ${STEP}u;
    let w0 = b * p.b_bs / ${STEP}u + min(n, p.N - 1u) * kvs;
    let aoff = b * p.a_bs + r0 * p.K;
    $ACCS
    for (var kv = lane; kv < kvs; kv = kv + ${LANES}u) {
        $LOAD
        $FMAS
    }
    $PARTIALS
    workgroupBarrier();
    let at = li % ${T4_ROWS}u * ${LANES}u;  // invocation li adds row li % 32's lanes for input row li / 32
    let r = li / ${T4_ROWS}u;
    let o = (wid.x + wid.y * nwg.x) * ${T4_ROWS}u + li % ${T4_ROWS}u;
    if (r < rows && o < p.N) {
        let e = r * 256u + at;
        let v = ((red[e] + red[e + 1u]) + (red[e + 2u] + red[e + 3u])) + ((red[e + 4u] + red[e + 5u]) + (red[e + 6u] + red[e + 7u]));
        out[b * p.c_bs + (r0 + r) * p.N + o] = epilogue(v, b, r0 + r, o);
    }
}
"""


def gemv_t4(step):
    """The vec4 GEMV's WGSL, `step` weights a load (T4_STEPS)."""
    load, fma = T4_STEPS[step]
    return fill(
        GEMV_T4,
        RED=256 * GEMV_GROUP_ROWS,
        ROWS_MAIN=GEMV_ROWS_MAIN,
        LANES=GEMV_T4_LANES,
        T4_ROWS=GEMV_T4_ROWS,
        STEP=step,
        LOAD=load,
        ACCS="".join(f"var acc{r} = vec4<f32>(0.0);\n    " for r in range(GEMV_GROUP_ROWS)),
        FMAS="".join(
            f"if ({r}u < rows) {{ let x = aoff + {r}u * p.K + {step}u * kv; acc{r} = acc{r} + {fma}; }}\n        " for r in range(GEMV_GROUP_ROWS)
        ),
        PARTIALS="".join(f"red[{r * 256}u + li] = (acc{r}.x + acc{r}.y) + (acc{r}.z + acc{r}.w);\n    " for r in range(GEMV_GROUP_ROWS)),
    )


GEMV_N = """
var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let b = wid.z;
    let c = li % 32u;
    let s = li / 32u;
    let n = (wid.x + wid.y * nwg.x) * 32u + c;
    let col = b * p.b_bs + min(n, p.N - 1u);
    let aoff = b * p.a_bs;
    var acc = 0.0;
    for (var k = s; k < p.K; k = k + 8u) {
        acc = acc + f32(a[aoff + k]) * f32(bm[col + k * p.N]);
    }
    red[li] = acc;
    workgroupBarrier();
    for (var h = 128u; h >= 32u; h = h >> 1u) {
        if (li < h) { red[li] = red[li] + red[li + h]; }
        workgroupBarrier();
    }
    if (li < 32u && n < p.N) { out[b * p.c_bs + n] = epilogue(red[li], b, 0u, n); }
}
"""


# CPU adapters (kernels/variants.py): one invocation per output, its whole sum over K in registers,
# no workgroup memory and no barrier. For an [N, K] weight, invocation n reads weight row n as
# vec4 steps (lane c of the accumulator sums k = c mod 4), reused for the group's input rows, then
# the 4 lanes and the K % 4 tail in a fixed order: a row's sum does not depend on the pass's other
# rows. `kernels/matmul/fused_linear.py` builds its fused CPU products from the same body.
CPU_WG = 64  # invocations (outputs) per workgroup
# Input rows per invocation: side by side on lavapipe (2 cores, 1536 x 576, M = 1), one row took
# 11 ms against 20 for a group of 8 (the group's branches and accumulators), and a decode step is
# one row. A ragged pass of several rows reads each weight row once per input row.
CPU_GROUP_ROWS = 1


def gemv_t_cpu_body(weights, n, k, store, base="0u", scale=None, group_rows=CPU_GROUP_ROWS):
    """`gemv_t_body`'s CPU variant, with the same arguments; expects `n` (this invocation's output,
    possibly past the last: clamped for reads, not written), `rows` and `aoff`. `scale(r, i, x)`
    turns input element i of row r, loaded as x."""
    rows = range(group_rows)
    lines = []
    for j, w in enumerate(weights):
        lines.append(f"let {w}_row = {base} + min(n, {n} - 1u) * {k};")
        lines += [f"var acc{j}_{r} = vec4<f32>(0.0);" for r in rows]

    def x_at(r, i):
        x = f"f32(a[aoff + {r}u * {k} + {i}])"
        return scale(r, i, x) if scale else x

    lines.append(f"let k4 = {k} / 4u * 4u;")
    lines.append("for (var k = 0u; k < k4; k = k + 4u) {")
    for j, w in enumerate(weights):
        lines.append(f"    let wv{j} = vec4<f32>({', '.join(f'f32({w}[{w}_row + k + {c}u])' for c in range(4))});")
    for r in rows:
        x = ", ".join(x_at(r, f"k + {c}u") for c in range(4))
        fma = " ".join(f"acc{j}_{r} = acc{j}_{r} + x * wv{j};" for j in range(len(weights)))
        lines.append(f"    if ({r}u < rows) {{ let x = vec4<f32>({x}); {fma} }}")
    lines.append("}")
    for j in range(len(weights)):
        lines += [f"var v{j}_{r} = (acc{j}_{r}.x + acc{j}_{r}.y) + (acc{j}_{r}.z + acc{j}_{r}.w);" for r in rows]
    lines.append(f"for (var k = k4; k < {k}; k = k + 1u) {{")
    for r in rows:
        adds = " ".join(f"v{j}_{r} = v{j}_{r} + x * f32({w}[{w}_row + k]);" for j, w in enumerate(weights))
        lines.append(f"    if ({r}u < rows) {{ let x = {x_at(r, 'k')}; {adds} }}")
    lines.append("}")
    for r in rows:
        lanes = " ".join(f"let v{j} = v{j}_{r};" for j in range(len(weights)))
        lines.append(f"if ({r}u < rows && n < {n}) {{ {lanes} {store(r)} }}")
    return "\n    ".join(lines)


GEMV_T_CPU = rows_main(CPU_WG, CPU_GROUP_ROWS) + fill(
    """    let n = (wid.x + wid.y * nwg.x) * ${CPU_WG}u + li;
    let aoff = b * p.a_bs + r0 * p.K;
    $BODY
}
""",
    CPU_WG=CPU_WG,
    BODY=gemv_t_cpu_body(["bm"], "p.N", "p.K", lambda r: f"out[b * p.c_bs + (r0 + {r}u) * p.N + n] = epilogue(v0, b, r0 + {r}u, n);", "b * p.b_bs"),
)

# CPU adapters with subgroups, an [N, K] weight with K a multiple of 4: the lanes of a subgroup
# walk one weight row together, lane l reading vec4s l, l + S, .. (S the subgroup size), so the
# lanes' loads are neighbours, not one row each; a subgroup takes several weight rows and input
# rows at once (a shape, below), each vec4 it loads used for all of the other kind, and
# subgroupAdd sums each output's lanes. An output's sum is the same whatever the shape and the
# other rows of the pass. A workgroup takes CPU_WG / SG_LANES groups of weight rows whatever S
# is (a GPU's shape names its own count, sg_groups): subgroup s takes groups s, s + CPU_WG / S, ..
# On lavapipe (Mesa 22.3) every load of a storage buffer is a loop over the SIMD lanes, one scalar
# load per lane and component, so what counts is vec4 loads and how many products each feeds.
# Micro-benchmarks, CPU time of the process (2 cores shared with other work; weights read per
# CPU-second): one row by the LM head (49152 x 576) 37 ms, 3.1 GB/s, at 4 weight rows a subgroup,
# against 108 ms, 1.05 GB/s, for one invocation a weight row (GEMV_T_CPU); 1536 x 576 and
# 576 x 1536 2.7 against 1.2 and 1.0 GB/s. 64 x 576 by 1536 x 576 (input rows x weight rows a
# subgroup): 1 x 4 69 ms, 4 x 4 48 ms, 8 x 4 29 ms, 4 x 8 26 ms, 8 x 8 20 ms, 8 x 16 and 16 x 16
# 18-19 ms.
SG_LANES = 8  # llvmpipe's subgroup size on 256-bit SIMD (other sizes run the same kernel)
SG_GEMV = (1, 4)  # (input rows, weight rows) a subgroup takes: one row (decode)
SG_GEMM = (8, 8)  # any other row count (prefill, a ragged pass of several sessions)


def sg_groups(shape):
    """Groups of weight rows a workgroup of a subgroup kernel takes: a shape's third element where
    it has one (the GPUs' shape, one group a 32-lane subgroup; one group a workgroup: its
    subgroups split K, sg_splits_k), else CPU_WG / SG_LANES."""
    return shape[2] if len(shape) > 2 else CPU_WG // SG_LANES


def sg_splits_k(shape):
    """Whether a GPU subgroup kernel of `shape` splits K among its workgroup's subgroups (one group
    of weight rows a workgroup; q4_linear.py's sg_body takes such shapes)."""
    return len(shape) > 2 and shape[2] == 1


def sg_wg_rows(shape, weights=1):
    """Outputs per workgroup of a subgroup kernel of `shape` whose rows are split among `weights`."""
    return shape[1] // weights * sg_groups(shape)


def sg_total(v, width=4):
    """WGSL: the sum of the components of `v` (a vec4, a vec2 for `width` 2, a scalar for 1) over the
    subgroup's lanes, in the subgroup kernels' order."""
    parts = f"({v}.x + {v}.y) + ({v}.z + {v}.w)" if width == 4 else f"{v}.x + {v}.y" if width == 2 else v
    return f"subgroupAdd({parts})"


def fold_rstd(square):
    """WGSL: a folded RMS norm's rstd of a row whose squares sum to `square` (q.K and q.eps the uniform's)."""
    return f"inverseSqrt({square} / f32(q.K) + q.eps)"


def sg_sums(weights, ins, outs, n, store, partners=False, scale=None, width=4, total=None):
    """The subgroup kernels' last statements: each accumulator acc{j}_{i}_{r} (weight j, output
    i, input row r; vectors of `width`) summed over its components and the subgroup's lanes into
    v{j} (sg_total; or `total(j, i, r)`, WGSL of the sum), and lane 0 storing output n0 + i of a
    live row r with `store(r)`, for N = `n` (WGSL). With `partners` (n0 and the outputs even),
    pair{j} holds output n ^ 1's sum too (a RoPE epilogue's). `scale(r)`: a WGSL factor of row
    r's sums (a folded norm's)."""
    lines = []

    def total_of(j, i, r):
        return (total(j, i, r) if total else sg_total(f"acc{j}_{i}_{r}", width)) + (f" * {scale(r)}" if scale else "")

    for r in ins:
        if partners:
            lines.append("{ " + " ".join(f"let s{j}_{i} = {total_of(j, i, r)};" for i in outs for j in range(weights)))
        for i in outs:
            if partners:
                sums = " ".join(f"let v{j} = s{j}_{i}; let pair{j} = s{j}_{i ^ 1};" for j in range(weights))
            else:
                sums = " ".join(f"let v{j} = {total_of(j, i, r)};" for j in range(weights))
            lines.append(f"{{ {sums} let n = n0 + {i}u; if (lane == 0u && n < {n} && {r}u < rows) {{ {store(r)} }} }}")
        lines += ["}"] if partners else []
    return lines


def wide_sg_shape(shape, f16):
    """FLOAT_SG_GPU_WIDE's `shape` with the weights a lane loads a step as its fourth element:
    PACKED_F16 of `f16` weights, a vec4 of f32 ones (sg_packed, sg_unroll)."""
    return (*shape, PACKED_F16 if f16 else 4)


def sg_packed(shape):
    """Whether a subgroup kernel of `shape` reads f16 weights PACKED_F16 a load (its fourth element)."""
    return len(shape) > 3 and shape[3] == PACKED_F16


def sg_unroll(shape):
    """Steps a lane of a subgroup kernel of `shape` loads at once: 4 // its rows for wide_sg_shape's
    (one row keeps as many loads in flight as 4), 1 for the others."""
    return max(1, 4 // shape[0]) if len(shape) > 3 else 1


def gemv_sg_body(weights, n, k4, store, base="0u", shape=SG_GEMV, partners=False, norm=False):
    """WGSL statements of the subgroup GEMV for vec4 weight bindings `weights` (N rows of `n`, K / 4
    vec4s of `k4`, from vec4 `base`) over `shape` = (input rows, weight rows split among the
    weights): input row r at vec4s `aoff4 + r * k4 ..` of `a`, rows past `rows` read as the last
    live one and not written (no branch in the loop). Every binding X is read through its
    `vec4_loader` X4, so any of them may be stored f32 or f16. Expects `nw` (the workgroup's first output),
    `rows`, `li`, `lane`, `sgs`; `store(r)` writes input row r's output n from v0, v1, .. (one a
    weight). With `partners`, pair0, .. hold output n ^ 1 (sg_sums). A `shape` of sg_packed: the
    weights bound as vec4<u32> of f16 pairs (`base` in those), a lane taking 8 of K a step. With
    `norm`, `a` holds the rows before an RMS norm of weight `gamma` (q.K and q.eps the uniform's),
    folded into the products as q4_linear.py's sg_body folds it: each sums x * gamma, times its
    row's fold_rstd from the squares of x its lanes add as they read the row, in the same order
    at every shape (a row of a pass still bitwise the row alone)."""
    outs, ins, packed = range(shape[1] // len(weights)), range(shape[0]), sg_packed(shape)
    steps = f"({k4} / 2u)" if packed else k4
    lines = [f"for (var g = li / sgs; g < {sg_groups(shape)}u; g = g + {CPU_WG}u / sgs) {{", f"let n0 = nw + g * {len(outs)}u;"]
    lines += [f"let x{r}_ = aoff4 + min({r}u, rows - 1u) * {k4};" for r in ins if r]
    for j, w in enumerate(weights):
        lines += [f"let {w}_{i} = {base} + min(n0 + {i}u, {n} - 1u) * {steps};" for i in outs]
        lines += [f"var acc{j}_{i}_{r} = vec4<f32>(0.0);" for i in outs for r in ins]
    lines += [f"var sq{r} = vec4<f32>(0.0);" for r in ins] if norm else []
    halves = ("x", "y") if packed else ("x",)  # the vec4s of K a lane's step reads of a row

    def loads(k, u):  # step k's inputs and weights, names suffixed u (packed: weights 8 a load, h the upper 4)
        xs = [f"x{r}_" if r else "aoff4" for r in ins]
        at = [f"2u * {k}", f"2u * {k} + 1u"] if packed else [k]
        gamma = [f"let g{h}{u} = gamma4({a});" for h, a in zip(halves, at)] if norm else []  # the norm's weight, once for every row
        row = (lambda h, r, a: f"let e{h}{r}{u} = a4({xs[r]} + {a}); let {h}{r}{u} = e{h}{r}{u} * g{h}{u};") if norm else (lambda h, r, a: f"let {h}{r}{u} = a4({xs[r]} + {a});")
        out = gamma + [" ".join(row(h, r, a) for h, a in zip(halves, at)) for r in ins]
        if not packed:
            return out + [f"let w{j}_{i}{u} = {w}4({w}_{i} + {k});" for j, w in enumerate(weights) for i in outs]
        for j, w in enumerate(weights):
            for i in outs:
                f = f"u{j}_{i}{u}"
                lo, hi = f16_halves(f)
                out.append(f"let {f} = {w}[{w}_{i} + {k}]; let w{j}_{i}{u} = {lo}; let h{j}_{i}{u} = {hi};")
        return out

    def fmas(u):
        sums = (lambda j, i, r: f"x{r}{u} * w{j}_{i}{u} + y{r}{u} * h{j}_{i}{u}") if packed else (lambda j, i, r: f"x{r}{u} * w{j}_{i}{u}")
        squares = [f"sq{r} = sq{r} + " + " + ".join(f"e{h}{r}{u} * e{h}{r}{u}" for h in halves) + ";" for r in ins] if norm else []
        return squares + [f"acc{j}_{i}_{r} = acc{j}_{i}_{r} + {sums(j, i, r)};" for j in range(len(weights)) for i in outs for r in ins]

    unroll = sg_unroll(shape)
    lines.append("var k = lane;")
    if unroll > 1:  # the steps' loads first, then their sums in order (the same sums as one step a pass)
        lines.append(f"for (; k + {unroll - 1}u * sgs < {steps}; k = k + {unroll}u * sgs) {{")
        lines += ["    " + x for u in range(unroll) for x in loads(f"(k + {u}u * sgs)", f"_{u}")]
        lines += ["    " + x for u in range(unroll) for x in fmas(f"_{u}")]
        lines.append("}")
    lines.append(f"for (; k < {steps}; k = k + sgs) {{")
    lines += ["    " + x for x in loads("k", "") + fmas("")]
    lines.append("}")
    lines += [f"let rstd{r} = {fold_rstd(sg_total(f'sq{r}'))};" for r in ins] if norm else []
    lines += sg_sums(len(weights), ins, outs, n, store, partners, scale=(lambda r: f"rstd{r}") if norm else None)
    lines.append("}")
    return "\n    ".join(lines)


def _sg_kernel(shape):
    store = lambda r: f"out[b * p.c_bs + (r0 + {r}u) * p.N + n] = epilogue(v0, b, r0 + {r}u, n);"  # noqa: E731
    return rows_main(CPU_WG, shape[0], SUBGROUP_BUILTINS) + fill(
        """    let nw = (wid.x + wid.y * nwg.x) * ${PER}u;
    let aoff4 = (b * p.a_bs + r0 * p.K) / 4u;
    $BODY
}
""",
        PER=sg_wg_rows(shape),
        BODY=gemv_sg_body(["bm"], "p.N", "(p.K / 4u)", store, f"b * p.b_bs / {PACKED_F16 if sg_packed(shape) else 4}u", shape=shape),
    )


# A [K, N] matrix on a CPU adapter: invocation n walks column n down K (neighbouring invocations
# read neighbouring addresses).
GEMV_N_CPU = fill(
    """
@compute @workgroup_size($CPU_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let b = wid.z;
    let n = (wid.x + wid.y * nwg.x) * ${CPU_WG}u + li;
    if (n >= p.N) { return; }
    let col = b * p.b_bs + n;
    let aoff = b * p.a_bs;
    var acc = 0.0;
    for (var k = 0u; k < p.K; k = k + 1u) { acc = acc + f32(a[aoff + k]) * f32(bm[col + k * p.N]); }
    out[b * p.c_bs + n] = epilogue(acc, b, 0u, n);
}
""",
    CPU_WG=CPU_WG,
)


def gemv_header(has_bias, inputs, types, activation):
    """gemm.py's header for a GEMV of `inputs`, `types` (Storage) and `activation`, and where
    types.added, the binding `added` after the uniform (Matmul.bindings)."""
    head = header(has_bias, inputs, bias=types.bias, out=types.out, activation=activation, added=types.added)
    return head + (added_binding(len(inputs) + has_bias + 2, types.added) if types.added else "")


def gemv_shader(transposed_b, has_bias, cpu=False, types=F32, step=1, group_rows=GEMV_GROUP_ROWS, activation=None):
    """`activation`: gemm.py's header's, as every shader of a product here."""
    kernel = (GEMV_T_CPU if cpu else gemv_t(step, group_rows)) if transposed_b else (GEMV_N_CPU if cpu else GEMV_N)
    inputs = (("a", types.a), ("bm", weight_binding_type(types.b, step)))
    return gemv_header(has_bias, inputs, types, activation) + kernel


def gemv_sg_shader(has_bias, shape=SG_GEMV, types=F32, activation=None):
    packed = sg_packed(shape)
    inputs = (("a", vec4_type(types.a)), ("bm", "vec4<u32>" if packed else vec4_type(types.b)))
    loaders = vec4_loader("a", types.a) + ("" if packed else vec4_loader("bm", types.b))
    return gemv_header(has_bias, inputs, types, activation) + loaders + _sg_kernel(shape)


def gemv_t4_shader(has_bias, types=F32, step=4, activation=None):
    weights = f"vec4<{types.b}>" if step == 4 else "vec4<u32>"  # step 8: f16 pairs
    return gemv_header(has_bias, (("a", types.a), ("bm", weights)), types, activation) + gemv_t4(step)


def gemv_grid(name, n, transposed_b, batch, per=None):
    """Output groups of `per` (by default the kernel's for the layout) folded into (x, y), batch in z."""
    per = per or (GEMV_ROWS if transposed_b else GEMV_COLS)
    x, y, _ = fold_grid(-(-n // per))
    if batch > MAX_WORKGROUPS:
        raise ValueError(f"{name}: batch {batch} exceeds {MAX_WORKGROUPS} workgroups")
    return (x, y, batch)


def _check_float(b, positions):
    for i in positions:
        t = b.tensor(i)
        if not is_float(t.dtype):
            b.fail(f"argument {i} has dtype {t.dtype}; only floating point is supported")


@dataclass(frozen=True)
class Product:
    """A product's live shape, which its variants choose by (`transposed`: an [N, K] weight)."""

    m: int
    n: int
    k: int
    batch: int
    b_bs: int
    transposed: bool
    f16_matrices: bool = False  # f16 rows and weights on a device whose GEMM takes them on f16 subgroup matrices
    exact_rows: int = BITWISE_ROWS  # ... past these rows (routes.py's exact_rows)

    @property
    def empty(self):
        return self.m * self.n * self.batch == 0

    @property
    def gemv(self):
        return not self.empty and (self.m == 1 or (self.transposed and self.m <= GEMV_MAX_ROWS))

    @property
    def gpu_gemv(self):
        """The rows the GPU GEMVs take (gpu_gemv_rows; to float_subgroup_rows on f16 matrices)."""
        return self.gemv and self.m <= min(gpu_gemv_rows(self.n), float_subgroup_rows(self.k, True, self.exact_rows) if self.f16_matrices else GEMV_MAX_ROWS)

    @property
    def vec4_rows(self):
        """An [N, K] weight whose rows (and batches) are whole vec4s."""
        return self.transposed and self.k % 4 == 0 and self.b_bs % 4 == 0

    @property
    def gpu_subgroup(self):
        """Rows a GPU's subgroup kernel takes: from SG_GPU_ROWS[0] to float_subgroup_rows(K) rows of
        an [N, K] weight of whole vec4 rows, narrower than an LM head (kernels/matmul/routes.py)."""
        return self.vec4_rows and SG_GPU_ROWS[0] <= self.m <= float_subgroup_rows(self.k, self.f16_matrices, self.exact_rows) and self.n < GEMV_T4_MIN_N

    @property
    def gpu_wide_subgroup(self):
        """The index of FLOAT_SG_GPU_WIDE's shape that takes rows of a weight of float_wide K, rows
        (and batches) of whole PACKED_F16s, narrower than an LM head; None past float_subgroup_rows
        or for other weights."""
        if self.packed_f16 and float_wide(self.k) and 1 <= self.m <= float_subgroup_rows(self.k, self.f16_matrices, self.exact_rows) and self.n < GEMV_T4_MIN_N:
            return shape_for_rows(FLOAT_SG_GPU_WIDE, self.m)
        return None

    @property
    def packed_f16(self):
        """An [N, K] weight whose rows (and batches) are whole PACKED_F16s (gemv_step, where it is f16)."""
        return self.transposed and self.k % PACKED_F16 == 0 and self.b_bs % PACKED_F16 == 0

    @property
    def wide(self):
        """Rows the vec4 GEMV takes: K and the batch stride whole vec4s, N >= GEMV_T4_MIN_N."""
        return self.vec4_rows and self.n >= GEMV_T4_MIN_N


@dataclass
class Matmul:
    """What a variant's build needs of one op: its operands and uniform."""

    b: object
    a: int
    bmat: int
    bias: int | None
    params: object
    transposed: bool
    activation: str | None = None  # header's (kernels/matmul/gemm.py)
    added: int | None = None  # a residual the epilogue adds after the bias (header's `added`)

    @property
    def bindings(self):
        return [self.a, self.bmat] + ([self.bias] if self.bias is not None else []) + [self.b.out, self.params] + ([self.added] if self.added is not None else [])

    @property
    def types(self):
        b = self.b
        bias, added = (b.storage(v) if v is not None else None for v in (self.bias, self.added))
        return Storage(b.storage(self.a), b.storage(self.bmat), bias or "f32", b.storage(b.out), added)


class Grid:
    """A one-dispatch route: `grid(shape)` when on."""

    def __init__(self, dispatch, grid):
        self.dispatch, self.grid = dispatch, grid

    def set(self, ctx, shape, on):
        ctx.set_grid(self.dispatch, self.grid(shape) if on else (0, 0, 0))


def _gemv_groups(s, rows=GEMV_GROUP_ROWS):
    return s.batch * -(-s.m // rows)


def _gemv(cpu, step=1, group_rows=GEMV_GROUP_ROWS):
    def build(b, mm):
        if step != 1 and not (mm.transposed and mm.types.b == "f16"):
            return None
        shader = gemv_shader(mm.transposed, mm.bias is not None, cpu, mm.types, step, group_rows, mm.activation)
        per, rows = (CPU_WG, CPU_GROUP_ROWS) if cpu else (None, group_rows)
        return Grid(b.dispatch(shader, mm.bindings), lambda s: gemv_grid(b.name, s.n, s.transposed, _gemv_groups(s, rows), per))

    return build


def _gemv_t4(step):
    def build(b, mm):
        if not mm.transposed or (step == 8 and mm.types.b != "f16"):
            return None
        shader = gemv_t4_shader(mm.bias is not None, mm.types, step, mm.activation)
        return Grid(b.dispatch(shader, mm.bindings), lambda s: gemv_grid(b.name, s.n, True, _gemv_groups(s), GEMV_T4_ROWS))

    return build


def _sg(shape, wide=False):
    """The subgroup kernel of `shape`; `wide`: one of FLOAT_SG_GPU_WIDE's (wide_sg_shape)."""

    def build(b, mm):
        if not (mm.transposed and b.subgroups):
            return None
        shape_ = wide_sg_shape(shape, mm.types.b == "f16") if wide else shape
        shader = gemv_sg_shader(mm.bias is not None, shape_, mm.types, mm.activation)
        return Grid(b.dispatch(shader, mm.bindings), lambda s: gemv_grid(b.name, s.n, True, _gemv_groups(s, shape_[0]), sg_wg_rows(shape_)))

    return build


def _gemm(b, mm):
    dims = b.graph.values[mm.bmat].dims[-2:]  # [N, K] or [K, N], at most
    load = weight_load(mm.types.a, mm.types.b, dims[-1]) if mm.transposed else float_load(False, mm.types.a, mm.types.b)
    most = tuple(dims) if mm.transposed else tuple(dims[::-1])
    # an LM head (GEMV_T4_MIN_N rows) takes the GEMM past WIDE_GEMV_ROWS decode rows, in SMALL_TILE to 32
    # rows as q4_linear.py's: H200, greedy bursts, two rounds in one call, Llama-3.2-1B fp16 at 24 / 32
    # streams 3,307-3,312 / 4,357-4,392 -> 3,522-3,544 / 4,668-4,700 tokens/s, SmolLM2 fp32 10,250-10,439
    # / 13,789-13,899 -> 10,507-10,588 / 13,756-14,041 (results/h200/kernel_choices/lm_head_small_tile/)
    small = most[0] >= GEMV_T4_MIN_N and b.adapter != CPU
    return GemmRoute(b, load, [mm.a, mm.bmat], mm.bias, b.out, mm.params, gemm_scratch(b, [b.out], most=most), most=most, activation=mm.activation,
                     small=small, added=mm.added)


# The variants of a product, first match wins (kernels/variants.py). Packed f16 weights take one
# row in a GEMV of its own (the same sums; one accumulator, not 8 rows'): H200, Llama-3.2-1B fp16,
# greedy bursts, one stream 590 / 589 -> 636 / 633 tokens/s (results/h200/kernel_choices/fp16_gemvs/).
MATMUL_VARIANTS = (
    Variant("gemv_vec8_f16", GPU_ONLY, lambda s: s.gpu_gemv and s.wide and s.packed_f16, _gemv_t4(8)),
    Variant("gemv_vec4", GPU_ONLY, lambda s: s.gpu_gemv and s.wide, _gemv_t4(4)),
    *(Variant(f"gemv_subgroup_wide_{shape[0]}", GPU_ONLY, lambda s, i=i: s.gpu_wide_subgroup == i, _sg(shape, wide=True)) for i, shape in enumerate(FLOAT_SG_GPU_WIDE)),
    Variant("gemv_subgroup", GPU_ONLY, lambda s: s.gpu_subgroup, _sg(SG_GPU)),
    Variant("gemv_packed_f16_row", GPU_ONLY, lambda s: s.gpu_gemv and s.m == 1 and s.packed_f16, _gemv(False, PACKED_F16, 1)),
    Variant("gemv_packed_f16", GPU_ONLY, lambda s: s.gpu_gemv and s.packed_f16, _gemv(False, PACKED_F16)),
    Variant("gemv", GPU_ONLY, lambda s: s.gpu_gemv, _gemv(cpu=False)),
    Variant("gemv_cpu_subgroup", CPU_ONLY, lambda s: s.m == 1 and s.vec4_rows, _sg(SG_GEMV)),
    Variant("gemm_cpu_subgroup", CPU_ONLY, lambda s: not s.empty and s.vec4_rows, _sg(SG_GEMM)),
    Variant("gemv_cpu", CPU_ONLY, lambda s: s.gemv, _gemv(cpu=True)),
    Variant("gemm", ANY, lambda s: not s.empty, _gemm),
)


def add_matmul(b, a, bmat, bias, transposed_b, shape_fn, alpha=1.0, beta=1.0, residual=False, activation=None, added=None):
    """Record the variants of out = alpha * A @ B + beta * bias and the resize hook.

    `a`, `bmat`, `bias` are value ids (`bias` None for none); `shape_fn(a_dims, b_dims)` returns
    (batch, M, N, K, a_batch_stride, b_batch_stride, out_dims) or raises ValueError. With
    `residual`, bias is a tensor of M * N elements in the output's row order (any shape), and the
    output takes its shape; so does `added` (a value id: a residual added after the bias, gemm.py's
    header); `activation`: a GELU after (gemm.py's header)."""
    has_bias = bias is not None
    params = b.params(PARAMS_SIZE)
    routes = Routes(MATMUL_VARIANTS, b, Matmul(b, a, bmat, bias, params, transposed_b, activation, added))
    matrices = transposed_b and f16_matrix_products(b, b.graph.values[bmat].dims[-1], [a, bmat])
    exact = exact_rows(b, matrices)

    def resize(ctx):
        batch, m, n, k, a_bs, b_bs, out_dims = shape_fn(ctx.dims(a), ctx.dims(bmat))
        bias_bs = bias_sm = bias_sn = 0
        for tensor in (bias if residual else None, added):
            if tensor is not None:
                out_dims = ctx.dims(tensor)
                if numel_of(out_dims) != m * n:
                    b.fail(f"residual of shape {tuple(out_dims)} for a product of {m} x {n}")
        if residual:
            bias_sm, bias_sn = n, 1
        elif has_bias:
            bias_dims = ctx.dims(bias)
            try:
                if len(bias_dims) > 2:
                    raise ValueError("more than 2 dims")
                bias_sm, bias_sn = broadcast_strides(bias_dims, (m, n))
                if any(d not in (1, t) for d, t in zip(reversed(bias_dims), (n, m))):
                    raise ValueError(f"does not broadcast to {(m, n)}")
            except ValueError as e:
                b.fail(f"bias of shape {tuple(bias_dims)}: {e}")
        shape = Product(m, n, k, batch, b_bs, transposed_b, matrices, exact)
        chosen = routes.set(ctx, shape)
        splits, kspan = routes.route("gemm").plan(m, n, k, batch) if chosen == "gemm" else (1, max(k, 1))
        fields = (m, n, k, batch, a_bs, b_bs, m * n, bias_bs, bias_sm, bias_sn, alpha, beta, splits, kspan)
        ctx.set_params(params, struct.pack(PARAMS_FORMAT, *fields))
        ctx.set_dims(b.out, out_dims)

    b.hook(resize)


def linear_shapes(b):
    def shape_fn(x, w):
        if len(w) != 2:
            b.fail(f"weight must be 2-D [N, K], got {tuple(w)}")
        if len(x) < 1:
            b.fail("input must have at least one dim")
        n, k = w
        if x[-1] != k:
            b.fail(f"input {tuple(x)} has K={x[-1]}, weight {tuple(w)} has K={k}")
        m = numel_of(x[:-1])
        return 1, m, n, k, 0, 0, tuple(x[:-1]) + (n,)

    return shape_fn


def mm_shapes(b):
    def shape_fn(a, bm):
        if len(a) != 2 or len(bm) != 2:
            b.fail(f"expects 2-D operands, got {tuple(a)} and {tuple(bm)}")
        (m, k), (k2, n) = a, bm
        if k != k2:
            b.fail(f"cannot multiply {tuple(a)} by {tuple(bm)}")
        return 1, m, n, k, 0, 0, (m, n)

    return shape_fn


def bmm_shapes(b):
    def shape_fn(a, bm):
        if len(a) != 3 or len(bm) != 3:
            b.fail(f"expects 3-D operands, got {tuple(a)} and {tuple(bm)}")
        (batch, m, k), (batch2, k2, n) = a, bm
        if batch != batch2 or k != k2:
            b.fail(f"cannot batch-multiply {tuple(a)} by {tuple(bm)}")
        return batch, m, n, k, m * k, k * n, (batch, m, n)

    return shape_fn


@op("aten.linear.default", half=True)
def linear(b):
    """[x [..., K], weight [N, K], bias [N] or None, out [..., N]]."""
    bias = None if b.is_none(2) else b.args[2]
    _check_float(b, [0, 1] + ([2] if bias is not None else []))
    add_matmul(b, b.args[0], b.args[1], bias, True, linear_shapes(b))


LINEAR_GELU = "pte_wgpu.linear_gelu"


@op(LINEAR_GELU, half=True)
def linear_gelu(b):
    """[x [..., K], weight [N, K], bias [N] or None, approximate ("none" or "tanh"), out]: gelu(x @
    weight.T + bias) (kernels/fusion.py: a linear whose result only fed a GELU)."""
    bias = None if b.is_none(2) else b.args[2]
    approximate = b.scalar(3, "none")
    if approximate not in GELU:
        b.fail(f"GELU approximation {approximate!r}, expected one of {sorted(GELU)}")
    _check_float(b, [0, 1] + ([2] if bias is not None else []))
    add_matmul(b, b.args[0], b.args[1], bias, True, linear_shapes(b), activation=approximate)


@op("pte_wgpu.linear_residual", half=True)
def linear_residual(b):
    """[x [..., K], weight [N, K], residual, out]: residual + x @ weight.T, out shaped as residual
    (kernels/fusion.py: a linear whose result only fed that add)."""
    _check_float(b, [0, 1, 2])
    add_matmul(b, b.args[0], b.args[1], b.args[2], True, linear_shapes(b), residual=True)


@op("pte_wgpu.linear_bias_residual", half=True)
def linear_bias_residual(b):
    """[x [..., K], weight [N, K], bias [N], residual, out]: residual + (x @ weight.T + bias), out
    shaped as residual, the linear's value rounded to out's type before the add, as the add read it
    (kernels/fusion.py: a linear with a bias whose result only fed that add: ViT's, BERT's; within
    a rounding of the two ops, not bit for bit)."""
    _check_float(b, [0, 1, 2, 3])
    add_matmul(b, b.args[0], b.args[1], b.args[2], True, linear_shapes(b), added=b.args[3])


@op("aten.mm.default", "aten::mm.out", half=True)
def mm(b):
    """[a [M, K], b [K, N], out [M, N]]."""
    _check_float(b, [0, 1])
    add_matmul(b, b.args[0], b.args[1], None, False, mm_shapes(b))


@op("aten.bmm.default", "aten::bmm.out", half=True)
def bmm(b):
    """[a [B, M, K], b [B, K, N], out [B, M, N]]."""
    _check_float(b, [0, 1])
    add_matmul(b, b.args[0], b.args[1], None, False, bmm_shapes(b))


@op("aten.addmm.default", "aten::addmm.out", half=True)
def addmm(b):
    """[bias, a [M, K], b [K, N], beta, alpha, out]: beta * bias + alpha * a @ b, bias broadcast."""
    beta, alpha = float(b.scalar(3, 1.0)), float(b.scalar(4, 1.0))
    # beta == 0 ignores bias entirely (torch does not propagate its NaNs).
    bias = b.args[0] if beta != 0.0 else None
    _check_float(b, [0, 1, 2])
    add_matmul(b, b.args[1], b.args[2], bias, False, mm_shapes(b), alpha=alpha, beta=beta)
