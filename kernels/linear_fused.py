"""Linears that kernels/fusion.py merged at load: several products of one input, and SwiGLU.

Each op keeps one GEMM dispatch per product (kernels/linear.py) for more than GEMV_MAX_ROWS rows
(prefill); up to that, one GEMV dispatch computes every product, each output summed in the same
order as the plain linear's GEMV, so results are bitwise those of the unfused ops.

- `pte_wgpu.linear_group` [x, w_0, ..., w_g-1, outs]: out_j = x @ w_j.T. Its GEMV's workgroups run
  over the products' 4-output groups one product after the other; each workgroup branches (a
  uniform branch) to its product's weight and output bindings.
- `pte_wgpu.linear_silu_mul` [x, w_gate, w_up, (out, gate, up)]: out = silu(x @ w_gate.T) *
  (x @ w_up.T). The GEMV reads both weights' rows for the same outputs and applies the gate in its
  epilogue; the GEMM route writes gate and up, then one elementwise dispatch.
- `pte_wgpu.rms_linear_group` and `pte_wgpu.rms_linear_silu_mul` take the input before an RMS
  norm as well, after the weights: (x, gamma, eps). Their GEMV normalizes its rows itself, with
  the sums and expression of et_vk.rms_norm's kernel, and the norm op before them
  (`pte_wgpu.rms_norm_for_gemm`, kernels/reduce.py) runs only for the GEMM route.

Every binding is stored as its tensor's type (f32, or f16 for float16), summed in f32.
"""

import struct

from resize.shapes import fold_grid, numel_of

from .gemm import PARAMS_SIZE, GemmRoute, fp32_load, gemm_scratch, params_bytes, storage
from .linear import CPU_GROUP_ROWS, CPU_WG, GEMV_MAX_ROWS, GEMV_REDUCE, GEMV_ROWS, _check_float, gemv_t_body, gemv_t_cpu_body, linear_shapes
from .registry import op
from .variants import CPU
from .wgsl import FLAT_INDEX, WG, flat_grid

SILU = "v0 / (1.0 + exp(-v0)) * v1"  # the same expression as pte_wgpu.silu_mul's
# Input rows per GEMV workgroup: 4, not the plain GEMV's 8. With q/k/v or gate and up in one
# kernel, 8 rows' accumulators cost more than they save: side by side on an H100, SwiGLU's GEMV
# took 12 µs at 4 rows against 18 at 8 for one decode row, and 36 against 42 for 16 rows.
GROUP_ROWS = 4


def _group_shader(count, norm, cpu, types):
    """GEMV over `count` products: params q = (M, K, eps, then N_j and first workgroup S_j per
    product); with `norm`, binding 0 holds the rows before the RMS norm. `types`: the bindings'
    storage types in order, the uniform left out."""
    fields = ["M: u32", "K: u32", "eps: f32"] + [f"N{j}: u32" for j in range(count)] + [f"S{j}: u32" for j in range(count)]
    fields += [f"pad{i}: u32" for i in range(-len(fields) % 4)]
    weights = [f"w{j}" for j in range(count)]
    outs = [f"o{j}" for j in range(count)]
    body_of, first = (gemv_t_cpu_body, "n") if cpu else (gemv_t_body, "n0")
    branches = []
    for j in range(count):
        store = lambda r, j=j: f"o{j}[(r0 + {r}u) * q.N{j} + n] = {types[-count + j]}(v0);"
        body = body_of([f"w{j}"], f"q.N{j}", "q.K", store, scale=_scale(norm, types[0]), group_rows=_rows(cpu))
        cond = f"if (wg < q.S{j + 1}) " if j + 1 < count else ""
        branches.append(f"{cond}{{\n    let {first} = {_first_output(f'wg - q.S{j}', cpu)};\n    {body}\n    }}")
    return _gemv_shader(fields, weights, outs, norm, " else ".join(branches), cpu, types)


def _swiglu_shader(norm, cpu, types):
    body_of, first = (gemv_t_cpu_body, "n") if cpu else (gemv_t_body, "n0")
    body = f"let {first} = {_first_output('wg', cpu)};\n    " + body_of(
        ["wg_", "wu_"], "q.N", "q.K", lambda r: f"out[(r0 + {r}u) * q.N + n] = {types[-1]}({SILU});", scale=_scale(norm, types[0]), group_rows=_rows(cpu)
    )
    return _gemv_shader(["M: u32", "K: u32", "eps: f32", "N: u32"], ["wg_", "wu_"], ["out"], norm, body, cpu, types)


def _rows(cpu):
    """Input rows per workgroup of the GPU GEMV, per invocation of the CPU one."""
    return CPU_GROUP_ROWS if cpu else GROUP_ROWS


def _first_output(group, cpu):
    """The GPU GEMV's first output of 4-output workgroup `group`; the CPU one's invocation's own."""
    return f"({group}) * {CPU_WG}u + li" if cpu else f"({group}) * 4u"


def _scale(norm, rows):
    """A fused norm's x * rstd * gamma as et_vk.rms_norm computes it, rounded to the storage type
    `rows` of the normalized rows that the op it replaced would have written."""
    return (lambda r, i, x: f"f32({rows}({x} * rstd{r} * f32(gamma[{i}])))") if norm else None


def _gemv_shader(fields, weights, outs, norm, body, cpu, types):
    lines = ["struct Q { " + ", ".join(fields) + " }"]
    reads = ["a"] + weights + (["gamma"] if norm else [])
    lines += [f"@group(0) @binding({i}) var<storage, read> {w}: array<{t}>;" for i, (w, t) in enumerate(zip(reads, types))]
    lines += [f"@group(0) @binding({len(reads) + i}) var<storage, read_write> {o}: array<{t}>;" for i, (o, t) in enumerate(zip(outs, types[len(reads):]))]
    lines.append(f"@group(0) @binding({len(reads) + len(outs)}) var<uniform> q: Q;")
    shared, size, rms = (_RMS_CPU_SHARED, CPU_WG, _rms_cpu(_rows(cpu))) if cpu else (GEMV_REDUCE, 256, _RMS)
    return "\n".join(lines) + shared + f"""
@compute @workgroup_size({size})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let r0 = wid.z * {_rows(cpu)}u;
    let rows = min({_rows(cpu)}u, q.M - r0);
    let wg = wid.x + wid.y * nwg.x;
    let aoff = r0 * q.K;
    {rms if norm else ""}
    {body}
}}
"""


# rstd0.. of the workgroup's rows as et_vk.rms_norm computes them (kernels/reduce.py,
# RMS_NORM_BODY): 128 invocations sum strided squares, a tree adds them; 4 rows per vec4.
_SQ = range(-(-GROUP_ROWS // 4))
_RMS = "\n    ".join(
    [f"var sq{i} = vec4<f32>(0.0);" for i in _SQ]
    + ["if (li < 128u) {", "for (var k = li; k < q.K; k = k + 128u) {"]
    + [f"if ({r}u < rows) {{ let c = f32(a[aoff + {r}u * q.K + k]); sq{r // 4}[{r % 4}] = sq{r // 4}[{r % 4}] + c * c; }}" for r in range(GROUP_ROWS)]
    + ["}", "}"]
    + [f"red[{i * 256}u + li] = sq{i};" for i in _SQ]
    + ["workgroupBarrier();", "for (var s = 64u; s > 0u; s = s >> 1u) {", "if (li < s) {"]
    + [f"red[{i * 256}u + li] = red[{i * 256}u + li] + red[{i * 256}u + li + s];" for i in _SQ]
    + ["}", "workgroupBarrier();", "}"]
    + [f"let ss{i} = red[{i * 256}u];" for i in _SQ]
    + ["workgroupBarrier();"]
    + [f"let rstd{r} = inverseSqrt(ss{r // 4}[{r % 4}] / f32(q.K) + q.eps);" for r in range(GROUP_ROWS)]
)

# The CPU variant's rstd0..: the same sums in the same order, with CPU_WG = 64 invocations and one
# barrier. Invocation li adds partials li and li + 64 (the tree's first step); then each invocation
# runs the rest of the tree (32, 16, ..) over the 64 sums itself.
_RMS_CPU_SHARED = "\nvar<workgroup> sq: array<vec4<f32>, 64>;\n"


def _rms_cpu(rows):
    """The CPU variant's rstd0.. of up to 4 rows (one vec4)."""
    return "\n    ".join(
        ["var lo = vec4<f32>(0.0);", "var hi = vec4<f32>(0.0);"]
        + [f"for (var k = li + {h}u; k < q.K; k = k + 128u) {{" + "".join(
            f" if ({r}u < rows) {{ let c = f32(a[aoff + {r}u * q.K + k]); {v}[{r}] = {v}[{r}] + c * c; }}" for r in range(rows)
        ) + " }" for h, v in ((0, "lo"), (64, "hi"))]
        + ["sq[li] = lo + hi;", "workgroupBarrier();", "var t: array<vec4<f32>, 32>;"]
        + ["for (var j = 0u; j < 32u; j = j + 1u) { t[j] = sq[j] + sq[j + 32u]; }"]
        + ["for (var s = 16u; s > 0u; s = s >> 1u) { for (var j = 0u; j < s; j = j + 1u) { t[j] = t[j] + t[j + s]; } }"]
        + [f"let rstd{r} = inverseSqrt(t[0][{r}] / f32(q.K) + q.eps);" for r in range(rows)]
    )


assert CPU_GROUP_ROWS <= 4 and CPU_WG == 64  # one vec4 of rows; invocations li and li + 64 span the 128 partials



def swiglu_elementwise(gate, up, out):
    """The GEMM route's silu(gate) * up over storage types `gate`, `up` and `out`."""
    return f"""
struct E {{ n: u32, pad0: u32, pad1: u32, pad2: u32 }}
@group(0) @binding(0) var<storage, read> gate: array<{gate}>;
@group(0) @binding(1) var<storage, read> up: array<{up}>;
@group(0) @binding(2) var<storage, read_write> out: array<{out}>;
@group(0) @binding(3) var<uniform> e: E;
{FLAT_INDEX}
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let i = flat_index(gid, nwg, {WG}u);
    if (i < e.n) {{ let v0 = f32(gate[i]); let v1 = f32(up[i]); out[i] = {out}({SILU}); }}
}}
"""


class _Products:
    """The GEMM route of products out_j = x @ w_j.T, and the live (M, K, N_j) they share."""

    def __init__(self, b, x, weights, outs):
        self.x = x
        self.shape_fn = linear_shapes(b.name)
        self.routes, scratch = [], gemm_scratch(b, outs)
        for w, out in zip(weights, outs):
            params = b.params(PARAMS_SIZE)
            load = fp32_load(True, storage(b, x), storage(b, w))
            self.routes.append((w, out, params, GemmRoute(b, load, [x, w], None, out, params, scratch)))

    def resize(self, ctx):
        """Set each product's shape and GEMM params; returns (gemv?, M, K, [N_j])."""
        xd, ns = ctx.dims(self.x), []
        for w, out, params, gemm in self.routes:
            _, m, n, k, _, _, out_dims = self.shape_fn(xd, ctx.dims(w))
            gemv, on = 0 < m <= GEMV_MAX_ROWS, m > GEMV_MAX_ROWS
            splits, kspan = gemm.plan(m, n, k, 1, on)
            ctx.set_params(params, params_bytes(m, n, k, split=(splits, kspan)))
            gemm.set_grids(ctx, m, n, 1, splits, on)
            ctx.set_dims(out, out_dims)
            ns.append(n)
        return gemv, m, k, ns


def _gemv_grid(workgroups, m, cpu):
    x, y, _ = fold_grid(workgroups)
    return (x, y, -(-m // _rows(cpu)))


def _norm_args(b, norm):
    """(weights, GEMV bindings before the weights, after them, eps) of a fused op's args."""
    if not norm:
        return b.args[1:-1], [b.args[0]], [], 0.0
    x, gamma = b.args[-4:-2]
    return b.args[1:-4], [x], [gamma], float(b.scalar(len(b.args) - 2, 1e-6))


@op("pte_wgpu.linear_group", "pte_wgpu.rms_linear_group", half=True)
def linear_group(b):
    norm = b.name.startswith("pte_wgpu.rms_")
    weights, head, tail, eps = _norm_args(b, norm)
    outs = b.graph.values[b.out].items
    _check_float(b, range(1 + len(weights)))
    products = _Products(b, b.args[0], weights, outs)
    q = b.params(4 * (3 + 2 * len(weights)))
    cpu = b.adapter == CPU  # the GEMV variant (kernels/variants.py); outputs per workgroup
    per = CPU_WG if cpu else GEMV_ROWS
    bound = [*head, *weights, *tail, *outs]
    gemv = b.dispatch(_group_shader(len(weights), norm, cpu, [storage(b, v) for v in bound]), [*bound, q])

    def resize(ctx):
        use_gemv, m, k, ns = products.resize(ctx)
        starts = [0]
        for n in ns:
            starts.append(starts[-1] + -(-n // per))
        ctx.set_params(q, struct.pack(f"<2If{2 * len(ns)}I", m, k, eps, *ns, *starts[:-1]))
        ctx.set_grid(gemv, _gemv_grid(starts[-1], m, cpu) if use_gemv else (0, 0, 0))

    b.hook(resize)


@op("pte_wgpu.linear_silu_mul", "pte_wgpu.rms_linear_silu_mul", half=True)
def linear_silu_mul(b):
    norm = b.name.startswith("pte_wgpu.rms_")
    (w_gate, w_up), head, tail, eps = _norm_args(b, norm)
    out, gate, up = b.graph.values[b.out].items
    _check_float(b, range(3))
    products = _Products(b, b.args[0], (w_gate, w_up), (gate, up))
    q, e = b.params(16), b.params(16)
    cpu = b.adapter == CPU  # the GEMV variant (kernels/variants.py); outputs per workgroup
    per = CPU_WG if cpu else GEMV_ROWS
    bound = [*head, w_gate, w_up, *tail, out]
    gemv = b.dispatch(_swiglu_shader(norm, cpu, [storage(b, v) for v in bound]), [*bound, q])
    gate_up = b.dispatch(swiglu_elementwise(*(storage(b, v) for v in (gate, up, out))), [gate, up, out, e])

    def resize(ctx):
        use_gemv, m, k, (n, n_up) = products.resize(ctx)
        if n != n_up:
            raise ValueError(f"{b.name}: gate and up weights have {n} and {n_up} rows")
        out_dims = ctx.dims(gate)
        ctx.set_params(q, struct.pack("<2IfI", m, k, eps, n))
        ctx.set_params(e, struct.pack("<4I", numel_of(out_dims), 0, 0, 0))
        ctx.set_grid(gemv, _gemv_grid(-(-n // per), m, cpu) if use_gemv else (0, 0, 0))
        ctx.set_grid(gate_up, flat_grid(numel_of(out_dims)) if not use_gemv and m else (0, 0, 0))
        ctx.set_dims(out, out_dims)

    b.hook(resize)
