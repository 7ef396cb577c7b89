"""4-bit linears (et_vk.linear_q4gsw) that kernels/fusion.py merged at load, as
kernels/matmul/fused_linear.py does for float weights, so a 4-bit layer's decode step takes as few
dispatches as an fp32 one. Every result is bitwise the unfused ops' (but where a GPU's kernel folds
a norm, below): each output summed in the order of the plain op's kernel for that row count
(kernels/matmul/q4_linear.py), and stored as the ops it replaced stored it (the products rounded to
their tensors' types before the gate or the residual).

- `pte_wgpu.q4_linear_group` [x, group_size, w_0, s_0, .., w_g-1, s_g-1, outs]: out_j = x @ W_j.T,
  one kernel over every product's outputs (a uniform branch per product, as fused_linear.py's).
- `pte_wgpu.q4_linear_bias_group` [x, group_size, w_0, s_0, bias_0, .., outs]: the same with a
  bias of each product's outputs (Qwen2.5's q, k and v), added in the epilogue as the plain op's
  kernels add it; past the fused kernel's rows each product's plain routes, with their biases.
- `pte_wgpu.q4_linear_silu_mul` [x, group_size, w_gate, s_gate, w_up, s_up, (out, gate, up)]:
  silu(x @ W_gate.T) * (x @ W_up.T), both weights' rows for the same outputs in one kernel.
- `pte_wgpu.rms_q4_linear_group`, `pte_wgpu.rms_q4_linear_bias_group` and
  `pte_wgpu.rms_q4_linear_silu_mul` take the input before an
  RMS norm as well, after the weights: (x, gamma, eps). The GEMV normalizes its row itself with
  the sums of et_vk.rms_norm's (fused_linear.py's _RMS), bitwise the norm's rows; the GPUs'
  subgroup kernels of q4_wide K fold the norm into the products (q4_linear.py's sg_body: the
  unfused graph's results to rounding, a row of a pass still bitwise the row alone; for several
  rows a dispatch before the products computes the fold's rows and rstd, _FoldNorm);
  `pte_wgpu.rms_norm_for_q4` writes the normalized rows for the row counts the fused op reads them
  (kernels/matmul/routes.py's fused_norm_rows: on CPU adapters every count, their subgroup kernels
  having no barrier).
- `pte_wgpu.q4_linear_residual` [x, weight, scales, group_size, residual, out]: the plain op's
  routes with the residual added in their epilogue; `pte_wgpu.q4_linear_dq8_residual` [x,
  input_scale, input_zp, weight, scales, group_size, residual, out] the same for
  `et_vk.linear_dq8ca_q4gsw` (8da4w).

The fused kernel per adapter class, as the plain op's: on CPU adapters with subgroups (and weights
of whole subgroup steps) the subgroup kernels of every row count, Q4_SG_GEMV's one row and
Q4_SG_GEMM's shape for more; on GPUs with subgroups and weights of q4_wide K, Q4_SG_GPU_WIDE's
to BITWISE_ROWS; otherwise the GEMV up to Q4_GEMV_MAX_ROWS rows, on GPUs with subgroups up to
BITWISE_ROWS and the subgroup kernel at routes.py's Q4_SG_GPU past them (where the plain op takes it:
q4_linear.py's q4_subgroup_shapes). More rows run the products as one dequantizing GEMM over their
columns side by side where each alone would split K alike (_Columns), else each product's plain
routes (Q4Product: the dequantizing GEMM); then SwiGLU's elementwise gate.
"""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..attention.rope import rope_bindings, rope_store
from ..registry import op
from ..variants import CPU
from ..wgsl import Int8Rows, binding_type, fill, flat_grid, rounded, row_groups_grid, vec4_loader, vec4_type
from .fused_linear import _RMS, SILU, fused_operands, swiglu_elementwise, swiglu_reduce
from .gemm import (
    PARAMS_SIZE,
    SMALL_TILE,
    GemmRoute,
    TileLoad,
    WeightSource,
    column_ranges,
    column_store,
    dequantized_halves,
    float_a_load,
    gemm_scratch,
    matrix_weights,
    pair_reduce,
    params_bytes,
)
from .linear import sg_wg_rows
from .q4_linear import (
    Q4_SG_GEMM,
    Q4_SG_GEMV,
    Q4_SG_STEP,
    Q4_SG_WORDS,
    Q4Product,
    _add_q4_linear,
    _dequant,
    fold_norm_shader,
    gemv_body,
    gemv_main,
    gemv_outputs,
    gemv_reduce,
    gemv_route,
    gemv_routes,
    gemv_routes_below,
    gemv_step,
    int8_rows_at,
    int8_rows_loader,
    live_k,
    q4_b_k_quad,
    q4_b_words,
    q4_every_row,
    q4_input,
    q4_subgroup_shape,
    q4_subgroup_shapes,
    q4_weight,
    q4_words,
    sg_body,
    sg_main,
    sg_x_loader,
    sg_x_type,
)
from .routes import BITWISE_ROWS, Q4_SG_GPU, Q4_SG_GPU_ROWS, q4_exact_rows, shape_for_rows

SUBGROUP, GEMV = "subgroup", "gemv"  # the fused kernel's algorithm (the module docstring)
HEAD = ("M", "K", "wpr", "groups", "gs", "kw", "eps", "pad")  # then N and S a product


ROPE_FIELDS = ("half", "dim", "row", "blocks")  # with a RoPE epilogue, after the products'


def _uniform(count, rope):
    fields = [f"{f}: {'f32' if f == 'eps' else 'u32'}" for f in HEAD]
    fields += [f"{f}{j}: u32" for j in range(count) for f in ("N", "S")]
    fields += [f"{f}: u32" for f in ROPE_FIELDS] if rope else []
    return "struct Q { " + ", ".join(fields) + " }\n"


def _outs_bound(outs, rope):
    """The products' outputs a fused kernel binds: none under a lean RoPE epilogue, which stores
    neither (kernels/attention/rope.py's RopeEpilogue.lean)."""
    return [] if rope is not None and rope.lean else list(outs)


def _shader(kind, shape, count, swiglu, norm, types, gs, rope=None, step=8, rstd=False, biased=False):
    """The fused kernel of `kind` (SUBGROUP at `shape`, or GEMV) over `count` weights: a product
    each (a branch per product), or with `swiglu` the two of SwiGLU for the same outputs. `types`:
    storage types of x, the scales, gamma, the outputs and the rows a norm writes (`rows`) and the
    products as stored before the gate (`gate`, `up`). The GEMV's shape is its route (most rows,
    lanes, rows a workgroup), kernels/matmul/q4_linear.py's gemv_routes. With `rope` (kernels/attention/rope.py's
    RopeEpilogue) the epilogue rotates q and k and stores k and v in the caches. The GEMV
    takes `step` weights of K at a time (q4_linear.py's gemv_step); the weights' group size `gs`.
    With `rstd`, the subgroup kernel reads fold_norm_shader's rows and rstd (sg_body's `rstd`).
    With `biased`, each product's bias (`types["bias"]`) follows its scales and is added to its
    outputs as the plain op's epilogue adds it."""
    sg = kind == SUBGROUP
    reads = [("x", sg_x_type(types["x"]) if sg else binding_type(types["x"]))]
    for j in range(count):
        reads += [(f"wq{j}", f"vec{Q4_SG_WORDS}<u32>" if sg else "u32"), (f"ws{j}", types["scales"][j])]
        reads += [(f"bias{j}", types["bias"][j])] if biased else []
    reads += [("gamma", vec4_type(types["gamma"]) if sg else types["gamma"])] if norm else []
    reads += [("rstd", "f32")] if rstd else []
    outs = types["outs"]
    rotates = rope is not None
    assert not (rotates and sg and shape[1] % 2), "a subgroup kernel rotates its outputs in pairs"
    bound = _outs_bound(outs, rope)
    lines = [_uniform(count, rope)]
    lines += [f"@group(0) @binding({i}) var<storage, read> {name}: array<{t}>;" for i, (name, t) in enumerate(reads)]
    lines += [f"@group(0) @binding({len(reads) + j}) var<storage, read_write> o{j}: array<{t}>;" for j, t in enumerate(bound)]
    lines.append(f"@group(0) @binding({len(reads) + len(bound)}) var<uniform> q: Q;")
    lines += [rope_bindings(len(reads) + len(bound) + 1, rope)] if rotates else []
    int8 = isinstance(types["x"], Int8Rows)
    lines.append(sg_x_loader(types["x"]) if sg else int8_rows_loader(types["x"]) if int8 else "fn a_at(i: u32) -> f32 { return f32(x[i]); }")
    lines += [vec4_loader("gamma", types["gamma"])] if sg and norm else []
    src = "\n".join(lines) + _dequant(False, False, gs, [(str(j), f"ws{j}") for j in range(count)])
    rows_t = types["rows"]
    if sg:
        src += sg_main(shape)
        at = lambda r: f"(r0 + {r}u)"  # noqa: E731
    else:
        src += gemv_reduce((2 if swiglu else 1) * shape[2]) + gemv_main(shape[2])
        src += f"    let rows = live;\n    let aoff = m0 * q.K;\n    {_RMS}\n" if norm else ""
        x_at = (lambda r, e: rounded(f"f32(x[xo{r} + {e}]) * rstd{r} * f32(gamma[{e}])", rows_t)) if norm else int8_rows_at(types["x"])
        at = lambda r: f"(m0 + {r}u)"  # noqa: E731

    def body(weights, n, store):
        if sg:
            per = sg_wg_rows(shape, len(weights))
            return f"let nw = wg * {per}u;\n    " + sg_body(False, shape, weights, n, store, rotates, norm, int8, rstd=rstd)
        return gemv_body(False, weights, n, store, shape[1], x_at, rotates, shape[2], step)

    fn = (lambda j: f"wscale{j}") if sg else (lambda j: str(j))
    if swiglu:
        g, u = types["gate"], types["up"]

        def store(r):
            return f"let g = {rounded('v0', g)}; let u = {rounded('v1', u)}; o0[{at(r)} * q.N0 + n] = {outs[0]}({fill(SILU, G='g', U='u')});"

        src += f"    let wg = wg0;\n    {body([('wq0', fn(0)), ('wq1', fn(1))], 'q.N0', store)}\n}}\n"
        return src
    branches = []
    for j in range(count):
        if rotates:
            store = lambda r, j=j: rope_store(j, at(r), outs[j], rope, biased)  # noqa: E731
        else:
            value = f"v0 + f32(bias{j}[n])" if biased else "v0"
            store = lambda r, j=j, value=value: f"o{j}[{at(r)} * q.N{j} + n] = {outs[j]}({value});"  # noqa: E731
        cond = f"if (wg0 < q.S{j + 1}) " if j + 1 < count else ""
        branches.append(f"{cond}{{\n    let wg = wg0 - q.S{j};\n    {body([(f'wq{j}', fn(j))], f'q.N{j}', store)}\n    }}")
    return src + "    " + " else ".join(branches) + "\n}\n"


def columns_load(ns, k, gs, types, rope=None):
    """(TileLoad, uniform WGSL struct) of _Columns' GEMM: products of N = `ns` over one input of
    K `k` (at most) and 4-bit weights of group `gs`, side by side, stored as `types` ("x", "scales")
    says; `rope`: the fused op's (its uniform's fields). Of f16 rows it also reads halves (the f16
    matrices' loads), with one K loop a weight where the weights are whole tiles (matrix_weights)."""
    ranges = column_ranges(ns)
    count, quads = len(ns), k % 4 == 0  # the activations 4 of K a load (gemm.py's TileLoad)

    def read(j, s):  # weight j's quad k of column n, dequantized
        return f"let r = n - {s}u; w = dq4{j}(wq{j}[r * q.wpr + k / 8u] >> (4u * (k % 8u)), k, r);"

    reads = "\n    ".join(f"{'if' if j == 0 else 'else if'} (n < {e}u) {{ {read(j, s)} }}" for j, (s, e) in enumerate(ranges))
    x, a_functions = float_a_load(types["x"], quads, "x")
    weights = tuple((name, t) for j in range(count) for name, t in ((f"wq{j}", "u32"), (f"ws{j}", types["scales"][j])))
    b_functions = _dequant(False, False, gs, [(str(j), f"ws{j}") for j in range(count)]) + q4_b_k_quad("var w = vec4<f32>(0.0);\n    " + reads)
    uniform = _uniform(count, rope)
    halves, whole = "", matrix_weights(ns)
    words = quads and q4_words(gs, types["x"], types["scales"])
    if quads and types["x"] == "f16" and not words:  # quads packed, each product's alone where each tile reads one
        alone = "".join(q4_b_k_quad(f"var w: vec4<f32>; {read(j, s)}", f"_{j}") for j, (s, _) in enumerate(ranges)) if whole else ""
        halves = b_functions + alone + dequantized_halves("x", count if whole else 1)
    if words:  # each product's words and scale, and unless each tile reads one product, the column's product's
        halves = b_functions + dequantized_halves("x", 0)
        halves += "".join(q4_b_words(f"let r = min(n, p.N - 1u) - {s}u;", f"_{j}", f"wq{j}", f"wscale{j}") for j, (s, _) in enumerate(ranges))
        if not whole:
            def pick(fn, args):  # the body calling fn_j(args) of column n's product j
                calls = [f"if (n < {e}u) {{ return {fn}_{j}({args}); }}" for j, (_, e) in enumerate(ranges[:-1])]
                return " else ".join(calls) + f" return {fn}_{len(ranges) - 1}({args});"

            halves += f"fn b_word(off: u32, n: u32, k: u32) -> u32 {{ {pick('b_word', 'off, n, k')} }}\n"
            halves += f"fn b_words_scale(n: u32, k0: u32) -> f32 {{ {pick('b_words_scale', 'n, k0')} }}\n"
    load = TileLoad(
        inputs=(x, *weights),
        functions=a_functions + b_functions,
        b_along_k=True,
        b_k_quads=True,
        dequantizes=True,
        a_k_quads=quads,
        b_source=WeightSource(types["x"], weights, b_functions, ((uniform, "q: Q"),)),
        halves_functions=halves,
        weight_ends=tuple(e for _, e in ranges) if halves and whole else (),
        words=bool(words),
    )
    return load, uniform


# Split-K's reduce of q | k | v as one GEMM over their columns (_Columns) takes the RoPE where a
# dispatch of its own (rope_into_cache) took it after: two neighbouring columns of a row (the pair a
# head's RoPE rotates together) summed and stored as GEMM_REDUCE does them, then q's and k's rotated
# and k and v stored in the caches with rope_store's expressions on the same values, so a pass of
# split products takes one dispatch less.
def rope_reduce(fused, types, uniform):
    """GemmRoute's `finish` of _Columns' q | k | v taking the fused op's RoPE (RopeEpilogue):
    its uniform (`uniform`, the WGSL struct) and the epilogue's bindings after the reduce's."""
    rope, branches = fused.rope, []
    for j, (s, e) in enumerate(column_ranges([w.n for w in fused.ws])):
        def one(second, mine, other, j=j, s=s):  # output col - s (+ 1 for the pair's second) of product j
            return f"{{ let n = c0 - {s}u + {second}u; let v0 = {mine}; let pair0 = {other}; {rope_store(j, 'm', types['outs'][j], rope, products=False)} }}"

        branches.append(f"if (c0 < {e}u) {{\n        {one(0, 'a', 'z')}\n        {one(1, 'z', 'a')}\n    }}")

    def declared(first):
        return f"{uniform}@group(0) @binding({first}) var<uniform> q: Q;{rope_bindings(first + 1, rope)}"

    return declared, pair_reduce("2u * (i % np)", "c0 + 1u", "    " + " else ".join(branches)), [fused.q, *rope.bound]


class _Columns:
    """The fused products past the fused kernel's rows as one dequantizing GEMM over their columns
    side by side (gemm.py's column_group, for 4-bit weights; the loads read the fused op's uniform:
    wpr, gs, groups, sn_j): one dispatch, and one wave of workgroups where each product alone
    leaves the GPU part idle (Llama-3.2-1B's k and v, 512 rows each). Taken where every product
    alone would split K the same way, so that each output sums as the plain op's GEMM sums it (an
    output's order is its K ranges', whatever the tile): bitwise the unfused ops. H200,
    Llama-3.2-1B shape 4w, greedy bursts, two rounds in one call: 32 streams 4,287 / 4,299 ->
    5,208 / 5,272 tokens/s, 64 streams 6,996 / 7,061 -> 7,648 / 7,740, prompts of 32 tokens 3,904 /
    4,071 -> 4,783 / 4,701, of 512 and 2,047 the same (BENCHMARKS.md)."""

    def __init__(self, b, fused, types):
        self.fused = fused
        self.ns = [w.n for w in fused.ws]
        load, uniform = columns_load(self.ns, fused.k, fused.ws[0].gs, types, fused.rope)
        inputs = [fused.x, *(v for pair in fused.products for v in pair)]
        q_wgsl = f"{uniform}@group(0) @binding({len(inputs) + 3}) var<uniform> q: Q;\n"
        self.most = (sum(self.ns), 8 * fused.ws[0].wpr)
        self.scratch = gemm_scratch(b, fused.stored, together=True, most=self.most)
        self.p = b.params(PARAMS_SIZE)
        # split-K's reduce gates SwiGLU, or rotates q and k and stores the caches
        finish = swiglu_reduce(b, fused.outs[0]) if fused.swiglu else rope_reduce(fused, types, uniform) if fused.rope else None
        self.gemm = GemmRoute(b, load, inputs, None, fused.stored[0], self.p, self.scratch, [fused.q], q_wgsl, store=column_store(self.ns),
                              more_outs=fused.stored[1:], small=SMALL_TILE in fused.plain[0].gemm.tiles, most=self.most, finish=finish)
        self.capacity = b.graph.values[self.scratch].dims[0]

    def plan(self, m, k):
        """(splits, kspan) every product alone takes for M x K in its GEMM, where they agree and
        the group's partial sums fit its scratch; else None."""
        plain = self.fused.plain
        if any(q4_subgroup_shape(self.fused.b, product.shapes, m, k, product.exact_rows) for product in plain):
            return None  # a product alone takes a subgroup kernel there (CPU adapters)
        plans = {product.gemm.plan(m, n, k, 1) for n, product in zip(self.ns, plain)}
        if len(plans) != 1:
            return None
        plan = plans.pop()
        return plan if plan[0] == 1 or plan[0] * m * self.most[0] <= self.capacity else None

    def resize(self, ctx, m, k, plan):
        """Set the GEMM's params and grids for M x K at `plan` (None: off)."""
        splits, kspan = plan or (1, max(k, 1))
        ctx.set_params(self.p, params_bytes(m, self.most[0], k, split=(splits, kspan)))
        self.gemm.set_grids(ctx, m, self.most[0], k, 1, splits, plan is not None)


class _FoldNorm:
    """The rows and rstd that a fused op's subgroup kernels of several rows read where the GPUs'
    kernels fold its RMS norm (q4_linear.py's fold_norm_shader): rows before the norm `x_pre` of
    at most K = k, its weight `gamma`; `shape` the op's subgroup shape of one row (whose fold it
    repeats), `q` and `uniform` its uniform and the WGSL struct."""

    def __init__(self, b, x_pre, gamma, k, shape, q, uniform):
        self.normed, self.rstd = b.scratch("float32", BITWISE_ROWS * k), b.scratch("float32", BITWISE_ROWS)
        x_t, g_t = b.storage(x_pre), b.storage(gamma)
        head = uniform + "\n".join([
            f"@group(0) @binding(0) var<storage, read> x: array<{vec4_type(x_t)}>;",
            f"@group(0) @binding(1) var<storage, read> gamma: array<{vec4_type(g_t)}>;",
            "@group(0) @binding(2) var<storage, read_write> normed: array<vec4<f32>>;",
            "@group(0) @binding(3) var<storage, read_write> rstd: array<f32>;",
            "@group(0) @binding(4) var<uniform> q: Q;",
        ]) + "\n" + vec4_loader("x", x_t) + vec4_loader("gamma", g_t)  # fmt: skip
        self.dispatch = b.dispatch(fold_norm_shader(shape, head), [x_pre, gamma, self.normed, self.rstd, q])

    @staticmethod
    def read_at(shape):
        """Whether the op's subgroup kernel of `shape` reads these rows: a pass of several rows."""
        return shape[0] > 1

    def resize(self, ctx, m):
        """Normalize m rows (0: none)."""
        ctx.set_grid(self.dispatch, (m, 1, 1) if m else (0, 0, 0))


class _Fused:
    """A fused op's kernels and routes (the module docstring), for `products` (weight, scales)
    pairs of one input; `outs`: what the fused kernel writes (one a product, or SwiGLU's out);
    `stored`: the products' own outputs (SwiGLU: gate and up), which more rows write."""

    def __init__(self, b, swiglu, rope=None):
        self.b, self.swiglu, self.rope = b, swiglu, rope
        args = b.args
        operands, per, norm = fused_operands(b.name, args)  # (weight, scales[, bias]) a product
        self.norm, self.biased = norm is not None, per == 3
        self.x, gs = args[0], b.scalar(1)
        self.operands = [tuple(operands[i : i + per]) for i in range(0, len(operands), per)]
        self.products = [(w, s) for w, s, *_ in self.operands]
        self.biases = [t[2] for t in self.operands] if self.biased else [None] * len(self.operands)
        self.ws = [q4_weight(b, self.x, w, s, gs) for w, s in self.products]
        if len({(w.wpr, w.groups, w.gs) for w in self.ws}) != 1 or (swiglu and len(self.ws) != 2):
            b.fail("the fused products must share K, the scale groups and the group size")
        items = list(b.graph.values[b.out].items)
        self.outs, self.stored = (items[:1], items[1:]) if swiglu else (items, items)
        x_pre, gamma, eps = norm or (self.x, None, None)
        self.eps = float(b.scalar(eps, 1e-6)) if self.norm else 0.0
        x_type, k = q4_input(b, self.x)  # k: the most K the inputs take
        self.k = k
        floats = [*(s for _, s in self.products), *items] + ([x_pre, gamma] if self.norm else []) + (self.biases if self.biased else [])
        steps = all(w.subgroup_steps() for w in self.ws) and all(b.storage(v) in ("f32", "f16") for v in floats)
        steps = steps and (isinstance(x_type, Int8Rows) or x_type in ("f32", "f16"))
        steps = steps and b.subgroups and k % Q4_SG_STEP == 0
        cpu = b.adapter == CPU
        types = {
            "x": x_type, "scales": [b.storage(s) for _, s in self.products], "gamma": gamma is not None and b.storage(gamma),
            "outs": [b.storage(o) for o in self.outs], "rows": b.storage(self.x), "gate": b.storage(items[-2]), "up": b.storage(items[-1]),
            "bias": [b.storage(v) for v in self.biases] if self.biased else [],
        }  # fmt: skip
        self.q = b.params(4 * (len(HEAD) + 2 * len(self.ws) + (len(ROPE_FIELDS) if rope else 0)))
        gpu_sg = q4_subgroup_shapes(b, self.ws[0], k, sum(w.n for w in self.ws)) if steps and not cpu else ()
        folds = q4_every_row(gpu_sg)  # its subgroup kernels take the rows before the norm
        if cpu and steps:  # every row count
            sg = ((Q4_SG_GEMV[0], Q4_SG_GEMV[1] * len(self.ws)) if swiglu else Q4_SG_GEMV, Q4_SG_GEMM)
            self.routes, kinds, self.most = [], [(SUBGROUP, shape) for shape in sg], None
        elif folds:  # the subgroup kernels for one row and more, to q4_exact_rows
            self.routes, kinds, self.most = [], [(SUBGROUP, shape) for shape in gpu_sg], q4_exact_rows(b, 8 * self.ws[0].wpr, self.x)
        else:  # the GEMV's rows, on GPUs past BITWISE_ROWS the subgroup kernel's where the plain op takes it
            routes = gemv_routes(self.ws[0].wpr)
            self.routes = gemv_routes_below(routes, BITWISE_ROWS) if gpu_sg else routes
            kinds = [(GEMV, route) for route in self.routes] + ([(SUBGROUP, Q4_SG_GPU)] if gpu_sg else [])
            self.most = Q4_SG_GPU_ROWS[1] if gpu_sg else self.routes[-1][0]
        # the fold's passes of several rows read its normalized rows and rstd from one dispatch before them
        self.fold_norm = _FoldNorm(b, x_pre, gamma, k, gpu_sg[0], self.q, _uniform(len(self.ws), rope)) if self.norm and folds else None
        self.dispatches = []
        for kind, shape in kinds:
            rstd = self.fold_norm is not None and self.fold_norm.read_at(shape)
            norm = self.norm and (kind == GEMV or folds) and not rstd  # other subgroup kernels read rms_norm_for_q4's rows
            t = dict(types, x=b.storage(x_pre)) if norm else dict(types, x="f32") if rstd else types
            x_read = x_pre if norm else self.fold_norm.normed if rstd else self.x
            reads = [x_read, *(v for operands in self.operands for v in operands)] + ([gamma] if norm else []) + ([self.fold_norm.rstd] if rstd else [])
            # CPU adapters' subgroup kernels: the RoPE's own dispatch; so too GPUs' of several rows with a lean
            # epilogue (H100, Dawn, Llama-3.2-1B 4w of f16 activations: 2 / 4 / 8 streams 4-8% slower with it,
            # one stream 3-11% faster; results/h100/lean_rope_epilogue/)
            epilogue = rope if kind == GEMV or not (cpu or (rope and rope.lean and shape[0] > 1)) else None
            shader = _shader(kind, shape, len(self.ws), swiglu, norm, t, self.ws[0].gs, epilogue, gemv_step(self.ws[0].wpr), rstd, self.biased)
            extra = epilogue.bound if epilogue else []
            outs = _outs_bound(self.outs, epilogue)
            self.dispatches.append((b.dispatch(shader, [*reads, *outs, self.q, *extra]), kind, shape, epilogue is not None))
        # more rows: one GEMM over the products' columns where they split K alike (_Columns), else each product's plain routes
        self.plain = [] if self.most is None else [
            Q4Product(b, self.x, None, None, w, s, gs, bias, o, gemv=False) for (w, s), bias, o in zip(self.products, self.biases, self.stored)
        ]  # fmt: skip
        together = len({b.storage(o) for o in self.stored}) == 1 and not self.biased  # the column GEMM's store adds no bias
        self.columns = _Columns(b, self, types) if self.plain and together else None
        if swiglu and self.plain:
            self.e = b.params(16)
            self.gate_up = b.dispatch(swiglu_elementwise(*(b.storage(v) for v in items[1:] + items[:1])), [*items[1:], items[0], self.e])

    def per(self, kind, shape):
        """Outputs a workgroup of the kernel of `kind` at `shape`."""
        return gemv_outputs(shape[1]) if kind == GEMV else sg_wg_rows(shape, len(self.ws) if self.swiglu else 1)

    def resize(self, ctx):
        """Routes for the live rows; returns whether the fused kernel, or split-K's reduce, took `rope`."""
        b, xd = self.b, ctx.dims(self.x)
        if len(xd) < 1:
            b.fail("input must have at least one dim")
        k, m = live_k(b, self.x, xd), numel_of(xd[:-1])
        for w in self.ws:
            w.check_input(b, k)
        fused = m > 0 and (self.most is None or m <= self.most)
        if not self.routes:  # subgroup kernels only (CPU adapters', or the fold's): by their rows
            chosen, kind, shape, rotates = self.dispatches[shape_for_rows([shape for _, _, shape, _ in self.dispatches], m)]
        else:
            chosen, kind, shape, rotates = self.dispatches[gemv_route(self.routes, m) if m <= self.routes[-1][0] else -1]
        if kind == SUBGROUP and fused and k % Q4_SG_STEP:
            b.fail(f"input K={k} is not whole subgroup steps of {Q4_SG_STEP}")
        plan = self.columns.plan(m, k) if self.columns and m > 0 and not fused else None
        finished = plan is not None and self.columns.gemm.finishes(plan[0])  # split-K's reduce gated SwiGLU or took the RoPE
        for product in self.plain:
            product.resize(ctx, on=not fused and plan is None)
        if self.columns:
            self.columns.resize(ctx, m, k, plan)
        per = self.per(kind, shape)
        ns = [w.n for w in self.ws][: 1 if self.swiglu else None]
        starts = [0]
        for n in ns:
            starts.append(starts[-1] + -(-n // per))
        w = self.ws[0]
        fields = [m, k, w.wpr, w.groups, w.gs, -(-k // 8)]
        for j, pw in enumerate(self.ws):
            fields += [pw.n, starts[j] if j < len(ns) else 0]
        fields += self.rope.fields if self.rope else []
        ctx.set_params(self.q, struct.pack(f"<6If{len(fields) - 5}I", *fields[:6], self.eps, 0, *fields[6:]))
        rows = shape[2] if kind == GEMV else shape[0]  # rows a workgroup
        grid = row_groups_grid(starts[-1], m, rows)
        for d, *_ in self.dispatches:
            ctx.set_grid(d, grid if fused and d == chosen else (0, 0, 0))
        if self.fold_norm:
            self.fold_norm.resize(ctx, m if fused and self.fold_norm.read_at(shape) else 0)
        for o, n in zip(self.stored, [w.n for w in self.ws]):
            ctx.set_dims(o, tuple(xd[:-1]) + (n,))
        if self.swiglu:
            n = self.ws[0].n
            if self.ws[1].n != n:
                b.fail(f"gate and up weights have {n} and {self.ws[1].n} rows")
            ctx.set_dims(self.outs[0], tuple(xd[:-1]) + (n,))
            if self.plain:
                ctx.set_params(self.e, struct.pack("<4I", m * n, 0, 0, 0))
                ctx.set_grid(self.gate_up, flat_grid(m * n) if m and not fused and not finished else (0, 0, 0))
        return (fused and rotates) or (finished and self.rope is not None)


@op("pte_wgpu.q4_linear_group", "pte_wgpu.rms_q4_linear_group", "pte_wgpu.q4_linear_bias_group", "pte_wgpu.rms_q4_linear_bias_group", half=True)
def q4_linear_group(b):
    b.hook(q4_group_routes(b))


def q4_group_routes(b, rope=None):
    """Record the op's routes; returns its hook (which returns whether a kernel of the op took `rope`)."""
    return _Fused(b, swiglu=False, rope=rope).resize


@op("pte_wgpu.q4_linear_silu_mul", "pte_wgpu.rms_q4_linear_silu_mul", half=True)
def q4_linear_silu_mul(b):
    b.hook(_Fused(b, swiglu=True).resize)


@op("pte_wgpu.q4_linear_residual", half=True)
def q4_linear_residual(b):
    """[x, weight, scales, group_size, residual, out]: residual + x @ dequant(weight).T."""
    _add_q4_linear(b, b.args[0], None, None, b.args[1], b.args[2], b.scalar(3), b.args[4], residual=True)


@op("pte_wgpu.q4_linear_dq8_residual", half=True)
def q4_linear_dq8_residual(b):
    """[x, input_scale, input_zp, weight, scales, group_size, residual, out]: residual + the
    product of `et_vk.linear_dq8ca_q4gsw` (x quantized to int8 with its rows' scales and zero points)."""
    _add_q4_linear(b, b.args[0], b.args[1], b.args[2], b.args[3], b.args[4], b.scalar(5), b.args[6], residual=True)
