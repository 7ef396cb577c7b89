"""4-bit group-symmetric weights (`et_vk.linear_q4gsw`, `et_vk.embedding_q4gsw`) and 8-bit dynamic
activations with 4-bit weights (`torchao.choose_qparams_affine` + `et_vk.linear_dq8ca_q4gsw`),
against the torchao-quantized eager module, on both linear routes (GEMV at M == 1, tiled GEMM
otherwise) with live M changing in random order.

The activation quantization is exact: an 8da4w layer whose weight is diagonal has one product per
output, so its output matches eager's to its last bits only if every scale, zero point and int8
value matches (a wrong one is off by a quantization step, ~1/128 of the value): bit-identical
where the products multiply floats, within 2 ulps where the subgroup kernels multiply the int8
rows (the integer product times the weight's scale, then the row's: two roundings where eager
rounds the two dequantized values and their product). Outputs of full layers differ from eager
only by fp32 summation order.
"""

import functools
import random

import numpy as np
import pytest
import torch
from pte_wgpu.kernels.matmul import gemm
from pte_wgpu.kernels.matmul.q4_linear import QUANTIZING_SG_ROWS
from pte_wgpu.kernels.matmul.routes import BITWISE_ROWS

from async_runtime.testing import assert_matches_eager

from .exporting import export_pte
from .one_kernel import run_kernel

pytestmark = pytest.mark.usefixtures("adapter")

ATOL = RTOL = 1e-4


def _config(kind, group):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    if kind == "4w":
        return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group))
    return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group))


def quantized(make, kind, group, module_type=torch.nn.Linear):
    """A factory for `make()` with its `module_type` layers quantized by torchao (kind "4w" or
    "8da4w"); export_pte's caching and PTE_WGPU_EXPORT_DIR apply to it unchanged (the quantized
    state dict round-trips through torch.save)."""

    def build():
        from torchao.quantization import quantize_

        module = make().eval()
        quantize_(module, _config(kind, group), filter_fn=lambda m, fqn: isinstance(m, module_type))
        return module

    return build


class Linear(torch.nn.Module):
    def __init__(self, k, n, bias, diagonal=False):
        super().__init__()
        self.fc = torch.nn.Linear(k, n, bias=bias)
        if diagonal:
            with torch.no_grad():
                self.fc.weight.copy_(torch.diag(torch.rand(n) * 1.5 + 0.5))

    def forward(self, x):
        return self.fc(x)


class Embedding(torch.nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)

    def forward(self, idx):
        return self.emb(idx)


def _m(max_m):
    return torch.export.Dim("m", min=1, max=max_m)


# name -> (quantized module factory, example shape at max M, axis of live M)
CASES = {
    # K = 36 is padded to 40 in the packed rows; group 12 straddles weight words
    "q4_small": (quantized(lambda: Linear(36, 28, False), "4w", 12), (17, 36), 0),
    # two 64-row and two 64-column GEMM tiles, bias, group 32 (one scale per weight word)
    "q4_bias_large": (quantized(lambda: Linear(160, 76, True), "4w", 32), (70, 160), 0),
    # Llama-shaped [1, S, K] input
    "q4_3d": (quantized(lambda: Linear(64, 44, False), "4w", 16), (1, 9, 64), 1),
    "dq8_small_bias": (quantized(lambda: Linear(36, 28, True), "8da4w", 12), (17, 36), 0),
    "dq8_large": (quantized(lambda: Linear(160, 76, False), "8da4w", 32), (70, 160), 0),
    "dq8_3d": (quantized(lambda: Linear(64, 44, True), "8da4w", 16), (1, 9, 64), 1),
    "dq8_diagonal": (quantized(lambda: Linear(64, 64, False, diagonal=True), "8da4w", 32), (70, 64), 0),
    # N not a multiple of 8 (ExecuTorch cannot export an odd N), K a multiple of 32, groups of 32
    # and 64: the subgroup kernels of CPU adapters, a partial row group
    "q4_n52": (quantized(lambda: Linear(96, 52, True), "4w", 32), (33, 96), 0),
    "dq8_n44": (quantized(lambda: Linear(192, 44, False), "8da4w", 64), (33, 192), 0),
    # wide weights, N not a multiple of a workgroup's outputs
    "q4_wide": (quantized(lambda: Linear(96, 1032, True), "4w", 32), (70, 96), 0),
    "dq8_wide": (quantized(lambda: Linear(64, 1048, False), "8da4w", 16), (33, 64), 0),
    # N >= GEMV_T4_MIN_N (an LM head): GPUs take the GEMM past BITWISE_ROWS rows
    "q4_lm_head": (quantized(lambda: Linear(64, 8200, False), "4w", 32), (33, 64), 0),
    # SmolLM2's K: the GPU GEMV's three routes (256, 64 and 32 lanes a quad of outputs)
    "q4_k576": (quantized(lambda: Linear(576, 44, True), "4w", 32), (33, 576), 0),
    # K of a 1B model's rows (kernels/matmul/routes.py's q4_wide): on GPUs the GEMV of 4-weight
    # steps up to 16 rows, the GEMM past them; group 32, and 96 (groups across vec4s of words)
    "q4_k2080": (quantized(lambda: Linear(2080, 44, True), "4w", 32), (21, 2080), 0),
    "q4_k2112_g96": (quantized(lambda: Linear(2112, 36, False), "4w", 96), (17, 2112), 0),
    # N and K of 2,048 and more: GPUs take the 128 x 128 tiles (gemm.py's takes_big_tile) at 130 and 131 rows
    "q4_big": (quantized(lambda: Linear(2080, 2056, True), "4w", 32), (131, 2080), 0),
    # N and K of 4,096 and more: GPUs take the 64 x 128 tiles (gemm.py's takes_wide_row_tile) at 33 to 64 rows,
    # the 32 x 64 tiles to 32 rows; the last column tile partial
    "q4_wide_rows": (quantized(lambda: Linear(4128, 4104, True), "4w", 32), (61, 4128), 0),
    # past 64 rows, products of at least 1,024 tiles: GPUs take the 64 x 64 tiles at 8 x 4 an invocation (gemm.py's takes_mid_tile)
    "q4_mid": (quantized(lambda: Linear(64, 32776, True), "4w", 32), (131, 64), 0),
    # an LM head of 1,025 tiles: past 32 rows GPUs take the 8 x 4 tiles at decode rows too, the 32 x 64 tiles to 32
    "q4_mid_head": (quantized(lambda: Linear(64, 65600, False), "4w", 32), (37, 64), 0),
    # long rows: the GPU GEMV's 256 lanes a quad at every row count (1,041 words), and 128 (275 words)
    "q4_long_k": (quantized(lambda: Linear(8328, 52, False), "4w", 24), (9, 8328), 0),
    "dq8_long_k": (quantized(lambda: Linear(2200, 36, True), "8da4w", 40), (9, 2200), 0),
    # int8 rows (K a multiple of 16) on the GPUs' subgroup kernels of 1 to 16 rows: of a 1B
    # model's K (q4_wide), whose workgroups split K, and of an LM head's N, whose do not
    "dq8_k2080": (quantized(lambda: Linear(2080, 44, True), "8da4w", 32), (21, 2080), 0),
    "dq8_lm_head": (quantized(lambda: Linear(64, 8200, False), "8da4w", 32), (33, 64), 0),
    # prompts' rows (gemm.py's WIDEN_MIN_ROWS and more), where GPUs widen the weights of large
    # products to f32 first; the 8da4w product's rows quantized once to int8 rows, which its GEMM reads
    "q4_widened": (quantized(lambda: Linear(264, 140, True), "4w", 24), (263, 264), 0),
    "dq8_widened": (quantized(lambda: Linear(272, 76, False), "8da4w", 16), (263, 272), 0),
}


def _export(name):
    make, shape, axis = CASES[name]
    dyn = ({axis: _m(shape[axis])},)
    return export_pte(name, make, [torch.randn(*shape)], dynamic_shapes=dyn)


PREBUILD = [functools.partial(_export, name) for name in CASES]  # tests/prebuild.py


def _rows(name, m, rng):
    """Random rows at mixed magnitudes, plus rows whose quantization hits exact .5 ties."""
    _, shape, axis = CASES[name]
    shape = list(shape)
    shape[axis] = m
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    k = shape[-1]
    for r in range(flat.shape[0]):
        kind = r % 5
        if kind == 1:
            flat[r] *= np.float32(1e-3)
        elif kind == 2:
            flat[r] *= np.float32(300.0)
        elif kind == 3:  # range 255 -> scale 1, zero point 0: halves are ties
            flat[r] = rng.integers(-256, 254, k) / 2
            flat[r, 0], flat[r, 1] = -128.0, 127.0
        elif kind == 4:  # range 510 -> scale 2: odd integers are ties
            flat[r] = rng.integers(-256, 255, k)
            flat[r, 0], flat[r, 1] = -256.0, 254.0
    return x


def _live_ms(name):
    _, shape, axis = CASES[name]
    max_m = shape[axis]
    ms = sorted({1, 2, 3, max_m, max_m - 1, (max_m + 1) // 2, min(65, max_m)})
    random.Random(name).shuffle(ms)  # assert_matches_eager runs them in this order, then shuffled
    return ms


DIAGONAL_RTOL = 2.5e-7  # 2 ulps


@pytest.mark.parametrize("name", sorted(CASES))
async def test_quantized_linear_routes(name, load_pte, kernel_variants):
    """Live M over 1 (GEMV) and 2..max (GEMM, partial and several tiles), random order, repeats;
    with the GPU variants and the CPU adapters' (with subgroups here, the subgroup GEMV where
    K and the group size are multiples of 16)."""
    data, module = _export(name)
    atol = rtol = ATOL
    if name == "dq8_diagonal":  # one product per output (the module docstring)
        atol, rtol = 0, DIAGONAL_RTOL
    if name in ("q4_big", "q4_wide_rows", "q4_widened", "dq8_widened"):  # long sums from rows scaled by 300: some cancel near 0.2
        atol = rtol = 1e-3
    rng = np.random.default_rng(7)
    calls = [_rows(name, m, rng) for m in _live_ms(name)]
    model = await load_pte(data)
    if name.startswith("dq8") and not model.int8_matrices:  # the rows quantized once to int8, the products 4-bit linears of them
        assert [call for call, _ in model.graph.calls if "linear" in call or "quantized" in call] == ["pte_wgpu.quantized_rows", "et_vk.linear_q4gsw.default"]
        rows = next(args[0] for call, args in model.graph.calls if call == "et_vk.linear_q4gsw.default")
        assert model.graph.values[rows].dtype == ("int32" if CASES[name][1][-1] % 16 == 0 else "float32")  # as int8 rows: of whole 16s
    await assert_matches_eager(model, module, calls, atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", sorted(n for n in CASES if n.startswith("dq8")))
async def test_dq8_products_quantizing_their_rows_as_they_read(name, load_pte, kernel_variants, monkeypatch):
    """The 8da4w products as devices with int8 matrices keep them (their kernels quantize each row
    as they read it, where elsewhere the rows are quantized once before 4-bit linears of them):
    against eager as above, dq8_diagonal bit for bit."""
    import async_runtime.model

    fuse = async_runtime.model.fuse
    monkeypatch.setattr(async_runtime.model, "fuse", lambda graph, int8_matrices: fuse(graph, True))
    data, module = _export(name)
    model = await load_pte(data)
    assert "pte_wgpu.quantized_rows" not in [call for call, _ in model.graph.calls]
    rng = np.random.default_rng(7)
    calls = [_rows(name, m, rng) for m in _live_ms(name)]
    tol = 0 if name == "dq8_diagonal" else ATOL
    await assert_matches_eager(model, module, calls, atol=tol, rtol=tol)


@pytest.mark.parametrize("name, subgroup", [("q4_n52", True), ("dq8_n44", True), ("q4_3d", True), ("q4_small", False)])
async def test_cpu_adapters_take_the_subgroup_gemv(name, subgroup, load_pte, kernel_variants):
    """With the CPU variants on a device with subgroups, one decode row runs the subgroup GEMV
    where K and the groups are multiples of 16 (a lane's step; not q4_small's K = 36, groups of
    12), and only then."""
    model = await load_pte(_export(name)[0])
    await model.execute(_rows(name, 1, np.random.default_rng(2)))
    grids = model._default.state.grids
    ran = any("subgroupAdd" in (d.shader or "") and all(grids[i]) for i, d in enumerate(model.graph.dispatches))
    assert ran == (subgroup and kernel_variants == "cpu" and model.subgroups)


@pytest.mark.parametrize("name, most, subgroup", [("q4_wide", (64, 64), (17, 64)), ("dq8_wide", (64, 32), (17, 64)), ("q4_lm_head", (16, 16), (1, 16))])
async def test_gpus_take_the_gemv_up_to_its_rows(name, most, subgroup, load_pte, kernel_variants):
    """With the GPU variants a wide 4-bit linear runs the GEMV up to BITWISE_ROWS rows, on a
    device with subgroups their kernel for 17 to Q4_GEMV_MAX_ROWS rows (kernels/matmul/routes.py's
    Q4_SG_GPU_ROWS; without subgroups the GEMV), and the tiled GEMM past that; dq8 products alike
    (without subgroups the GEMV to GEMV_MAX_ROWS); an LM head (N >= GEMV_T4_MIN_N) the subgroup
    kernels up to BITWISE_ROWS (Q4_SG_GPU_WIDE; without subgroups the GEMV), the GEMM past.
    `most`: the rows before the GEMM with subgroups and without."""
    model = await load_pte(_export(name)[0])
    if kernel_variants != "gpu":
        pytest.skip("the GPU variants")
    most = most[0] if model.subgroups else most[1]
    for m in (m for m in (1, 16, 17, 32, 33, 64, 65) if m <= CASES[name][1][0]):
        await model.execute(_rows(name, m, np.random.default_rng(m)))
        grids = model._default.state.grids
        running = [d.shader or "" for i, d in enumerate(model.graph.dispatches) if all(grids[i])]
        assert any("subgroupAdd" in s for s in running) == bool(subgroup and model.subgroups and subgroup[0] <= m <= subgroup[1]), m
        assert any("var<workgroup> As" in s for s in running) == (m > most), m


@pytest.mark.parametrize("name", ["dq8_k2080", "dq8_lm_head", "dq8_wide"])
async def test_subgroup_kernels_multiply_the_int8_rows(name, load_pte, kernel_variants):
    """An 8da4w product's rows quantized once, of a multiple of 16: whichever subgroup kernel takes
    them (GPU variants: 1-16 rows of wide K or an LM head, 17-64 of narrower weights; CPU
    variants: every count) multiplies their int8 values with dot4I8Packed, and no other route
    does (they read the floats). A pass of one row (the GEMV or a subgroup kernel), or of up to
    QUANTIZING_SG_ROWS where the GPUs' subgroup kernels take every row count, has the product
    quantize its rows itself, and pte_wgpu.quantized_rows runs no dispatch: each row's result is
    bitwise what it gets in a pass of up to 16 rows."""
    model = await load_pte(_export(name)[0])
    if not model.subgroups or model.int8_matrices:
        pytest.skip("no subgroups, or the dq8 products kept for int8 matrices")
    quantizes = QUANTIZING_SG_ROWS if kernel_variants == "gpu" and name != "dq8_wide" else 1
    for m in sorted({1, 2, 3, QUANTIZING_SG_ROWS, QUANTIZING_SG_ROWS + 1, 16, 17, CASES[name][1][0]}):
        x = _rows(name, m, np.random.default_rng(m))
        out = (await model.execute(x))[0]
        grids = model._default.state.grids
        running = [d for i, d in enumerate(model.graph.dispatches) if all(grids[i])]
        shaders = [d.shader or "" for d in running]
        subgroup = any("subgroupAdd" in s for s in shaders)
        assert any("dot4I8Packed" in s for s in shaders) == subgroup, m
        assert subgroup == (kernel_variants == "cpu" or (m <= 16) != (name == "dq8_wide")), m
        quantizing = any("x_qp(" in s for s in shaders)
        assert quantizing == (m <= quantizes), m
        assert any(d.op == "pte_wgpu.quantized_rows" for d in running) != quantizing, m
        if 1 < m <= 16:  # the first and last rows alone, through the one-row route (a pass of at most 16 rows is bitwise each alone)
            for r in (0, m - 1):
                row = x[r : r + 1] if CASES[name][2] == 0 else x[:, r : r + 1]
                alone = (await model.execute(row))[0].reshape(-1)
                np.testing.assert_array_equal(alone, out.reshape(-1)[r * alone.size : (r + 1) * alone.size], err_msg=f"row {r} of {m}")


async def test_gpus_take_the_wide_row_tile_past_32_rows(load_pte, kernel_variants):
    """With the GPU variants, N and K of 4,096 and more: the dequantizing GEMM runs 64 x 128 tiles
    for 33 to 64 rows (gemm.py's WIDE_ROW_TILE: 17 vec4s a K step's row of A, 33 of B), 32 x 64
    tiles for 17 to 32."""
    model = await load_pte(_export("q4_wide_rows")[0])
    if kernel_variants != "gpu":
        pytest.skip("the GPU variants")
    for m in (33, 32, 61):
        await model.execute(_rows("q4_wide_rows", m, np.random.default_rng(m)))
        grids = model._default.state.grids
        running = [d.shader or "" for i, d in enumerate(model.graph.dispatches) if all(grids[i])]
        wide = any("As: array<vec4<f32>, 272>" in s and "Bs: array<vec4<f32>, 528>" in s for s in running)
        assert wide == (m > 32), m


async def test_gpus_take_small_and_mid_tiles_for_a_wide_head_at_decode_rows(load_pte, kernel_variants):
    """With the GPU variants, an LM head of at least 1,024 tiles (gemm.py's MID_MIN_K_QUAD_TILES)
    past BITWISE_ROWS rows (none to them: the subgroup kernels): the dequantizing GEMM runs 32 x 64
    tiles to 32 rows (SMALL_TILE: 9 vec4s a K step's row of A), then 64 x 64 tiles at 8 x 4
    outputs an invocation (MID_TILE: 128 invocations, not TILE's 256)."""
    model = await load_pte(_export("q4_mid_head")[0])
    if kernel_variants != "gpu":
        pytest.skip("the GPU variants")
    for m in (33, 16, 37, 17, 32):
        await model.execute(_rows("q4_mid_head", m, np.random.default_rng(m)))
        grids = model._default.state.grids
        running = [d.shader or "" for i, d in enumerate(model.graph.dispatches) if all(grids[i]) and "var<workgroup> As" in (d.shader or "")]
        assert len(running) == (m > BITWISE_ROWS), m
        if m > 32:
            assert "@workgroup_size(16, 8)" in running[0] and "As: array<vec4<f32>, 272>" in running[0], m
        elif m > BITWISE_ROWS:
            assert "As: array<vec4<f32>, 144>" in running[0], m


async def test_gpu_gemv_rows_are_each_row_alone(load_pte, kernel_variants):
    """With the GPU variants, K = 576 (72 words a row): the GEMV takes one row at 256 lanes a quad
    of outputs, 2 to 16 rows at 64 and 17 to 32 at 32 (kernels/matmul/q4_linear.py's gemv_routes;
    on a device with subgroups their kernel takes 17 to 32), and each row of a pass of up to 16
    rows is bitwise what it gets alone."""
    if kernel_variants != "gpu":
        pytest.skip("the GPU variants")
    model = await load_pte(_export("q4_k576")[0])
    rng = np.random.default_rng(5)
    for m, lanes in ((1, 256), (2, 64), (16, 64), (17, 32), (32, 32)):
        await model.execute(_rows("q4_k576", m, rng))
        grids = model._default.state.grids
        running = [d.shader for i, d in enumerate(model.graph.dispatches) if d.shader and all(grids[i])]
        kernel = "subgroupAdd" if m > 16 and model.subgroups else f"let lane = li % {lanes}u;"
        assert [kernel in s for s in running] == [True], m
    x = _rows("q4_k576", 16, rng)
    alone = np.concatenate([(await model.execute(x[i : i + 1]))[0] for i in range(16)])
    for m in (2, 7, 16):
        np.testing.assert_array_equal((await model.execute(x[:m]))[0], alone[:m], err_msg=f"{m} rows")


@pytest.mark.parametrize("name", ["q4_k2080", "q4_k2112_g96"])
async def test_gpu_products_of_wide_k_take_16_rows_each_as_alone(name, load_pte, kernel_variants):
    """With the GPU variants, K >= Q4_GEMM_MIN_K: the subgroup kernels take 1 to 16 rows (without
    subgroups the GEMV, a lane 4 weights at a step at the same lanes for every count:
    kernels/matmul/q4_linear.py's gemv_step), the GEMM more, and each row of a pass of up to 16
    rows, in any order, is bitwise what it gets alone."""
    if kernel_variants != "gpu":
        pytest.skip("the GPU variants")
    model = await load_pte(_export(name)[0])
    rng = np.random.default_rng(13)
    x = _rows(name, 16, rng)
    alone = np.concatenate([(await model.execute(x[i : i + 1]))[0] for i in range(16)])
    for m in (7, 16, 2, 3, 17, 11):
        rows = rng.permutation(16)[:m] if m <= 16 else None
        (got,) = await model.execute(np.ascontiguousarray(x[rows]) if m <= 16 else np.concatenate([x, _rows(name, 1, rng)]))
        grids = model._default.state.grids
        running = [d.shader for i, d in enumerate(model.graph.dispatches) if d.shader and all(grids[i])]
        assert any("var<workgroup> As" in s for s in running) == (m > 16), m
        if m <= 16:
            assert [("subgroupAdd" if model.subgroups else ">> ((u % 2u) * 16u)") in s for s in running] == [True], m
            np.testing.assert_array_equal(got, alone[rows], err_msg=f"{m} rows")


@pytest.mark.parametrize("name", ["q4_n52", "dq8_n44"])
async def test_cpu_subgroup_rows_are_each_row_alone(name, load_pte, monkeypatch):
    """With the CPU variants on a device with subgroups, the linear runs only subgroup kernels at
    every row count (1; 2, 8, 9 and 33 in groups of Q4_SG_GEMM's rows, a partial one included),
    and each row of a pass is bitwise what the row gets alone."""
    from pte_wgpu.kernels.matmul.q4_linear import Q4_SG_GEMM

    monkeypatch.setenv("PTE_WGPU_KERNELS", "cpu")
    model = await load_pte(_export(name)[0])
    if not model.subgroups:
        pytest.skip("the adapter has no subgroup feature")
    x = _rows(name, 33, np.random.default_rng(11))
    alone = np.concatenate([(await model.execute(x[r : r + 1]))[0] for r in range(33)])
    for m in (2, Q4_SG_GEMM[0], Q4_SG_GEMM[0] + 1, 33):
        (got,) = await model.execute(x[:m])
        live = [d for i, d in enumerate(model.graph.dispatches) if "linear" in d.op and all(model._default.state.grids[i])]
        assert [("subgroupAdd" in d.shader) for d in live] == [True], m
        np.testing.assert_array_equal(got, alone[:m])


async def test_dq8_graph_has_the_dynamic_quantization_ops():
    from async_runtime.program.pte import read_program
    from async_runtime.program.vkgraph import read_vkgraph

    data, _ = _export("dq8_small_bias")
    (delegate,) = read_program(data).method("forward").delegates
    names = [c.name for c in read_vkgraph(delegate.blob).chain]
    assert "torchao.choose_qparams_affine.default" in names
    assert "et_vk.linear_dq8ca_q4gsw.default" in names
    data, _ = _export("q4_small")
    (delegate,) = read_program(data).method("forward").delegates
    assert "et_vk.linear_q4gsw.default" in [c.name for c in read_vkgraph(delegate.blob).chain]


@pytest.mark.parametrize("vocab,dim,group", [(37, 64, 32), (29, 96, 12)])
async def test_embedding_q4gsw(vocab, dim, group, load_pte):
    """Quantized rows gathered by a dynamic number of indices, dequantized bit-exactly (the
    exporter matches only embedding dims that are multiples of 32)."""
    name = f"q4_embedding_{vocab}_{dim}_{group}"
    make = quantized(lambda: Embedding(vocab, dim), "4w", group, torch.nn.Embedding)
    data, module = export_pte(name, make, [torch.randint(0, vocab, (11,))], dynamic_shapes=({0: _m(11)},))
    rng = np.random.default_rng(3)
    calls = [rng.integers(0, vocab, n).astype(np.int64) for n in [11, 1, 4, 7]]
    for idx in calls:
        idx[0] = vocab - 1
    await assert_matches_eager(await load_pte(data), module, calls, atol=0, rtol=0)


@pytest.mark.parametrize("off", [0, -3, 2, -7, 9])
def test_div_rn_is_correctly_rounded(off):
    """The shaders' software division against numpy's IEEE float32 division, with the float
    division's estimate of the quotient as the device gives it, and `off` units off: corrected by
    the remainder, or (past 4) by the long division."""
    from pte_wgpu.kernels.wgsl import DIV_RN

    estimate = "u32(f32(ma) / f32(mb) * 8388608.0)"
    assert estimate in DIV_RN
    div_rn = DIV_RN.replace(estimate, f"u32(i32({estimate}) + {off})")

    rng = np.random.default_rng(0)
    n = 1 << 18
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)
    b = (np.abs(rng.standard_normal(n)) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)
    # a quarter whose quotients lie within a unit in the last place of a tie between two floats
    # (the rounding's hard cases), a quarter of exact quotients
    t = slice(n // 2, 3 * n // 4)
    lo = (rng.uniform(1.0, 2.0, n // 4) * 2.0 ** rng.integers(-20, 20, n // 4)).astype(np.float32)
    tie = lo.astype(np.float64) + np.spacing(lo).astype(np.float64) / 2
    a[t] = (tie * b[t]).astype(np.float32)
    x = slice(3 * n // 4, n)
    a[x] = (rng.integers(-(1 << 12), 1 << 12, n // 4) * b[x].astype(np.float64)).astype(np.float32)
    a[:8] = [0.0, 1.0, 255.0, -128.0, 3.0, 1e-30, 7.0, -0.0]
    b[:8] = [1.0, 3.0, 255.0, 0.5, 3.0, 7e30, 2.0 ** -126, 5.0]
    src = (
        "@group(0) @binding(0) var<storage, read> a: array<f32>;\n"
        "@group(0) @binding(1) var<storage, read> b: array<f32>;\n"
        "@group(0) @binding(2) var<storage, read_write> q: array<f32>;\n"
        + div_rn
        + "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
        "    q[g.x] = div_rn(a[g.x], b[g.x]);\n}\n"
    )
    got = run_kernel(src, (a, b), np.float32, n)
    with np.errstate(all="ignore"):
        want = a / b
    # normal quotients exactly; subnormal ones flush to zero
    normal = np.abs(want) >= np.finfo(np.float32).tiny
    np.testing.assert_array_equal(got[normal], want[normal])
    assert np.all(got[~normal] == 0)


@pytest.mark.parametrize("name", ["q4_widened", "dq8_widened"])
async def test_gpus_widen_the_weights_of_many_rows_first(name, load_pte, monkeypatch):
    """With the GPU variants, a product of gemm.py's WIDEN_MIN_ROWS rows or more (and WIDEN_MIN_WORK
    multiply-adds, 0 here: these are small) widens its 4-bit weight to f32 (WIDEN), then runs the
    f32 weights' GEMM over it; fewer rows keep the dequantizing GEMM. The widened values are those
    the dequantizing loads compute, and each output sums its K ranges in the same order: bitwise
    that GEMM's results (the same file loaded with the widening off)."""
    monkeypatch.setenv("PTE_WGPU_KERNELS", "gpu")
    monkeypatch.setattr(gemm, "WIDEN_MIN_WORK", 0)
    data = _export(name)[0]
    ms = [CASES[name][1][0], gemm.WIDEN_MIN_ROWS - 1, gemm.WIDEN_MIN_ROWS, 131]
    model, outs = await load_pte(data), []
    for m in ms:
        outs.append((await model.execute(_rows(name, m, np.random.default_rng(m))))[0])
        grids = model._default.state.grids
        running = [d.shader or "" for i, d in enumerate(model.graph.dispatches) if all(grids[i])]
        assert any("wide[i] = b_k_quad(" in s for s in running) == (m >= gemm.WIDEN_MIN_ROWS), m
        assert any("var<workgroup> As" in s for s in running), m
    monkeypatch.setattr(gemm, "WIDEN_MIN_ROWS", 1 << 30)
    dequantizing = await load_pte(data)
    for m, out in zip(ms, outs):
        np.testing.assert_array_equal((await dequantizing.execute(_rows(name, m, np.random.default_rng(m))))[0], out, err_msg=f"{m} rows")
