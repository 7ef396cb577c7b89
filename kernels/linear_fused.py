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
"""

import struct

from resize.shapes import fold_grid, numel_of

from .linear import (
    GEMV_GROUP_ROWS, GEMV_MAX_ROWS, GEMV_REDUCE, GEMV_ROWS, PARAMS_FORMAT, PARAMS_SIZE,
    _check_f32, gemm_grid, gemm_shader, gemv_t_body, linear_shapes,
)  # fmt: skip
from .registry import op
from .wgsl import FLAT_INDEX, WG, flat_grid

SILU = "v0 / (1.0 + exp(-v0)) * v1"  # the same expression as pte_wgpu.silu_mul's


def _group_shader(count):
    """GEMV over `count` products: params q = (M, K, then N_j and first workgroup S_j per product)."""
    fields = ["M", "K"] + [f"N{j}" for j in range(count)] + [f"S{j}" for j in range(count)]
    fields += [f"pad{i}" for i in range(-len(fields) % 4)]
    lines = ["struct Q { " + ", ".join(f"{f}: u32" for f in fields) + " }"]
    lines.append("@group(0) @binding(0) var<storage, read> a: array<f32>;")
    lines += [f"@group(0) @binding({1 + j}) var<storage, read> w{j}: array<f32>;" for j in range(count)]
    lines += [f"@group(0) @binding({1 + count + j}) var<storage, read_write> o{j}: array<f32>;" for j in range(count)]
    lines.append(f"@group(0) @binding({1 + 2 * count}) var<uniform> q: Q;")
    branches = []
    for j in range(count):
        body = gemv_t_body([f"w{j}"], f"q.N{j}", "q.K", lambda r, j=j: f"o{j}[(r0 + {r}u) * q.N{j} + n] = v0;")
        cond = f"if (wg < q.S{j + 1}) " if j + 1 < count else ""
        branches.append(f"{cond}{{\n    let n0 = (wg - q.S{j}) * 4u;\n    {body}\n    }}")
    return "\n".join(lines) + GEMV_REDUCE + _gemv_main(" else ".join(branches))


def _gemv_main(body):
    return f"""
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let r0 = wid.z * {GEMV_GROUP_ROWS}u;
    let rows = min({GEMV_GROUP_ROWS}u, q.M - r0);
    let wg = wid.x + wid.y * nwg.x;
    let aoff = r0 * q.K;
    {body}
}}
"""


SWIGLU_GEMV = (
    """struct Q { M: u32, K: u32, N: u32, pad: u32 }
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> wg_: array<f32>;
@group(0) @binding(2) var<storage, read> wu_: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> q: Q;
"""
    + GEMV_REDUCE
    + _gemv_main(
        "let n0 = wg * 4u;\n    "
        + gemv_t_body(["wg_", "wu_"], "q.N", "q.K", lambda r: f"out[(r0 + {r}u) * q.N + n] = {SILU};")
    )
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
        self.b, self.x = b, x
        self.shape_fn = linear_shapes(b.name)
        self.routes = []
        for w, out in zip(weights, outs):
            params = b.params(PARAMS_SIZE)
            self.routes.append((w, out, params, b.dispatch(gemm_shader(True, False), [x, w, out, params])))

    def resize(self, ctx):
        """Set each product's shape and GEMM params; returns (gemv?, M, K, [N_j])."""
        xd, ns = ctx.dims(self.x), []
        for w, out, params, gemm in self.routes:
            _, m, n, k, _, _, out_dims = self.shape_fn(xd, ctx.dims(w))
            ctx.set_params(params, struct.pack(PARAMS_FORMAT, m, n, k, 1, 0, 0, m * n, 0, 0, 0, 1.0, 1.0))
            gemv = 0 < m <= GEMV_MAX_ROWS
            ctx.set_grid(gemm, gemm_grid(self.b.name, m, n, 1) if m > GEMV_MAX_ROWS else (0, 0, 0))
            ctx.set_dims(out, out_dims)
            ns.append(n)
        return gemv, m, k, ns


def _gemv_grid(workgroups, m):
    x, y, _ = fold_grid(workgroups)
    return (x, y, -(-m // GEMV_GROUP_ROWS))


@op("pte_wgpu.linear_group")
def linear_group(b):
    x, weights = b.args[0], b.args[1:-1]
    outs = b.graph.values[b.out].items
    _check_f32(b, range(len(b.args) - 1))
    products = _Products(b, x, weights, outs)
    q = b.params(4 * (2 + 2 * len(weights)))
    gemv = b.dispatch(_group_shader(len(weights)), [x, *weights, *outs, q])

    def resize(ctx):
        use_gemv, m, k, ns = products.resize(ctx)
        starts = [0]
        for n in ns:
            starts.append(starts[-1] + -(-n // GEMV_ROWS))
        ctx.set_params(q, struct.pack(f"<{2 + 2 * len(ns)}I", m, k, *ns, *starts[:-1]))
        ctx.set_grid(gemv, _gemv_grid(starts[-1], m) if use_gemv else (0, 0, 0))

    b.hook(resize)


@op("pte_wgpu.linear_silu_mul")
def linear_silu_mul(b):
    x, w_gate, w_up = b.args[:3]
    out, gate, up = b.graph.values[b.out].items
    _check_f32(b, range(3))
    products = _Products(b, x, (w_gate, w_up), (gate, up))
    q, e = b.params(16), b.params(16)
    gemv = b.dispatch(SWIGLU_GEMV, [x, w_gate, w_up, out, q])
    gate_up = b.dispatch(SWIGLU_ELEMENTWISE, [gate, up, out, e])

    def resize(ctx):
        use_gemv, m, k, (n, n_up) = products.resize(ctx)
        if n != n_up:
            raise ValueError(f"{b.name}: gate and up weights have {n} and {n_up} rows")
        out_dims = ctx.dims(gate)
        ctx.set_params(q, struct.pack("<4I", m, k, n, 0))
        ctx.set_params(e, struct.pack("<4I", numel_of(out_dims), 0, 0, 0))
        ctx.set_grid(gemv, _gemv_grid(-(-n // GEMV_ROWS), m) if use_gemv else (0, 0, 0))
        ctx.set_grid(gate_up, flat_grid(numel_of(out_dims)) if not use_gemv and m else (0, 0, 0))
        ctx.set_dims(out, out_dims)

    b.hook(resize)
