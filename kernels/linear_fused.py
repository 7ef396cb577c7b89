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
"""

import struct

from resize.shapes import fold_grid, numel_of

from .gemm import PARAMS_SIZE, GemmRoute, fp32_load, gemm_scratch, params_bytes
from .linear import GEMV_MAX_ROWS, GEMV_REDUCE, GEMV_ROWS, _check_f32, gemv_t_body, linear_shapes
from .registry import op
from .wgsl import FLAT_INDEX, WG, flat_grid

SILU = "v0 / (1.0 + exp(-v0)) * v1"  # the same expression as pte_wgpu.silu_mul's
# Input rows per GEMV workgroup: 4, not the plain GEMV's 8. With q/k/v or gate and up in one
# kernel, 8 rows' accumulators cost more than they save: side by side on an H100, SwiGLU's GEMV
# took 12 µs at 4 rows against 18 at 8 for one decode row, and 36 against 42 for 16 rows.
GROUP_ROWS = 4


def _group_shader(count, norm):
    """GEMV over `count` products: params q = (M, K, eps, then N_j and first workgroup S_j per
    product); with `norm`, binding 0 holds the rows before the RMS norm."""
    fields = ["M: u32", "K: u32", "eps: f32"] + [f"N{j}: u32" for j in range(count)] + [f"S{j}: u32" for j in range(count)]
    fields += [f"pad{i}: u32" for i in range(-len(fields) % 4)]
    weights = [f"w{j}" for j in range(count)]
    outs = [f"o{j}" for j in range(count)]
    branches = []
    for j in range(count):
        body = gemv_t_body([f"w{j}"], f"q.N{j}", "q.K", lambda r, j=j: f"o{j}[(r0 + {r}u) * q.N{j} + n] = v0;", scale=_scale(norm), group_rows=GROUP_ROWS)
        cond = f"if (wg < q.S{j + 1}) " if j + 1 < count else ""
        branches.append(f"{cond}{{\n    let n0 = (wg - q.S{j}) * 4u;\n    {body}\n    }}")
    return _gemv_shader(fields, weights, outs, norm, " else ".join(branches))


def _swiglu_shader(norm):
    body = "let n0 = wg * 4u;\n    " + gemv_t_body(
        ["wg_", "wu_"], "q.N", "q.K", lambda r: f"out[(r0 + {r}u) * q.N + n] = {SILU};", scale=_scale(norm), group_rows=GROUP_ROWS
    )
    return _gemv_shader(["M: u32", "K: u32", "eps: f32", "N: u32"], ["wg_", "wu_"], ["out"], norm, body)


def _scale(norm):
    return (lambda r: f" * rstd{r} * gamma[k]") if norm else None


def _gemv_shader(fields, weights, outs, norm, body):
    lines = ["struct Q { " + ", ".join(fields) + " }", "@group(0) @binding(0) var<storage, read> a: array<f32>;"]
    names = weights + (["gamma"] if norm else [])
    lines += [f"@group(0) @binding({1 + i}) var<storage, read> {w}: array<f32>;" for i, w in enumerate(names)]
    lines += [f"@group(0) @binding({1 + len(names) + i}) var<storage, read_write> {o}: array<f32>;" for i, o in enumerate(outs)]
    lines.append(f"@group(0) @binding({1 + len(names) + len(outs)}) var<uniform> q: Q;")
    return "\n".join(lines) + GEMV_REDUCE + f"""
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let r0 = wid.z * {GROUP_ROWS}u;
    let rows = min({GROUP_ROWS}u, q.M - r0);
    let wg = wid.x + wid.y * nwg.x;
    let aoff = r0 * q.K;
    {_RMS if norm else ""}
    {body}
}}
"""


# rstd0.. of the workgroup's rows as et_vk.rms_norm computes them (kernels/reduce.py,
# RMS_NORM_BODY): 128 invocations sum strided squares, a tree adds them; 4 rows per vec4.
_SQ = range(-(-GROUP_ROWS // 4))
_RMS = "\n    ".join(
    [f"var sq{i} = vec4<f32>(0.0);" for i in _SQ]
    + ["if (li < 128u) {", "for (var k = li; k < q.K; k = k + 128u) {"]
    + [f"if ({r}u < rows) {{ let c = a[aoff + {r}u * q.K + k]; sq{r // 4}[{r % 4}] = sq{r // 4}[{r % 4}] + c * c; }}" for r in range(GROUP_ROWS)]
    + ["}", "}"]
    + [f"red[{i * 256}u + li] = sq{i};" for i in _SQ]
    + ["workgroupBarrier();", "for (var s = 64u; s > 0u; s = s >> 1u) {", "if (li < s) {"]
    + [f"red[{i * 256}u + li] = red[{i * 256}u + li] + red[{i * 256}u + li + s];" for i in _SQ]
    + ["}", "workgroupBarrier();", "}"]
    + [f"let ss{i} = red[{i * 256}u];" for i in _SQ]
    + ["workgroupBarrier();"]
    + [f"let rstd{r} = inverseSqrt(ss{r // 4}[{r % 4}] / f32(q.K) + q.eps);" for r in range(GROUP_ROWS)]
)

SWIGLU_ELEMENTWISE = f"""
struct E {{ n: u32, pad0: u32, pad1: u32, pad2: u32 }}
@group(0) @binding(0) var<storage, read> gate: array<f32>;
@group(0) @binding(1) var<storage, read> up: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> e: E;
{FLAT_INDEX}
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let i = flat_index(gid, nwg, {WG}u);
    if (i < e.n) {{ let v0 = gate[i]; let v1 = up[i]; out[i] = {SILU}; }}
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
            self.routes.append((w, out, params, GemmRoute(b, fp32_load(True), [x, w], None, out, params, scratch)))

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


def _gemv_grid(workgroups, m):
    x, y, _ = fold_grid(workgroups)
    return (x, y, -(-m // GROUP_ROWS))


def _norm_args(b, norm):
    """(weights, GEMV bindings before the weights, after them, eps) of a fused op's args."""
    if not norm:
        return b.args[1:-1], [b.args[0]], [], 0.0
    x, gamma = b.args[-4:-2]
    return b.args[1:-4], [x], [gamma], float(b.scalar(len(b.args) - 2, 1e-6))


@op("pte_wgpu.linear_group", "pte_wgpu.rms_linear_group")
def linear_group(b):
    norm = b.name.startswith("pte_wgpu.rms_")
    weights, head, tail, eps = _norm_args(b, norm)
    outs = b.graph.values[b.out].items
    _check_f32(b, range(1 + len(weights)))
    products = _Products(b, b.args[0], weights, outs)
    q = b.params(4 * (3 + 2 * len(weights)))
    gemv = b.dispatch(_group_shader(len(weights), norm), [*head, *weights, *tail, *outs, q])

    def resize(ctx):
        use_gemv, m, k, ns = products.resize(ctx)
        starts = [0]
        for n in ns:
            starts.append(starts[-1] + -(-n // GEMV_ROWS))
        ctx.set_params(q, struct.pack(f"<2If{2 * len(ns)}I", m, k, eps, *ns, *starts[:-1]))
        ctx.set_grid(gemv, _gemv_grid(starts[-1], m) if use_gemv else (0, 0, 0))

    b.hook(resize)


@op("pte_wgpu.linear_silu_mul", "pte_wgpu.rms_linear_silu_mul")
def linear_silu_mul(b):
    norm = b.name.startswith("pte_wgpu.rms_")
    (w_gate, w_up), head, tail, eps = _norm_args(b, norm)
    out, gate, up = b.graph.values[b.out].items
    _check_f32(b, range(3))
    products = _Products(b, b.args[0], (w_gate, w_up), (gate, up))
    q, e = b.params(16), b.params(16)
    gemv = b.dispatch(_swiglu_shader(norm), [*head, w_gate, w_up, *tail, out, q])
    gate_up = b.dispatch(SWIGLU_ELEMENTWISE, [gate, up, out, e])

    def resize(ctx):
        use_gemv, m, k, (n, n_up) = products.resize(ctx)
        if n != n_up:
            raise ValueError(f"{b.name}: gate and up weights have {n} and {n_up} rows")
        out_dims = ctx.dims(gate)
        ctx.set_params(q, struct.pack("<2IfI", m, k, eps, n))
        ctx.set_params(e, struct.pack("<4I", numel_of(out_dims), 0, 0, 0))
        ctx.set_grid(gemv, _gemv_grid(-(-n // GEMV_ROWS), m) if use_gemv else (0, 0, 0))
        ctx.set_grid(gate_up, flat_grid(numel_of(out_dims)) if not use_gemv and m else (0, 0, 0))
        ctx.set_dims(out, out_dims)

    b.hook(resize)
