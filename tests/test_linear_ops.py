"""linear, mm, bmm and addmm against torch eager, at prime sizes, on both routes (GEMV at M == 1,
tiled GEMM otherwise), with live M changing between calls in random order."""

import functools
import random

import numpy as np
import pytest
import torch

from async_runtime import model as model_module
from async_runtime.testing import assert_matches_eager
from pte_wgpu.resize.values import NONE, Scalar, Tensor, ValueList
from pte_wgpu.kernels import OpBuilder, build_node, fusion
from pte_wgpu.kernels.matmul import gemm as G
from pte_wgpu.kernels.matmul import linear as L
from pte_wgpu.kernels.matmul import routes as R

from .exporting import export_pte

pytestmark = pytest.mark.usefixtures("adapter", "kernel_variants")

ATOL = RTOL = 1e-4


class Linear(torch.nn.Module):
    def __init__(self, k, n, bias):
        super().__init__()
        self.fc = torch.nn.Linear(k, n, bias=bias)

    def forward(self, x):
        return self.fc(x)


class MM(torch.nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)


class BMM(torch.nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


class AddMM(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(n))
        self.weight = torch.nn.Parameter(torch.randn(k, n))

    def forward(self, a):
        return torch.addmm(self.bias, a, self.weight, beta=0.5, alpha=2.0)


class FusedLinears(torch.nn.Module):
    """What kernels/fusion.py merges: q/k/v of one input (`qkv_bias`: with biases, Qwen2.5's), a
    residual linear, SwiGLU."""

    def __init__(self, k, n_q, n_kv, n_ff, qkv_bias=False):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(k, n, bias=qkv_bias) for n in (n_q, n_kv, n_kv))
        self.o = torch.nn.Linear(n_q, k, bias=False)
        self.gate, self.up = (torch.nn.Linear(k, n_ff, bias=False) for _ in range(2))
        self.down = torch.nn.Linear(n_ff, k, bias=False)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        h = x + self.o(q * 0.5)
        return q, k, v, h + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class BiasResiduals(torch.nn.Module):
    """x + proj(x), then h + fc2(fc1(h)), each linear with a bias: a transformer block's residual
    projections (ViT's, BERT's); `proj` False: the second alone."""

    def __init__(self, k, n, proj=True):
        super().__init__()
        self.proj = torch.nn.Linear(k, k) if proj else None
        self.fc1, self.fc2 = torch.nn.Linear(k, n), torch.nn.Linear(n, k)

    def forward(self, x):
        h = x + self.proj(x) if self.proj is not None else x
        return h + self.fc2(self.fc1(h))


class LinearGelu(torch.nn.Module):
    """An MLP's first half (ViT's, BERT's; GPT-2's with the tanh approximation)."""

    def __init__(self, k, n, bias, approximate):
        super().__init__()
        self.fc, self.approximate = torch.nn.Linear(k, n, bias=bias), approximate

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x), approximate=self.approximate)


def _m(max_m):
    return torch.export.Dim("m", min=1, max=max_m)


# name -> (module factory, example args, dynamic_shapes, per-input shape of live M)
CASES = {
    "linear_bias_3d": (lambda: Linear(13, 29, True), [(3, 7, 13)], None),
    "linear_dyn": (lambda: Linear(13, 29, False), [(17, 13)], ({0: _m(17)},)),
    "linear_bias_dyn_large": (lambda: Linear(523, 67, True), [(70, 523)], ({0: _m(70)},)),
    # K a multiple of 4 and N >= GEMV_T4_MIN_N: the vec4 GEMV (32 weight rows a workgroup) up to 32 rows
    "linear_bias_dyn_k4": (lambda: Linear(76, 8209, True), [(41, 76)], ({0: _m(41)},)),
    "mm_dyn": (MM, [(17, 13), (13, 29)], ({0: _m(17)}, None)),
    "bmm_dyn": (BMM, [(3, 17, 13), (3, 13, 29)], ({1: _m(17)}, None)),
    # K long enough for the GEMM to split it (gemm_split), B as [K, N]
    "mm_dyn_split": (MM, [(70, 257), (257, 97)], ({0: _m(70)}, None)),
    "bmm_dyn_split": (BMM, [(3, 67, 199), (3, 199, 71)], ({1: _m(67)}, None)),
    "addmm_dyn": (lambda: AddMM(13, 29), [(17, 13)], ({0: _m(17)},)),
    "fused_dyn": (lambda: FusedLinears(37, 41, 23, 53), [(1, 71, 37)], ({1: _m(71)},)),
    # K a multiple of 4 with odd N: the subgroup GEMVs of CPU adapters (q/k/v, SwiGLU, the plain
    # linear), next to products whose K is not (o: 41, down: 53)
    "linear_dyn_k4": (lambda: Linear(96, 37, False), [(33, 96)], ({0: _m(33)},)),
    # N and K of 2,048 and more: the 128 x 128 tiles (gemm.py's takes_big_tile) at 130 and 131 rows, K split in 7
    "linear_big": (lambda: Linear(2053, 2063, True), [(131, 2053)], ({0: _m(131)},)),
    "mm_big": (MM, [(131, 2053), (2053, 2063)], ({0: _m(131)}, None)),
    "fused_dyn_k4": (lambda: FusedLinears(40, 41, 23, 53), [(1, 34, 40)], ({1: _m(34)},)),
    # q/k/v and SwiGLU of K = FLOAT_GEMM_MIN_K: on GPUs the subgroup kernel to WIDE_K_SG_ROWS rows only
    "fused_wide_k4": (lambda: FusedLinears(2048, 41, 23, 53), [(1, 41, 2048)], ({1: _m(41)},)),
    # q/k/v with biases (Qwen2.5's): one pte_wgpu.linear_bias_group, and at K = 2,048 on GPUs its
    # wide subgroup kernels
    "fused_bias_dyn": (lambda: FusedLinears(37, 41, 23, 53, qkv_bias=True), [(1, 71, 37)], ({1: _m(71)},)),
    "fused_bias_wide_k4": (lambda: FusedLinears(2048, 41, 23, 53, qkv_bias=True), [(1, 41, 2048)], ({1: _m(41)},)),
    # a plain linear of K = FLOAT_GEMM_MIN_K (routes.py's float_wide): on GPUs the subgroup kernels
    # at every row count to WIDE_K_SG_ROWS, then the GEMM
    "linear_wide_k8": (lambda: Linear(2048, 37, False), [(35, 2048)], ({0: _m(35)},)),
    # K whole quads: the GEMM reads the input 4 of K a load, and on GPUs the 8 x 4 tiles past 64 rows
    # and the 128 x 128 tiles (from 128 rows) the f32 weights too (gemm.py's TileLoad.quads)
    "linear_quads_mid": (lambda: Linear(524, 67, True), [(70, 524)], ({0: _m(70)},)),
    "linear_quads_big": (lambda: Linear(2052, 2063, True), [(131, 2052)], ({0: _m(131)},)),
    # a residual after linears with biases: in the epilogue of every route (kernels/fusion.py's
    # linear_bias_residual), the GEMV and GEMM; on GPUs at K = 2,048 the wide subgroup kernels, at N
    # >= GEMV_T4_MIN_N the vec4 GEMV
    "bias_residual_dyn": (lambda: BiasResiduals(37, 53), [(1, 71, 37)], ({1: _m(71)},)),
    "bias_residual_wide": (lambda: BiasResiduals(41, 2048), [(1, 41, 41)], ({1: _m(41)},)),
    "bias_residual_t4": (lambda: BiasResiduals(8212, 8, proj=False), [(1, 34, 8212)], ({1: _m(34)},)),
    # a GELU after: in the epilogue of every route (kernels/fusion.py's linear_gelu)
    "linear_gelu_dyn": (lambda: LinearGelu(97, 59, True, "none"), [(70, 97)], ({0: _m(70)},)),
    "linear_gelu_tanh_k4": (lambda: LinearGelu(96, 37, False, "tanh"), [(131, 96)], ({0: _m(131)},)),
}
# where live M sits in each input's shape (None: the input has no M)
M_AXIS = {
    "linear_dyn": [0],
    "linear_bias_dyn_large": [0],
    "linear_bias_dyn_k4": [0],
    "mm_dyn": [0, None],
    "bmm_dyn": [1, None],
    "mm_dyn_split": [0, None],
    "bmm_dyn_split": [1, None],
    "addmm_dyn": [0],
    "fused_dyn": [1],
    "linear_dyn_k4": [0],
    "linear_big": [0],
    "mm_big": [0, None],
    "fused_dyn_k4": [1],
    "fused_wide_k4": [1],
    "fused_bias_dyn": [1],
    "fused_bias_wide_k4": [1],
    "linear_wide_k8": [0],
    "linear_quads_mid": [0],
    "linear_quads_big": [0],
    "bias_residual_dyn": [1],
    "bias_residual_wide": [1],
    "bias_residual_t4": [1],
    "linear_gelu_dyn": [0],
    "linear_gelu_tanh_k4": [0],
}


def _export(name):
    make, shapes, dyn = CASES[name]
    args = [torch.randn(*s) for s in shapes]
    return export_pte(name, make, args, dynamic_shapes=dyn)


PREBUILD = [functools.partial(_export, name) for name in CASES]  # tests/prebuild.py


def _inputs(name, m, rng):
    _, shapes, _ = CASES[name]
    out = []
    for shape, axis in zip(shapes, M_AXIS.get(name, [None] * len(shapes))):
        shape = list(shape)
        if axis is not None:
            shape[axis] = m
        out.append(rng.standard_normal(shape).astype(np.float32))
    return out


async def test_linear_with_bias_on_3d_input(load_pte):
    data, module = _export("linear_bias_3d")
    calls = [_inputs("linear_bias_3d", None, np.random.default_rng(1))]
    await assert_matches_eager(await load_pte(data), module, calls, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", sorted(M_AXIS))
async def test_dynamic_rows_switch_routes(name, load_pte):
    """Live M over 1 (GEMV) and 2..max (GEMM, including partial and several 64-row tiles), in
    random order, with repeats, on one model."""
    data, module = _export(name)
    max_m = CASES[name][1][0][M_AXIS[name][0]]
    ms = sorted({1, 2, 3, max_m, max_m - 1, (max_m + 1) // 2, min(65, max_m)})
    random.Random(name).shuffle(ms)
    rng = np.random.default_rng(7)
    calls = [_inputs(name, m, rng) for m in ms]  # run in this order, shuffled, then the first again
    await assert_matches_eager(await load_pte(data), module, calls, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ["linear_quads_mid", "linear_quads_big"])
async def test_gemm_reads_whole_quads_of_k_4_at_a_time(name, load_pte, kernel_variants):
    """Products of K a multiple of 4 load their input (and, in the GPUs' larger tiles, f32
    weights) 4 of K a load: values against eager at every tile's rows, with the GPU kernel
    variants and the CPU adapters'."""
    data, module = _export(name)
    model = await load_pte(data)
    gemms = [d.shader for d in model.graph.dispatches if "var<workgroup> As" in (d.shader or "")]
    assert gemms and all("fn a_k_quad" in s for s in gemms)
    assert any("fn b_k_quad" in s for s in gemms) == (kernel_variants == "gpu" or name == "linear_quads_big")
    ms = [131, 1, 70, 65, 128, 33, 64, 2] if name == "linear_quads_big" else [70, 1, 65, 64, 33, 2]
    calls = [_inputs(name, m, np.random.default_rng(m)) for m in ms]
    await assert_matches_eager(model, module, calls, atol=ATOL, rtol=RTOL)


async def test_fused_linears_run_as_fused_ops(load_pte):
    """The graph of `fused_dyn` loads with its products merged (the routes are compared with
    eager in test_dynamic_rows_switch_routes)."""
    data, _ = _export("fused_dyn")
    model = await load_pte(data)
    names = [name for name, _ in model.graph.calls]
    for fused in ("pte_wgpu.linear_group", "pte_wgpu.linear_residual", "pte_wgpu.linear_silu_mul"):
        assert fused in names
    assert "aten.linear.default" not in names and model.fused == 5  # silu, swiglu, 2 residuals, q/k/v


def _with_transition_clones(link):
    """`link` whose graphs copy each product's, multiply's and add's result with a clone for the calls
    that read it, as ExecuTorch's Vulkan lowering does where a tensor changes representation (storage
    type or packed dim: its TagMemoryMetaPass; Llama-3.2-1B's export has them in one layer). torch.export
    itself keeps no clone of a module's own."""

    def linked(method):
        graph = link(method)
        values, calls, rename = graph.values, [], {}
        for name, args in graph.calls:
            args = (*(rename.get(a, a) for a in args[:-1]), *args[-1:])
            calls.append((name, args))
            out = args[-1] if args else None
            if name in ("aten.linear.default", "aten.mul.Tensor", "aten.add.Tensor") and out not in graph.outputs:
                values += [NONE, Tensor(values[out].dtype, values[out].dims)]
                calls.append(("aten.clone.default", (out, len(values) - 2, len(values) - 1)))
                rename[out] = len(values) - 1
        graph.calls[:] = calls
        return graph

    return linked


async def test_linears_fuse_through_clones(load_pte, monkeypatch):
    """fused_dyn with a clone after each product, multiply and add loads as it does without them,
    its products merged, and runs as eager at every route's rows."""
    data, module = _export("fused_dyn")
    monkeypatch.setattr(model_module, "link", _with_transition_clones(model_module.link))
    model = await load_pte(data)
    names = [name for name, _ in model.graph.calls]
    assert "aten.clone.default" not in names and "aten.linear.default" not in names, names
    assert {"pte_wgpu.linear_group", "pte_wgpu.linear_residual", "pte_wgpu.linear_silu_mul"} <= set(names)
    assert model.fused == 5  # silu, swiglu, 2 residuals, q/k/v
    calls = [_inputs("fused_dyn", m, np.random.default_rng(m)) for m in (71, 1, 33, 2, 17, 65)]
    await assert_matches_eager(model, module, calls, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ["fused_bias_dyn", "fused_bias_wide_k4"])
async def test_biased_products_of_one_input_run_as_one_group_bitwise(name, load_pte, monkeypatch, kernel_variants):
    """q/k/v with biases load as one pte_wgpu.linear_bias_group whose outputs are bitwise the three
    linears' at every route's rows, with both kernel variant sets (values against eager:
    test_dynamic_rows_switch_routes)."""
    data, _ = _export(name)
    fused = await load_pte(data)
    with monkeypatch.context() as m:
        m.setattr(fusion, "_fuse_groups", lambda graph: 0)
        plain = await load_pte(data)
    names = [op for op, _ in fused.graph.calls]
    assert names.count("pte_wgpu.linear_bias_group") == 1 and "aten.linear.default" not in names, names
    assert [op for op, _ in plain.graph.calls].count("aten.linear.default") == 3
    top = CASES[name][1][0][1]
    for m in (1, top, 2, 17, 33, min(65, top), 5, 16):
        (x,) = _inputs(name, m, np.random.default_rng(m))
        for i, (g, w) in enumerate(zip(await fused.execute(x), await plain.execute(x))):
            np.testing.assert_array_equal(g, w, err_msg=f"{m} rows, output {i}")


@pytest.mark.parametrize("name", ["bias_residual_dyn", "bias_residual_t4"])
async def test_a_residual_after_a_biased_linear_runs_in_its_epilogue(name, load_pte):
    """residual + linear(x) with a bias loads as one pte_wgpu.linear_bias_residual, no add left (values:
    test_dynamic_rows_switch_routes)."""
    model = await load_pte(_export(name)[0])
    names = [op for op, _ in model.graph.calls]
    residuals = 2 if name == "bias_residual_dyn" else 1
    assert names.count("pte_wgpu.linear_bias_residual") == residuals and names.count("aten.linear.default") == 1, names
    assert "aten.add.Tensor" not in names, names


@pytest.mark.parametrize("name", ["linear_gelu_dyn", "linear_gelu_tanh_k4"])
async def test_a_gelu_runs_in_its_linears_epilogue(name, load_pte):
    """gelu(linear(x)) loads as one pte_wgpu.linear_gelu (values: test_dynamic_rows_switch_routes)."""
    model = await load_pte(_export(name)[0])
    names = [op for op, _ in model.graph.calls]
    assert names.count("pte_wgpu.linear_gelu") == 1 and not [n for n in names if "gelu.default" in n or n == "aten.linear.default"], names


@pytest.mark.parametrize("name", ["fused_dyn_k4", "fused_wide_k4"])
async def test_subgroup_gemvs_where_k_is_whole_vec4s(name, load_pte, kernel_variants):
    """On a device with subgroups, the products of fused_dyn_k4 with K = 40 (q/k/v, SwiGLU) sum
    along K in subgroups, with the CPU variants at every row count, with the GPU ones for
    SG_GPU_ROWS rows only (fused_wide_k4's, of K = 2,048, at every row count to WIDE_K_SG_ROWS,
    then the GEMM); those with K = 41 or 53 (o, down) never do. Values against eager at each count."""
    data, module = _export(name)
    model = await load_pte(data)
    if not model.subgroups:
        assert not any("subgroupAdd" in (d.shader or "") for d in model.graph.dispatches)
        return
    top = CASES[name][1][0][1]
    k = CASES[name][1][0][2]
    most, first = R.float_subgroup_rows(k), 1 if R.float_wide(k) else R.SG_GPU_ROWS[0]
    calls = []
    for rows in sorted({1, R.SG_GPU_ROWS[0], min(most, top), min(most + 1, top), top}):
        calls.append(_inputs(name, rows, np.random.default_rng(rows)))
        await model.execute(*calls[-1])
        grids = model._default.state.grids
        live = {}  # op -> whether a subgroup GEMV ran
        for i, d in enumerate(model.graph.dispatches):
            live[d.op] = live.get(d.op, False) or ("subgroupAdd" in (d.shader or "") and all(grids[i]))
        subgroups = kernel_variants == "cpu" or first <= rows <= most
        assert live["pte_wgpu.linear_group"] == live["pte_wgpu.linear_silu_mul"] == subgroups, rows
        assert not live["pte_wgpu.linear_residual"]
    await assert_matches_eager(model, module, calls, atol=ATOL, rtol=RTOL)


def test_subgroup_variants_need_the_feature():
    """Built for a CPU adapter, a linear and a SwiGLU with K = 96 use subgroups only where the
    device has them (model.py passes its feature), f32 and f16 tensors alike (the latter bound
    as vec2<u32>, 4 halves a load)."""

    class Graph:
        def __init__(self, dtype):
            self.params, self.dispatches = [], []
            self.values = [Tensor(dtype, (3, 96)), Tensor(dtype, (37, 96)), Scalar(None), Tensor(dtype, (3, 37))]
            self.values += [Tensor(dtype, (37, 96)), ValueList((3, 3, 3))]  # up, and SwiGLU's (out, gate, up)

    for dtype in ("float32", "float16"):
        for subgroups in (False, True):
            for name, args in (("aten.linear.default", [0, 1, 2, 3]), ("pte_wgpu.linear_silu_mul", [0, 1, 4, 5])):
                graph = Graph(dtype)
                build_node(graph, name, args, "cpu", subgroups)
                shaders = [d.shader or "" for d in graph.dispatches]
                assert any("subgroupAdd" in s for s in shaders) == subgroups, (name, dtype)
                assert any("array<f16>" in s for s in shaders) == (dtype == "float16"), (name, dtype)
                assert any("array<vec2<u32>>" in s for s in shaders if "subgroupAdd" in s) == (subgroups and dtype == "float16"), (name, dtype)


def test_grids_stay_within_limits():
    x, y, z = L.gemv_grid("aten.linear.default", 300_001, True, 1)
    assert max(x, y, z) <= 65535 and x * y * 4 >= 300_001
    x, y, z = L.gemv_grid("aten.mm.default", 2_200_001, False, 1)
    assert max(x, y, z) <= 65535 and x * y * 32 >= 2_200_001
    assert G.gemm_grid("aten.bmm.default", 7, 29, 3) == (1, 1, 3)
    with pytest.raises(ValueError, match="aten.bmm.default"):
        G.gemm_grid("aten.bmm.default", 7, 29, 70_000)


async def test_products_of_long_rows_keep_each_row_bitwise(load_pte, kernel_variants):
    """linear_wide_k8 (K = FLOAT_GEMM_MIN_K): with the GPU variants on a device with subgroups, the
    subgroup kernels take every row count to WIDE_K_SG_ROWS, a shape by the count (FLOAT_SG_GPU_WIDE:
    1, 2, 3 or more rows a subgroup), and the GEMM past it; a row of a pass of 5, 16 or 32 rows is
    bitwise the row alone with every variant set (values in test_dynamic_rows_switch_routes)."""
    data, _ = _export("linear_wide_k8")
    model = await load_pte(data)
    wide = kernel_variants == "gpu" and model.subgroups
    rng = np.random.default_rng(11)
    kernels = {}  # rows -> the subgroup kernels that ran
    for m in (1, 2, 5, 16, 32, 33):
        (x,) = _inputs("linear_wide_k8", m, rng)
        together = (await model.execute(x))[0]
        live = [d.shader or "" for i, d in enumerate(model.graph.dispatches) if all(model._default.state.grids[i])]
        kernels[m] = [s for s in live if "subgroupAdd" in s]
        if m in (5, 16, 32):
            np.testing.assert_array_equal(together[2:3], (await model.execute(x[2:3]))[0])
    if kernel_variants == "gpu":
        assert [len(kernels[m]) for m in sorted(kernels)] == ([1] * 5 + [0] if wide else [0] * 6)
    if wide:
        assert len({kernels[m][0] for m in (1, 2, 5)}) == 3 and kernels[5] == kernels[16] == kernels[32]


async def test_gemv_variant_runs_for_few_rows_of_a_wide_weight(load_pte, kernel_variants):
    """linear_bias_dyn_k4 (N >= GEMV_T4_MIN_N, K % 4 == 0) takes the vec4 GEMV on GPUs up to
    BITWISE_ROWS (16) rows, the one-invocation-per-output GEMV on CPU adapters without subgroups up
    to 32 rows, and the GEMM past those (on GPUs in 32 x 64 tiles to 32 rows: SMALL_TILE, 9 vec4s a
    K step's row of A); on CPU adapters with subgroups, the subgroup GEMV for one row and its 8-row form for
    any other count (values against eager past 16 rows here, at other rows in test_dynamic_rows_switch_routes)."""
    data, module = _export("linear_bias_dyn_k4")
    model = await load_pte(data)
    assert model.kernels == kernel_variants
    subgroups = kernel_variants == "cpu" and model.subgroups
    if kernel_variants == "gpu":
        shaders = {L.gemv_t4_shader(True): (1, 16)}
    elif subgroups:
        shaders = {L.gemv_sg_shader(True): (1,), L.gemv_sg_shader(True, L.SG_GEMM): (16, 17, 29, 41)}
    else:
        shaders = {L.gemv_shader(True, True, cpu=True): (1, 16, 17, 29)}
    dispatches = {shader: [i for i, d in enumerate(model.graph.dispatches) if d.shader == shader] for shader in shaders}
    assert all(len(found) == 1 for found in dispatches.values())
    assert any("row_of_a" in (d.shader or "") for d in model.graph.dispatches) == (kernel_variants == "gpu")
    rng = np.random.default_rng(3)
    for m in (1, 16, 17, 29, 41):
        await model.execute(*_inputs("linear_bias_dyn_k4", m, rng))
        for shader, ms in shaders.items():
            assert all(model._default.state.grids[dispatches[shader][0]]) == (m in ms), m
        if kernel_variants == "gpu" and m > 16:
            grids = model._default.state.grids
            (gemm,) = [d.shader for i, d in enumerate(model.graph.dispatches) if all(grids[i]) and "var<workgroup> As" in (d.shader or "")]
            assert ("As: array<vec4<f32>, 144>" in gemm) == (m <= 32), m
    await assert_matches_eager(model, module, [_inputs("linear_bias_dyn_k4", m, rng) for m in (29, 17, 41, 32)], atol=ATOL, rtol=RTOL)


class SelfAttention(torch.nn.Module):
    """torch's multi-head attention as vision transformers use it: its output projection of a 3-D
    input exports as bmm(x, expand(permute(weight)))."""

    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(28, 4, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


async def test_a_product_with_an_expanded_weight_runs_as_a_linear(load_pte):
    """bmm(x, expand(permute(w))) loads as linear(x, w) (kernels/fusion.py), without the copies,
    its bias added apart taken as the linear's, and matches eager (batches of 3 x 7 and 3 x 67 rows:
    the GEMV's and the GEMM's rows)."""
    for rows in (7, 67):
        data, module = export_pte(f"self_attention_{rows}", SelfAttention, (torch.randn(3, rows, 28),))
        model = await load_pte(data)
        names = [name for name, _ in model.graph.calls]
        assert "aten.expand_copy.default" not in names and names.count("aten.linear.default") >= 1, names
        assert "aten.add.Tensor" not in names, names
        await assert_matches_eager(model, module, [(np.random.default_rng(rows).standard_normal((3, rows, 28)).astype(np.float32),)], atol=ATOL, rtol=RTOL)


def test_gemm_splits_k_only_for_few_tiles():
    assert G.gemm_split(2047, 1536, 576, 1) == (1, 576)  # 768 tiles: enough
    splits, kspan = G.gemm_split(101, 576, 576, 1)  # 18 tiles
    assert splits == 8 and kspan % G.BK == 0 and (splits - 1) * kspan < 576 <= splits * kspan
    assert G.gemm_split(70, 67, 523, 1) == (7, 80)  # the last split is shorter
    assert G.gemm_split(37, 576, 100, 1) == (1, 100)  # K too short to split
    # one row of tiles (decode rows): up to 16 splits toward 1,024 workgroups
    assert G.gemm_split(64, 2048, 8192, 1) == (16, 512) and G.gemm_split(37, 576, 576, 1) == (9, 64)
    assert G.gemm_split(61, 16384, 2048, 1)[0] == 4 and G.gemm_split(65, 2048, 8192, 1)[0] == 4
    # dequantizing loads (4-bit weights) to 32 rows
    assert G.gemm_split(32, 2048, 8192, 1, G.SMALL_TILE, dequantizes=True)[0] == 16 and G.gemm_split(33, 2048, 8192, 1, dequantizes=True)[0] == 8
    for m, n, k, batch in ((37, 576, 576, 1), (70, 67, 523, 1), (67, 71, 199, 3), (300, 300, 4096, 1), (64, 2053, 8192, 1), (1, 7, 4099, 5)):
        splits, _ = G.gemm_split(m, n, k, batch)  # the splits' sums fit the scratch
        assert splits * batch * m * n <= max(G.SPLIT_TARGET * G.TILE.bm * G.TILE.bn, G.ROW_SPLIT_TARGET * G.TILE.bm * G.TILE.bn)


def test_mid_tiles_take_products_past_64_rows_and_wide_heads():
    assert G.takes_mid_tile(65, 29) and not G.takes_mid_tile(64, 4096)  # linear_bias_dyn_large, mm_dyn_split, fused_dyn at 65-71 rows
    assert G.takes_mid_tile(65, 32776, k_quads=True) and not G.takes_mid_tile(2047, 576, k_quads=True)  # 4-bit: 1,024 tiles (q4_mid)
    assert not G.takes_mid_tile(512, 2048, k_quads=True) and G.takes_mid_tile(2047, 2112, k_quads=True)
    assert G.takes_mid_tile(33, 65536, k_quads=True) and not G.takes_mid_tile(64, 65472, k_quads=True)  # an LM head at decode rows
    assert G.takes_mid_tile(33, 3072, f16_k=2048) and not G.takes_mid_tile(32, 3072, f16_k=2048) and not G.takes_mid_tile(64, 3072, f16_k=576)  # f16 decode rows


def test_big_tiles_take_large_products_of_long_k():
    assert G.takes_big_tile(128, 2048, 2048) and not G.takes_big_tile(127, 2048, 2048)  # linear_big, mm_big
    assert G.takes_big_tile(2047, 576, 1536) and not G.takes_big_tile(512, 576, 1536)  # SmolLM2's down at 2,047 rows only
    assert not G.takes_big_tile(2047, 1536, 576) and not G.takes_big_tile(1576, 3072, 768)  # K of 576-768


def test_wide_row_tiles_take_passes_of_33_to_64_rows_over_an_8b_models_weights():
    assert G.takes_wide_row_tile(33, 4096, 4096) and G.takes_wide_row_tile(64, 4104, 4128)  # q4_wide_rows
    assert not G.takes_wide_row_tile(32, 4096, 4096) and not G.takes_wide_row_tile(65, 4096, 4096)
    assert G.takes_wide_row_tile(48, 128256, 4096) and not G.takes_wide_row_tile(64, 2048, 8192)  # an 8B's head, not a 1B's down


def test_shape_errors_name_the_op():
    def op(name):
        return OpBuilder(None, name, ())

    with pytest.raises(ValueError, match=r"aten.linear.default: input \(7, 12\) has K=12"):
        L.linear_shapes(op("aten.linear.default"))((7, 12), (29, 13))
    with pytest.raises(ValueError, match="aten.mm.default: cannot multiply"):
        L.mm_shapes(op("aten.mm.default"))((7, 13), (12, 29))
    with pytest.raises(ValueError, match="aten.bmm.default: cannot batch-multiply"):
        L.bmm_shapes(op("aten.bmm.default"))((3, 7, 13), (2, 13, 29))
    assert L.linear_shapes(op("x"))((2, 3, 13), (29, 13)) == (1, 6, 29, 13, 0, 0, (2, 3, 29))
    assert L.bmm_shapes(op("x"))((3, 7, 13), (3, 13, 29)) == (3, 7, 29, 13, 91, 377, (3, 7, 29))


def test_uniform_layout_matches_wgsl():
    assert G.PARAMS_SIZE == 56  # b.params rounds it up to 64
    for has_bias in (False, True):
        for transposed in (False, True):
            for src in (L.gemv_shader(transposed, has_bias), G.gemm_shader(G.float_load(transposed), has_bias)):
                assert G.STRUCT in src
                assert ("var<storage, read> bias" in src) == has_bias


def test_fusion_leaves_a_malformed_graph_unfused():
    """A view with no operands and a linear whose weight is a scalar (what a corrupted file can
    hold): the rewrites roll back and leave the calls as they were, for the ops' builds to refuse."""
    from types import SimpleNamespace

    from pte_wgpu.kernels.fusion import fuse, fuse_ragged
    from pte_wgpu.resize.values import Scalar, Tensor

    values = [Tensor("float32", (3, 5)), Scalar(2.0), Scalar(None), Tensor("float32", (3, 7))]
    calls = [("aten.linear.default", (0, 1, 2, 3)), ("aten.squeeze_copy.dims", ()), ("aten.add.Tensor", (3, 3, 1, 3))]
    graph = SimpleNamespace(calls=list(calls), values=values, outputs=[3])
    assert fuse(graph) == 0 and fuse_ragged(graph) == 0
    assert graph.calls == calls
