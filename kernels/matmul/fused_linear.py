"""Linears that kernels/fusion.py merged at load: several products of one input, and SwiGLU.

Each op keeps one GEMM dispatch per product (kernels/matmul/linear.py) for more than GEMV_MAX_ROWS rows
(prefill); up to that, one GEMV dispatch computes every product, each output summed in the same
order as the plain linear's GEMV, so results are bitwise those of the unfused ops.

- `pte_wgpu.linear_group` [x, w_0, ..., w_g-1, outs]: out_j = x @ w_j.T. Its GEMV's workgroups run
  over the products' 4-output groups one product after the other; each workgroup branches (a
  uniform branch) to its product's weight and output bindings.
- `pte_wgpu.linear_bias_group` [x, w_0, bias_0, ..., outs]: the same with a bias of each
  product's outputs (Qwen2.5's q, k and v), added in the GEMV's store as the plain linear's epilogue
  adds it (alpha and beta 1: the same bits); more rows run each product's GEMM with its bias.
- `pte_wgpu.linear_silu_mul` [x, w_gate, w_up, (out, gate, up)]: out = silu(x @ w_gate.T) *
  (x @ w_up.T). The GEMV reads both weights' rows for the same outputs and applies the gate in its
  epilogue; the GEMM route writes gate and up, then one elementwise dispatch.
- `pte_wgpu.rms_linear_group`, `pte_wgpu.rms_linear_bias_group` and `pte_wgpu.rms_linear_silu_mul` take the input before an RMS
  norm as well, after the weights: (x, gamma, eps). Their GEMV normalizes its rows itself, with
  the sums and expression of et_vk.rms_norm's kernel; the GPUs' subgroup kernels of float_wide K
  fold the norm into the products (linear.py's gemv_sg_body: the unfused ops' results to
  rounding, a row of a pass still bitwise the row alone); the norm op before them
  (`pte_wgpu.rms_norm_for_gemm`, kernels/tensor/reduce.py) runs only for the rows they do not take
  (kernels/matmul/routes.py's fused_norm_rows: the GEMM route, the other subgroup kernels; every
  row count on GPUs at K >= FLOAT_GEMM_MIN_K but float_wide K, float_norm_folds).

Every binding is stored as its tensor's type (f32, or f16 for float16), summed in f32.
"""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..attention.rope import rope_bindings, rope_store
from ..registry import op
from ..variants import CPU, GPU
from ..wgsl import FLAT_INDEX, SUBGROUP_BUILTINS, WG, fill, flat_grid, rounded, row_groups, row_groups_grid, vec4_loader, vec4_type
from .gemm import PARAMS_SIZE, GemmRoute, column_group, gemm_scratch, pair_reduce, params_bytes, weight_load
from .linear import (
    CPU_GROUP_ROWS,
    CPU_WG,
    GEMV_REDUCE,
    GEMV_ROWS,
    PACKED_F16,
    SG_GEMM,
    SG_GEMV,
    _check_float,
    gemv_sg_body,
    gemv_step,
    gemv_t_body,
    gemv_t_cpu_body,
    linear_shapes,
    sg_packed,
    sg_wg_rows,
    weight_binding_type,
    wide_sg_shape,
)
from .routes import (
    FLOAT_SG_GPU_WIDE,
    GEMV_MAX_ROWS,
    SG_GPU,
    SG_GPU_ROWS,
    exact_rows,
    f16_matrix_products,
    float_norm_folds,
    float_subgroup_rows,
    float_wide,
    fused_norm_rows,
    shape_for_rows,
    subgroup_products,
)

SILU = "$G / (1.0 + exp(-$G)) * $U"  # of the gate $G and up $U: the same expression as pte_wgpu.silu_mul's
# Input rows per GEMV workgroup: 4, not the plain GEMV's 8. With q/k/v or gate and up in one
# kernel, 8 rows' accumulators cost more than they save: side by side on an H100, SwiGLU's GEMV
# took 12 µs at 4 rows against 18 at 8 for one decode row, and 36 against 42 for 16 rows. One row
# takes a kernel of its own (the same sums, a quarter of the accumulators): H200, Llama-3.2-1B
# fp16, greedy bursts, one stream 528 / 532 -> 589 / 589 tokens/s (results/h200/kernel_choices/fp16_gemvs/).
GROUP_ROWS = 4
SUBGROUP = "subgroup"  # the third GEMV kind: CPU adapters with subgroups, K a multiple of 4


def _kind(b, weights):
    """(the GEMV the op builds, whether a GPU adds the subgroup kernel for SG_GPU_ROWS rows): GPU,
    CPU, or SUBGROUP (kernels/matmul/linear.py's gemv_sg_body) where the adapter class is CPU and
    `subgroup_products` holds (a device with subgroups, the weights' K whole vec4s, every tensor of
    the op f32 or f16)."""
    tensors = [v for i, v in enumerate(b.args) if b.is_tensor(i)] + list(b.graph.values[b.out].items)
    dims = [b.graph.values[w].dims for w in weights]
    sg = all(len(d) == 2 and subgroup_products(b, d[1], tensors) for d in dims)
    if b.adapter != CPU:
        return GPU, sg
    return (SUBGROUP if sg else CPU), False


def _body(kind, shape, weights, n, store, norm, rows, partners=False):
    """The GEMV statements of `kind` and `shape` for `weights`; `store(r)` writes input row r's
    output n; `rows`: the storage type of the rows a fused norm normalizes (_scale); `partners`
    (GPU only): the store reads the other output of n's pair too (kernels/matmul/linear.py gemv_t_body)."""
    if kind == SUBGROUP:  # normalizes where the GPUs' kernels of float_wide K fold the norm (fused_norm_rows)
        first = f"let nw = wg * {_per(kind, shape, len(weights))}u;\n    "
        return first + gemv_sg_body(weights, n, "(q.K / 4u)", store, shape=shape, partners=partners, norm=norm)
    if kind == CPU:
        return f"let n = wg * {CPU_WG}u + li;\n    " + gemv_t_cpu_body(weights, n, "q.K", store, scale=_scale(norm, rows), group_rows=shape[0])
    body = gemv_t_body(weights, n, "q.K", store, scale=_scale(norm, rows), group_rows=shape[0], partners=partners, step=shape[1])
    return "let n0 = wg * 4u;\n    " + body


def _group_shader(count, norm, kind, shape, types, out_types, rope=None, biased=False):
    """GEMV over `count` products: params q = (M, K, eps, then N_j and first workgroup S_j per
    product, then `rope`'s fields); with `norm`, binding 0 holds the rows before the RMS norm.
    `types`: the bindings' storage types in order, the uniform left out; `out_types` the products'.
    With `rope` (a GPU's kernels: the GEMV and the subgroup kernels) the epilogue rotates q and k
    and stores k and v in the caches (rope_store), with a lean one binding no product. With
    `biased`, a bias of each product's outputs (bound after the weights and gamma) is added to them
    as the plain linear's epilogue adds it."""
    fields = ["M: u32", "K: u32", "eps: f32"] + [f"N{j}: u32" for j in range(count)] + [f"S{j}: u32" for j in range(count)]
    fields += ["half: u32", "dim: u32", "row: u32", "blocks: u32"] if rope else []
    fields += [f"pad{i}: u32" for i in range(-len(fields) % 4)]
    weights = [f"w{j}" for j in range(count)]
    rotates = rope is not None
    outs = [] if rotates and rope.lean else [f"o{j}" for j in range(count)]
    branches = []
    for j in range(count):
        if rotates:
            store = lambda r, j=j: rope_store(j, f"r0 + {r}u", out_types[j], rope, biased)  # noqa: E731
        else:
            value = f"v0 + f32(bias{j}[n])" if biased else "v0"
            store = lambda r, j=j, value=value: f"o{j}[(r0 + {r}u) * q.N{j} + n] = {out_types[j]}({value});"
        body = _body(kind, shape, [f"w{j}"], f"q.N{j}", store, norm, types[0], partners=rotates)
        cond = f"if (wg0 < q.S{j + 1}) " if j + 1 < count else ""
        branches.append(f"{cond}{{\n    let wg = wg0 - q.S{j};\n    {body}\n    }}")
    extra = rope_bindings(len(types) + 1, rope) if rotates else ""
    biases = [f"bias{j}" for j in range(count)] if biased else []
    return _gemv_shader(fields, weights, outs, norm, " else ".join(branches), kind, shape, types, extra, biases)


def _swiglu_shader(norm, kind, shape, types):
    store = lambda r: f"out[(r0 + {r}u) * q.N + n] = {types[-1]}({fill(SILU, G='v0', U='v1')});"
    body = "let wg = wg0;\n    " + _body(kind, shape, ["wg_", "wu_"], "q.N", store, norm, types[0])
    return _gemv_shader(["M: u32", "K: u32", "eps: f32", "N: u32"], ["wg_", "wu_"], ["out"], norm, body, kind, shape, types)


class _Gemvs:
    """An op's GEMV dispatches, each of a kind and a shape (input rows a workgroup or invocation,
    and for SUBGROUP the weight rows a subgroup takes, for GPU the weights a load, gemv_step,
    kernels/matmul/linear.py): for GPU one of one row and one of GROUP_ROWS; for CPU one; for
    SUBGROUP, SG_GEMV for one row and SG_GEMM for any other count (the op has no GEMM route then);
    a GPU with subgroups (`gpu_sg`) adds SUBGROUP at SG_GPU from SG_GPU_ROWS[0] rows to
    float_subgroup_rows (the GEMM route then takes only more), or for weights of float_wide K has
    only SUBGROUP, at FLOAT_SG_GPU_WIDE's shapes for every row count to float_subgroup_rows.
    `weights`: the weights each output group reads (SwiGLU: 2).
    `shader_of(kind, shape, norm, types)`: the shader, normalizing its rows itself with `norm`,
    `types` its bindings' storage types in order (the uniform, last, left out); `head` and `tail`:
    the bindings around the weights (kernels/matmul/fused_linear.py's _norm_args). With a norm, the
    subgroup kernels of float_wide K fold it (to the rows the norm op leaves them, which they then
    take, kernels/matmul/routes.py's fused_norm_rows), the others read the normalized rows of
    `pte_wgpu.rms_norm_for_gemm` (b.args[0], run for those rows then). `extra`: bindings every
    dispatch takes last (a RoPE epilogue's)."""

    def __init__(self, b, kind, weights, shader_of, head, tail, after, gpu_sg=False, extra=()):
        self.kind, self.weights = kind, weights
        k = b.graph.values[after[0][0]].dims[-1]
        self.wide = gpu_sg and float_wide(k)
        step = min(gemv_step(b.storage(w), b.graph.values[w].dims[-1]) for w in after[0])
        if self.wide:  # a subgroup's weight rows: at least one output of each weight, a pair with a RoPE epilogue
            least = weights * (2 if extra else 1)
            shapes = tuple((SUBGROUP, wide_sg_shape((rows, max(most, least), groups), step == PACKED_F16)) for rows, most, groups in FLOAT_SG_GPU_WIDE)
        elif kind == SUBGROUP:  # SG_GEMV's weight rows for each weight: SwiGLU's workgroups as many as a linear's
            shapes = ((SUBGROUP, (1, SG_GEMV[1] * weights)), (SUBGROUP, SG_GEMM))
        else:
            shapes = (((GPU, (1, step)), (GPU, (GROUP_ROWS, step))) if kind == GPU else ((kind, (CPU_GROUP_ROWS, None)),)) + (((SUBGROUP, SG_GPU),) if gpu_sg else ())
        matrices = f16_matrix_products(b, k, [b.args[0], *after[0]])
        self.most_rows = float_subgroup_rows(k, matrices, exact_rows(b, matrices)) if gpu_sg else GEMV_MAX_ROWS  # more: the GEMM route
        # the wide subgroup kernels fold the norm: they take the rows the norm op leaves them (its rule, from its own tensors)
        folds = fused_norm_rows(b, k, (head[0], tail[0], b.args[0])) if tail and self.wide else 0
        self.most_rows = folds or self.most_rows
        self.dispatches = []
        for d_kind, shape in shapes:
            norm = bool(folds) if self.wide else bool(tail) and d_kind != SUBGROUP and float_norm_folds(b, k)
            around = (head, tail) if norm else ([b.args[0]], [])
            bound = [*around[0], *after[0], *around[1], *after[1]]
            shader = shader_of(d_kind, shape, norm, [b.storage(v) for v in bound[:-1]])
            self.dispatches.append((b.dispatch(shader, bound + list(extra)), d_kind, shape))

    def _index(self, m):
        if self.wide:
            return shape_for_rows(FLOAT_SG_GPU_WIDE, m)
        if self.kind == CPU:
            return 0
        if self.kind == SUBGROUP:
            return 0 if m == 1 else 1
        if len(self.dispatches) > 2 and m >= SG_GPU_ROWS[0]:  # GPU: one row, GROUP_ROWS, the subgroup kernel
            return 2
        return 0 if m == 1 else 1

    def choose(self, m):
        """(dispatch, shape, outputs per workgroup) for M rows."""
        d, kind, shape = self.dispatches[self._index(m)]
        return d, shape, _per(kind, shape, self.weights)

    def set(self, ctx, outputs, m, on):
        """Grids for outputs of M rows (`outputs`: their count, or per product), all off unless `on`."""
        chosen, shape, per = self.choose(m)
        grid = row_groups_grid(sum(-(-n // per) for n in outputs), m, shape[0])
        for d, _, _ in self.dispatches:
            ctx.set_grid(d, grid if on and d == chosen else (0, 0, 0))


def _per(kind, shape, weights):
    """Outputs per workgroup."""
    return sg_wg_rows(shape, weights) if kind == SUBGROUP else {GPU: GEMV_ROWS, CPU: CPU_WG}[kind]


def _scale(norm, rows):
    """A fused norm's x * rstd * gamma as et_vk.rms_norm computes it, rounded to the storage type
    `rows` of the normalized rows that the op it replaced would have written."""
    return (lambda r, i, x: rounded(f"{x} * rstd{r} * f32(gamma[{i}])", rows)) if norm else None


# The fused GEMVs' entry: workgroup (wg0, group of rows: kernels/wgsl.py's row_groups) takes its
# outputs for input rows r0 .., `rows` of them live; $RMS their norm's rstd0.. where the kernel
# normalizes them
GEMV_MAIN = """
@compute @workgroup_size($SIZE)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32$BUILTINS) {$ROW_GROUPS
    let rows = min(${ROWS}u, q.M - r0);
    let aoff = r0 * q.K;
    let aoff4 = aoff / 4u;
    $RMS
    $BODY
}
"""


def _gemv_shader(fields, weights, outs, norm, body, kind, shape, types, extra="", biases=()):
    """`types`: the bindings' storage types in order, the uniform left out; `extra`: WGSL after the
    uniform (more bindings); `biases`: bindings read element by element after gamma. The subgroup
    GEMV reads the input, weights and gamma as vec4s, a GPU's weights as its shape's step
    (kernels/matmul/linear.py's gemv_step); a_at(i) is element i as f32 either way."""
    reads = ["a"] + weights + (["gamma"] if norm else []) + list(biases)
    vec4, rows = kind == SUBGROUP, shape[0]
    packed = [w for w in weights if vec4 and sg_packed(shape)]  # bound as vec4<u32> of f16 pairs
    lines = ["struct Q { " + ", ".join(fields) + " }"]
    kinds = [
        t if w in biases else "vec4<u32>" if w in packed else vec4_type(t) if vec4 else weight_binding_type(t, shape[1]) if w in weights and kind == GPU else t
        for w, t in zip(reads, types)
    ]
    lines += [f"@group(0) @binding({i}) var<storage, read> {w}: array<{t}>;" for i, (w, t) in enumerate(zip(reads, kinds))]
    lines += [vec4_loader(w, t) for w, t in zip(reads, types) if w not in packed and w not in biases] if vec4 else []
    lines += [f"@group(0) @binding({len(reads) + i}) var<storage, read_write> {o}: array<{t}>;" for i, (o, t) in enumerate(zip(outs, types[len(reads):]))]
    lines.append(f"@group(0) @binding({len(reads) + len(outs)}) var<uniform> q: Q;{extra}")
    lines.append(f"fn a_at(i: u32) -> f32 {{ return {'a4(i / 4u)[i % 4u]' if vec4 else 'f32(a[i])'}; }}")
    shared, size, rms = (GEMV_REDUCE, 256, _RMS) if kind == GPU else (_RMS_CPU_SHARED, CPU_WG, _rms_cpu(rows))
    shared = "" if vec4 else shared  # (the subgroup kernels sum in their lanes: no workgroup memory)
    return "\n".join(lines) + shared + fill(
        GEMV_MAIN,
        SIZE=size,
        BUILTINS=SUBGROUP_BUILTINS if kind == SUBGROUP else "",
        ROWS=rows,
        ROW_GROUPS=row_groups("q.M", rows),
        RMS=rms if norm and not vec4 else "",  # (the subgroup kernels fold the norm as they read the rows)
        BODY=body,
    )


# rstd0.. of the workgroup's rows as et_vk.rms_norm computes them (kernels/tensor/reduce.py's
# rms_norm_body): 128 invocations sum strided squares, a tree adds them; 4 rows per vec4.
_SQ = range(-(-GROUP_ROWS // 4))
_RMS = "\n    ".join(
    [f"var sq{i} = vec4<f32>(0.0);" for i in _SQ]
    + ["if (li < 128u) {", "for (var k = li; k < q.K; k = k + 128u) {"]
    + [f"if ({r}u < rows) {{ let c = a_at(aoff + {r}u * q.K + k); sq{r // 4}[{r % 4}] = sq{r // 4}[{r % 4}] + c * c; }}" for r in range(GROUP_ROWS)]
    + ["}", "}"]
    + [f"red[{i * 256}u + li] = sq{i};" for i in _SQ]
    + ["workgroupBarrier();", "for (var s = 64u; s > 0u; s = s >> 1u) {", "if (li < s) {"]
    + [f"red[{i * 256}u + li] = red[{i * 256}u + li] + red[{i * 256}u + li + s];" for i in _SQ]
    + ["}", "workgroupBarrier();", "}"]
    + [f"let ss{i} = red[{i * 256}u];" for i in _SQ]
    + ["workgroupBarrier();"]
    + [f"let rstd{r} = inverseSqrt(ss{r // 4}[{r % 4}] / f32(q.K) + q.eps);" for r in range(GROUP_ROWS)]
)

# The CPU variants' rstd0..: the same sums in the same order, with CPU_WG = 64 invocations and two
# barriers. Invocation li adds partials li and li + 64 (the tree's first step); then invocation 0
# runs the rest of the tree (32, 16, ..) over the 64 sums and leaves the total in the first (each
# invocation running it read 64 workgroup vec4s, as many loads as a decode row's GEMV made).
# Rows in vec4s of 4, up to _RMS_CPU_VEC4S of them.
_RMS_CPU_VEC4S = 2
_RMS_CPU_SHARED = f"\nvar<workgroup> sq: array<vec4<f32>, {64 * _RMS_CPU_VEC4S}>;\n"


def _rms_cpu(rows):
    """The CPU variants' rstd0.. of up to 4 * _RMS_CPU_VEC4S rows."""
    vs = range(-(-rows // 4))
    lines = [f"var {h}{v} = vec4<f32>(0.0);" for v in vs for h in ("lo", "hi")]
    for h, half in ((0, "lo"), (64, "hi")):
        adds = "".join(f" if ({r}u < rows) {{ let c = a_at(aoff + {r}u * q.K + k); {half}{r // 4}[{r % 4}] = {half}{r // 4}[{r % 4}] + c * c; }}" for r in range(rows))
        lines.append(f"for (var k = li + {h}u; k < q.K; k = k + 128u) {{{adds} }}")
    lines += [f"sq[{64 * v}u + li] = lo{v} + hi{v};" for v in vs] + ["workgroupBarrier();", "if (li == 0u) {", "var t: array<vec4<f32>, 32>;"]
    for v in vs:
        lines.append(f"for (var j = 0u; j < 32u; j = j + 1u) {{ t[j] = sq[{64 * v}u + j] + sq[{64 * v}u + j + 32u]; }}")
        lines.append("for (var s = 16u; s > 0u; s = s >> 1u) { for (var j = 0u; j < s; j = j + 1u) { t[j] = t[j] + t[j + s]; } }")
        lines.append(f"sq[{64 * v}u] = t[0];")
    lines += ["}", "workgroupBarrier();"]
    lines += [f"let rstd{r} = inverseSqrt(sq[{64 * (r // 4)}u][{r % 4}] / f32(q.K) + q.eps);" for r in range(rows)]
    return "\n    ".join(lines)


assert CPU_GROUP_ROWS <= 4 * _RMS_CPU_VEC4S and CPU_WG == 64  # invocations li and li + 64 span the 128 partials


SWIGLU = """
struct E { n: u32, pad0: u32, pad1: u32, pad2: u32 }
@group(0) @binding(0) var<storage, read> gate: array<$GATE>;
@group(0) @binding(1) var<storage, read> up: array<$UP>;
@group(0) @binding(2) var<storage, read_write> out: array<$OUT>;
@group(0) @binding(3) var<uniform> e: E;
$FLAT_INDEX
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg, ${WG}u);
    if (i < e.n) { let v0 = f32(gate[i]); let v1 = f32(up[i]); out[i] = $OUT($SILU); }
}
"""


def swiglu_elementwise(gate, up, out):
    """The GEMM route's silu(gate) * up over storage types `gate`, `up` and `out`."""
    return fill(SWIGLU, GATE=gate, UP=up, OUT=out, FLAT_INDEX=FLAT_INDEX, WG=WG, SILU=fill(SILU, G="v0", U="v1"))


# Split-K's reduce of gate | up as one GEMM over their columns (gemm.py's column_store), gating as
# it goes: gate's column n and up's of a row summed and stored as GEMM_REDUCE does them, then
# silu(gate) * up of the values stored, as SWIGLU reads them, so a pass of split products takes one
# dispatch less.
SWIGLU_FINISH = """    let v0 = f32(epilogue(a, 0u, m, c0));
    let v1 = f32(epilogue(z, 0u, m, c1));
    finished[i] = $OUT($SILU);"""


def swiglu_reduce(b, out):
    """GemmRoute's `finish` of a gate | up column group gated into the tensor `out`."""
    t = b.storage(out)

    def declared(first):
        return f"@group(0) @binding({first}) var<storage, read_write> finished: array<{t}>;\n"

    return declared, pair_reduce("i % np", "np + i % np", fill(SWIGLU_FINISH, OUT=t, SILU=fill(SILU, G="v0", U="v1"))), [out]


class _Products:
    """The GEMM route of products out_j = x @ w_j.T (none where the GEMV takes every row count,
    `gemm` False), and the live (M, K, N_j) they share. The products run as one GEMM over their
    columns side by side (gemm.py's column_group: one dispatch, and one wave of workgroups where
    each alone would leave the GPU half idle) where their outputs share a storage type and no
    product has a bias (`biases`: one a product, or none), else each its own GEMM."""

    def __init__(self, b, x, weights, outs, gemm=True, gemv_rows=GEMV_MAX_ROWS, biases=(), gated=None):
        self.x, self.weights, self.outs, self.gemv_rows, self.biases = x, weights, outs, gemv_rows, biases
        self.shape_fn = linear_shapes(b)
        self.routes = []
        self.gates = False  # whether the live shape's split-K reduce writes `gated` (SwiGLU's out: swiglu_reduce)
        if not gemm:
            return
        together = len({b.storage(o) for o in outs}) == 1 and not biases
        sizes = [tuple(b.graph.values[w].dims[:2]) for w in weights]  # (N, K) of each
        most = (sum(n for n, _ in sizes), b.graph.values[x].dims[-1]) if together else tuple(map(max, zip(*sizes)))
        scratch = gemm_scratch(b, outs, together, most)
        if together:
            types = [b.storage(w) for w in weights]
            load, store = column_group(b.storage(x), types, [n for n, _ in sizes], most[1])
            params = b.params(PARAMS_SIZE)
            finish = swiglu_reduce(b, gated) if gated is not None else None
            route = GemmRoute(b, load, [x, *weights], None, outs[0], params, scratch, store=store, more_outs=outs[1:], most=most, finish=finish)
            self.routes.append((params, route))
            return
        for w, bias, out, size in zip(weights, biases or [None] * len(weights), outs, sizes):
            params = b.params(PARAMS_SIZE)
            load = weight_load(b.storage(x), b.storage(w), size[1])
            self.routes.append((params, GemmRoute(b, load, [x, w], bias, out, params, scratch, most=size)))

    def resize(self, ctx):
        """Set each product's shape and the GEMM params; returns (gemv?, M, K, [N_j])."""
        xd, ns = ctx.dims(self.x), []
        for w, out in zip(self.weights, self.outs):
            _, m, n, k, _, _, out_dims = self.shape_fn(xd, ctx.dims(w))
            ctx.set_dims(out, out_dims)
            ns.append(n)
        gemv, on = (0 < m <= self.gemv_rows, m > self.gemv_rows) if self.routes else (m > 0, False)
        widths = [sum(ns)] if len(self.routes) == 1 else ns
        self.gates = False
        for (params, gemm), n in zip(self.routes, widths):
            splits, kspan = gemm.plan(m, n, k, 1, on)
            ctx.set_params(params, params_bytes(m, n, k, bias=(0, 0, 1) if self.biases else (0, 0, 0), split=(splits, kspan)))
            gemm.set_grids(ctx, m, n, k, 1, splits, on)
            self.gates = self.gates or (on and gemm.finishes(splits))
        return gemv, m, k, ns


def fused_operands(name, args):
    """(operands, per, norm) of the fused products op `name` (a q/k/v group, SwiGLU's pair; float
    or 4-bit, with biases or not, with an RMS norm or not) given its `args`: x (and a 4-bit one's
    group size), each product's `per` operands (its weight, its 4-bit scales, its bias), then
    with a norm its input, gamma and eps, then the output. `norm`: (norm input, gamma, eps's arg
    index) or None."""
    q4, normed = "q4_" in name, name.startswith("pte_wgpu.rms_")
    per = (2 if q4 else 1) + ("_bias_group" in name)
    operands = args[(2 if q4 else 1) : (-4 if normed else -1)]
    return operands, per, (args[-4], args[-3], len(args) - 2) if normed else None


def _norm_args(b):
    """(operands, per, GEMV bindings before the operands, after them, eps) of a fused op's args
    (fused_operands' operands and per)."""
    operands, per, norm = fused_operands(b.name, b.args)
    if norm is None:
        return operands, per, [b.args[0]], [], 0.0
    x, gamma, eps = norm
    return operands, per, [x], [gamma], float(b.scalar(eps, 1e-6))


@op("pte_wgpu.linear_group", "pte_wgpu.rms_linear_group", "pte_wgpu.linear_bias_group", "pte_wgpu.rms_linear_bias_group", half=True)
def linear_group(b):
    b.hook(linear_group_routes(b))


def linear_group_routes(b, rope=None):
    """Record the op's routes; returns its hook, which returns whether a kernel's epilogue took
    `rope` (a GPU's GEMV or subgroup kernel took the rows)."""
    operands, per, head, tail, eps = _norm_args(b)
    biased = per == 2  # (weight, bias) a product
    weights, biases = (list(operands[0::2]), list(operands[1::2])) if biased else (operands, [])
    outs = b.graph.values[b.out].items
    _check_float(b, range(1 + len(operands)))
    kind, gpu_sg = _kind(b, weights)  # the GEMV variant (kernels/variants.py)
    q = b.params(4 * (3 + 2 * len(weights) + (4 if rope else 0)))
    epilogue = rope if kind == GPU else None  # a GPU's kernels rotate in their epilogue
    lean = epilogue is not None and epilogue.lean  # which stores, and binds, neither the products nor rotated k
    out_types = [b.storage(o) for o in outs]
    shader_of = lambda d_kind, shape, norm, types: _group_shader(len(weights), norm, d_kind, shape, types, out_types, epilogue, biased)  # noqa: E731
    gemvs = _Gemvs(b, kind, 1, shader_of, head, tail, (weights, [*biases, *([] if lean else outs), q]), gpu_sg, epilogue.bound if epilogue else ())
    products = _Products(b, b.args[0], weights, outs, kind != SUBGROUP, gemvs.most_rows, biases)

    def resize(ctx):
        use_gemv, m, k, ns = products.resize(ctx)
        per = gemvs.choose(m)[2]
        starts = [0]
        for n in ns:
            starts.append(starts[-1] + -(-n // per))
        fields = rope.fields if rope else ()
        ctx.set_params(q, struct.pack(f"<2If{2 * len(ns) + len(fields)}I", m, k, eps, *ns, *starts[:-1], *fields))
        gemvs.set(ctx, ns, m, use_gemv)
        return epilogue is not None and use_gemv

    return resize


@op("pte_wgpu.linear_silu_mul", "pte_wgpu.rms_linear_silu_mul", half=True)
def linear_silu_mul(b):
    (w_gate, w_up), _, head, tail, eps = _norm_args(b)
    out, gate, up = b.graph.values[b.out].items
    _check_float(b, range(3))
    kind, gpu_sg = _kind(b, (w_gate, w_up))  # the GEMV variant (kernels/variants.py)
    q, e = b.params(16), b.params(16)
    shader_of = lambda kind, shape, norm, types: _swiglu_shader(norm, kind, shape, types)  # noqa: E731
    gemvs = _Gemvs(b, kind, 2, shader_of, head, tail, ([w_gate, w_up], [out, q]), gpu_sg)
    products = _Products(b, b.args[0], (w_gate, w_up), (gate, up), kind != SUBGROUP, gemvs.most_rows, gated=out)
    gate_up = b.dispatch(swiglu_elementwise(*(b.storage(v) for v in (gate, up, out))), [gate, up, out, e])

    def resize(ctx):
        use_gemv, m, k, (n, n_up) = products.resize(ctx)
        if n != n_up:
            b.fail(f"gate and up weights have {n} and {n_up} rows")
        out_dims = ctx.dims(gate)
        ctx.set_params(q, struct.pack("<2IfI", m, k, eps, n))
        ctx.set_params(e, struct.pack("<4I", numel_of(out_dims), 0, 0, 0))
        gemvs.set(ctx, [n], m, use_gemv)
        ctx.set_grid(gate_up, flat_grid(numel_of(out_dims)) if not use_gemv and m and not products.gates else (0, 0, 0))
        ctx.set_dims(out, out_dims)

    b.hook(resize)
