"""f16 storage for the matrix products (linear, mm, bmm, addmm, the fused linears, the 4-bit
linears): fp16 modules exported as they are, run with `model.precision == "f16"`, against torch
eager fp16 of the same module and inputs, on every route (the GEMV at 1 row and up to
GEMV_MAX_ROWS, the vec4 GEMV, the tiled GEMM, split-K) with live M changing in random order, under
both kernel variant sets.

Tolerances: the kernels sum in f32 and round once to f16 at the store, and torch's CPU fp16 matmul
does the same, so an output differs by at most an f16 ulp or so (2^-10 relative, about 1e-3):
rtol = atol = 2e-3. The 4-bit linears: eager rounds each dequantized weight (scale * nibble) to f16
first and computes the dynamic activation quantization's scales in f16, the kernels do both in f32
(the scales rounded to f16 once); the fused SwiGLU's GEMV computes g * sigmoid(g) * up in f32 where
eager rounds each step to f16: a few f16 ulps of the largest output, atol = rtol = 1e-2.
"""

import copy
import functools
import itertools
import random

import numpy as np
import pytest
import torch
from pte_wgpu.kernels import build_node, fuse
from pte_wgpu.kernels.matmul import f16_matrix, gemm, q4_fused_linear, q4_linear
from pte_wgpu.kernels.matmul.q4_linear import scales_in_row_quads
from pte_wgpu.kernels.variants import GPU
from pte_wgpu.kernels.wgsl import fill
from pte_wgpu.kernels.matmul import routes as R

from async_runtime.program.graph import link
from async_runtime.program.pte import read_program
from async_runtime.testing import assert_matches_eager

from . import test_linear_ops as linear_ops
from .exporting import export_pte
from .test_linear_ops import BMM, MM, Linear
from .test_quantized_ops import Linear as QLinear
from .test_quantized_ops import quantized

pytestmark = pytest.mark.usefixtures("adapter", "half_adapter", "kernel_variants")

ATOL = RTOL = 2e-3
Q_ATOL = Q_RTOL = 1e-2


def _m(max_m):
    return torch.export.Dim("m", min=1, max=max_m)


class AddMM(torch.nn.Module):
    """addmm of inputs only (a parameter would arrive through et_vk.prepack, a copy op of its own)."""

    def forward(self, bias, a, b):
        return torch.addmm(bias, a, b, beta=0.5, alpha=2.0)


class FusedLinears(linear_ops.FusedLinears):
    """What kernels/fusion.py merges, on 2-D rows (no views): q/k/v of one input, residual linears,
    SwiGLU with SiLU spelled as g * sigmoid(g) (torch's fp16 SiLU goes through f32 casts, which
    the SwiGLU pattern does not look through)."""

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        h = x + self.o(q)
        g = self.gate(h)
        return q, k, v, h + self.down(g * torch.sigmoid(g) * self.up(h))


class NormedFusedLinears(FusedLinears):
    """FusedLinears with ExecuTorch's llama RMS norm before q/k/v and before SwiGLU, which their
    fused GEMVs take in (kernels/fusion.py's rms_ ops)."""

    def __init__(self, *dims):
        super().__init__(*dims)
        self.g1, self.g2 = (torch.nn.Parameter(torch.randn(dims[0])) for _ in range(2))

    @staticmethod
    def norm(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * g

    def forward(self, x):
        h = self.norm(x, self.g1)
        q, k, v = self.q(h), self.k(h), self.v(h)
        x = x + self.o(q)
        h = self.norm(x, self.g2)
        g = self.gate(h)
        return q, k, v, x + self.down(g * torch.sigmoid(g) * self.up(h))


# name -> (fp16 module factory, example shapes at max M, axis of live M per input (None: fixed))
CASES = {
    # odd K and N; the GEMM's rows past GEMV_MAX_ROWS split K (gemm_split)
    "f16_linear_bias": (lambda: Linear(523, 67, True).half(), [(70, 523)], [0]),
    # K a multiple of 4, N >= GEMV_T4_MIN_N: the vec4 GEMV, vec4<f16> weight loads; with K a
    # multiple of 8, 8 weights a load (vec4<u32> of f16 pairs)
    "f16_linear_wide_k4": (lambda: Linear(76, 8209, True).half(), [(41, 76)], [0]),
    "f16_linear_wide_k8": (lambda: Linear(80, 8209, False).half(), [(41, 80)], [0]),
    # K = FLOAT_GEMM_MIN_K: on GPUs the subgroup kernels to 32 rows, then the GEMM in 8 x 4 register tiles
    "f16_linear_k2048": (lambda: Linear(2048, 67, False).half(), [(41, 2048)], [0]),
    "f16_mm_split": (MM, [(70, 257), (257, 97)], [0, None]),
    "f16_bmm": (BMM, [(3, 67, 199), (3, 199, 71)], [1, None]),
    "f16_addmm": (AddMM, [(29,), (17, 13), (13, 29)], [None, 0, None]),
    # q/k/v group, residual linears, SwiGLU (kernels/fusion.py)
    "f16_fused": (lambda: FusedLinears(37, 41, 23, 53).half(), [(71, 37)], [0]),
    # every K whole vec4s, odd N for k/v: the CPU adapters' subgroup kernels for all five products
    "f16_fused_k4": (lambda: FusedLinears(40, 44, 23, 52).half(), [(71, 40)], [0]),
    # every K a multiple of 8: the GPU GEMVs load 8 f16 weights a load; norms folded into them
    "f16_norm_fused_k8": (lambda: NormedFusedLinears(48, 40, 23, 72).half(), [(71, 48)], [0]),
    # ... with q/k/v biases (Qwen2.5's): one rms_linear_bias_group
    "f16_norm_fused_bias_k8": (lambda: NormedFusedLinears(48, 40, 23, 72, True).half(), [(71, 48)], [0]),
    # ... and K = FLOAT_GEMM_MIN_K: on GPUs the subgroup kernels fold the norm, to 32 rows without f16 matrices (routes.py's fused_norm_rows)
    "f16_norm_fused_wide": (lambda: NormedFusedLinears(2048, 40, 23, 72).half(), [(41, 2048)], [0]),
    # 4-bit weights with fp16 activations, scales and bias; K padded, a group straddling words
    "f16_q4": (quantized(lambda: QLinear(36, 28, True).half(), "4w", 12), [(70, 36)], [0]),
    "f16_dq8": (quantized(lambda: QLinear(160, 76, True).half(), "8da4w", 32), [(70, 160)], [0]),
    # K and the groups multiples of 16 (a lane step): the CPU adapters' 4-bit subgroup kernels
    "f16_q4_k32": (quantized(lambda: QLinear(96, 52, True).half(), "4w", 32), [(70, 96)], [0]),
    # prompts' rows (gemm.py's WIDEN_MIN_ROWS and more), where GPUs widen the f16 and 4-bit weights of large products to f32 first
    "f16_fused_widened": (lambda: FusedLinears(40, 44, 23, 52).half(), [(263, 40)], [0]),
    "f16_q4_widened": (quantized(lambda: QLinear(264, 140, True).half(), "4w", 24), [(263, 264)], [0]),
    # prompts' rows of one product of K whole quads, the bias an f16 vector: on f16 subgroup matrices where the device offers them
    "f16_linear_matrix": (lambda: Linear(268, 131, True).half(), [(307, 268)], [0]),
    # ... and column groups of weights of whole 128-column tiles (q/k/v, gate/up), K of 68 (part of a K step)
    "f16_fused_matrix": (lambda: FusedLinears(68, 256, 128, 384).half(), [(263, 68)], [0]),
    # ... and so in 4 bits, read a K step of a column at a time (f16_q4_widened: a plain product, groups of 24, widened to f16 first)
    "f16_q4_fused_matrix": (quantized(lambda: FusedLinears(96, 256, 128, 384).half(), "4w", 32), [(263, 96)], [0]),
    # ... and 4-bit weights of K = Q4_GEMM_MIN_K: on them past BITWISE_ROWS rows (a ragged pass of decode rows)
    "f16_q4_k2048": (quantized(lambda: QLinear(2048, 76, True).half(), "4w", 32), [(41, 2048)], [0]),
    # ... and the fused 4-bit products of K = Q4_GEMM_MIN_K, their RMS norms folded in (the q/k/v group, SwiGLU)
    "f16_q4_norm_fused_wide": (quantized(lambda: NormedFusedLinears(2048, 96, 64, 256).half(), "4w", 32), [(41, 2048)], [0]),
    # ... and products wide enough for the 16-row tiles of 256 columns (gemm.py's takes_wide_tiny_tile): a plain one of N past whole tiles
    # (as an LM head), SwiGLU's gate | up columns (the fused group's weights whole tiles of 256)
    "f16_q4_k2048_n4104": (quantized(lambda: QLinear(2048, 4104, True).half(), "4w", 32), [(41, 2048)], [0]),
    "f16_q4_norm_fused_wide_swiglu": (quantized(lambda: NormedFusedLinears(2048, 96, 64, 2048).half(), "4w", 32), [(41, 2048)], [0]),
}
WIDE_TINY_CASES = ("f16_q4_k2048_n4104", "f16_q4_norm_fused_wide_swiglu")
WIDE_TINY_B_TILE = f"var<workgroup> b_tile: array<f16, {2 * gemm.WIDE_TINY_DECODE_MATRIX_TILE.bn * f16_matrix.ROW}>"  # its shaders' B tile
SUBGROUP_CASES = ("f16_fused_k4", "f16_q4_k32", "f16_dq8")


def _export(name):
    make, shapes, axes = CASES[name]
    dyn = tuple({a: _m(s[a])} if a is not None else None for s, a in zip(shapes, axes))
    return export_pte(name, make, [torch.randn(*s).half() for s in shapes], dynamic_shapes=dyn)


PREBUILD = [functools.partial(_export, name) for name in CASES]  # tests/prebuild.py


def _inputs(name, m, rng):
    _, shapes, axes = CASES[name]
    out = []
    for shape, axis in zip(shapes, axes):
        shape = list(shape)
        if axis is not None:
            shape[axis] = m
        out.append(rng.standard_normal(shape).astype(np.float16))
    return out


def _live_ms(name):
    _, shapes, axes = CASES[name]
    top = next(s[a] for s, a in zip(shapes, axes) if a is not None)
    ms = sorted(m for m in {1, 2, 3, R.GEMV_MAX_ROWS, R.GEMV_MAX_ROWS + 1, top - 1, top} if m <= top)
    random.Random(name).shuffle(ms)
    return ms


@pytest.mark.parametrize("name", sorted(CASES))
async def test_fp16_products_match_eager_fp16(name, load_pte):
    data, module = _export(name)
    model = await load_pte(data)
    assert model.precision == "f16", model.precision_note
    tol = (Q_ATOL, Q_RTOL) if name in ("f16_q4", "f16_dq8", "f16_q4_k32", "f16_fused", "f16_fused_k4", "f16_norm_fused_k8", "f16_norm_fused_bias_k8", "f16_norm_fused_wide",
                                       "f16_fused_matrix", "f16_q4_fused_matrix", "f16_q4_k2048", "f16_q4_norm_fused_wide") else (ATOL, RTOL)
    rng = np.random.default_rng(5)
    calls = [_inputs(name, m, rng) for m in _live_ms(name)]
    await assert_matches_eager(model, module, calls, atol=tol[0], rtol=tol[1])
    outs = await model.execute(*calls[0])
    assert all(o.dtype == np.float16 for o in outs)


@pytest.mark.parametrize("name, k, vector", [("f16_linear_wide_k4", 76, "vec4<f16>"), ("f16_linear_wide_k8", 80, "vec4<u32>")])
async def test_fp16_weights_are_stored_as_f16(name, k, vector, load_pte, kernel_variants):
    """The weight is bound as f16 (half the bytes of the f32 fallback), and the GPU variants'
    vec4 GEMV (the one with row_of_a) loads it 4 weights a load (K % 8 != 0) or 8 (vec4<u32>:
    f16 pairs)."""
    data, module = _export(name)
    model = await load_pte(data)
    shaders = [d.shader or "" for d in model.graph.dispatches]
    assert all("var<storage, read> bm: array<f32>" not in s for s in shaders)
    gemv = [i for i, s in enumerate(shaders) if f"var<storage, read> bm: array<{vector}>" in s and "row_of_a" in s]
    assert bool(gemv) == (kernel_variants == "gpu")
    (weight,) = [v for v in model.graph.values if getattr(v, "dims", None) == (8209, k)]
    assert weight.dtype == "float16"
    rng = np.random.default_rng(3)
    for m, on in ((1, True), (16, True), (17, False), (33, False)):  # N >= GEMV_T4_MIN_N: the vector GEMV up to BITWISE_ROWS rows
        await model.execute(*_inputs(name, m, rng))
        assert all(all(model._default.state.grids[i]) == on for i in gemv), m
    # past them the GEMM, on GPUs in 32 x 64 tiles to 32 rows
    await assert_matches_eager(model, module, [_inputs(name, m, rng) for m in (29, 17, 33, 32)], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", SUBGROUP_CASES)
async def test_fp16_products_take_the_cpu_subgroup_kernels(name, load_pte, kernel_variants):
    """With the CPU variants on a device with subgroups, every product of these models runs in a
    subgroup kernel that loads the f16 input 4 halves at a time (a vec2<u32>), at one row and at
    several; with the GPU variants, the float ones for SG_GPU_ROWS rows and the 4-bit ones
    (with dynamic int8 activations or not) for Q4_SG_GPU_ROWS (values checked in
    test_fp16_products_match_eager_fp16)."""
    data, _ = _export(name)
    model = await load_pte(data)
    subgroups = model.subgroups
    rng = np.random.default_rng(4)
    for m in (1, 2, 20, 70):
        await model.execute(*_inputs(name, m, rng))
        live = [d for i, d in enumerate(model.graph.dispatches) if "linear" in d.op and all(model._default.state.grids[i])]
        for d in live:
            lo, hi = R.Q4_SG_GPU_ROWS if "q4" in d.op else R.SG_GPU_ROWS
            gpu = lo <= m <= hi
            expected = subgroups and (kernel_variants == "cpu" or gpu)
            assert ("subgroupAdd" in d.shader and "array<vec2<u32>>" in d.shader) == expected, (m, d.op)
        assert live, m


@pytest.mark.parametrize("name", ["f16_norm_fused_k8", "f16_norm_fused_wide"])
async def test_fp16_gemvs_load_8_weights_a_load(name, load_pte, kernel_variants):
    """With the GPU variants, the GEMV of every float product of K a multiple of 8 (the fused ones,
    normalizing their rows or not, and the plain ones) binds its f16 weights as vec4<u32> and
    unpacks them; the GPU variants normalize the rows in the fused kernels (the GEMVs to
    BITWISE_ROWS; at K = FLOAT_GEMM_MIN_K the subgroup kernels, folding the norm, to 32 rows without
    f16 matrices), the CPU variants' subgroup kernels never; a row of several is bitwise the row
    alone. Values checked in test_fp16_products_match_eager_fp16."""
    data, _ = _export(name)
    model = await load_pte(data)
    names = {name for name, _ in model.graph.calls}
    assert {"pte_wgpu.rms_linear_group", "pte_wgpu.rms_linear_silu_mul", "pte_wgpu.linear_residual"} <= names
    rng = np.random.default_rng(6)
    for m in (1, 5, 16):
        await model.execute(*_inputs(name, m, rng))
        live = [d for i, d in enumerate(model.graph.dispatches) if all(model._default.state.grids[i])]
        products = [d for d in live if "linear" in d.op]
        assert len(products) == 4, (m, [d.op for d in products])  # q/k/v, two residuals, SwiGLU
        for d in products:
            packed = "unpack2x16float" in d.shader and "array<vec4<u32>>" in d.shader
            assert packed == (kernel_variants == "gpu"), (m, d.op)
        norms = sum(d.op == "pte_wgpu.rms_norm_for_gemm" for d in live)
        own = kernel_variants == "cpu" and model.subgroups  # CPU subgroup kernels: fused_norm_rows
        assert norms == (2 if own else 0), m
    # one row takes kernels of its own (a row's sums in the same order): a row of a pass of 5 or 16
    # rows is bitwise the row alone; at K = FLOAT_GEMM_MIN_K of 32 too (routes.py's FLOAT_SG_GPU_WIDE)
    for m in (5, 16, 32) if "wide" in name and not model.f16_matrices else (5, 16):  # f16 matrices take 17 rows and more
        (x,) = _inputs(name, m, rng)
        together, alone = await model.execute(x), await model.execute(x[2:3])
        for t, a in zip(together, alone):
            np.testing.assert_array_equal(t[2:3], a)


@pytest.mark.parametrize("name, quads", [("f16_norm_fused_wide", True), ("f16_linear_k2048", True), ("f16_fused", False), ("f16_linear_bias", False)])
async def test_fp16_gemms_load_weights_4_of_k_at_once(name, quads, load_pte, kernel_variants):
    """Past the GEMVs' rows, the GEMM of f16 weights whose K is a multiple of 4 (2,048: q/k/v and
    SwiGLU as column groups, at 41 rows on GPUs) reads a weight's 4 of K a load, bound as
    vec2<u32> (gemm.py's float_k_quads); of K 37 or 523, one weight a load. With the GPU variants
    a plain product of K = 2,048 takes the 64 x 64 tile at 8 x 4 outputs an invocation (gemm.py's
    MID_TILE) at 41 rows; column groups (q/k/v, SwiGLU) and products of smaller K the 4 x 4 one;
    past 64 rows every one takes it. Values checked in test_fp16_products_match_eager_fp16 at the
    same row counts."""
    data, _ = _export(name)
    model = await load_pte(data)
    rows = CASES[name][1][0][0]
    await model.execute(*_inputs(name, rows, np.random.default_rng(8)))
    live = [d for i, d in enumerate(model.graph.dispatches) if all(model._default.state.grids[i])]
    gemms = [d for d in live if "var<workgroup> As" in (d.shader or "")]
    # CPU subgroup kernels: every row count; f16 matrices: these rows of K = 2,048 (test_fp16_prompts_take_f16_matrices)
    assert gemms or (kernel_variants == "cpu" and model.subgroups) or model.f16_matrices, [d.op for d in live]
    for d in gemms:
        assert ("fn b_k_quad" in d.shader and "array<vec2<u32>>" in d.shader) == quads, d.op
        mid = "@workgroup_size(16, 8)" in d.shader and "c1_0_0" in d.shader
        assert mid == (kernel_variants == "gpu" and (rows > 64 or name == "f16_linear_k2048")), (d.op, rows)


# f16-sums: the live rows of each case's products run by the GEMM (past 32 rows where a GPU's
# GEMVs and subgroup kernels take fewer), in random order
HALF_SUM_ROWS = {"f16_linear_k2048": (41, 33), "f16_linear_bias": (33, 70, 64), "f16_mm_split": (70, 33), "f16_bmm": (40, 67, 9), "f16_addmm": (17, 3),
                 "f16_fused": (40, 71)}


@pytest.mark.parametrize("name", sorted(HALF_SUM_ROWS))
async def test_f16_sums_stay_within_their_bound(name, load_pte, kernel_variants):
    """load(precision="f16-sums"): with the GPU variants the GEMM's tiles of f16 operands hold them
    as halves and sum each K step in f16 (gemm.py's HALF_TILES), plain products and column groups
    (q/k/v) alike, of K whole quads or not; every output within 2^-11 of itself (the f16 store) and
    2^-9 of the sum of its products' magnitudes of the float64 product (one K step's f16 roundings,
    a few of 2^-11 of its partial sums). The CPU variants sum in f32, as "auto" does (their values
    against eager in test_fp16_products_match_eager_fp16)."""
    data, module = _export(name)
    model = await load_pte(data, precision="f16-sums")
    assert model.precision == "f16-sums"
    exact, magnitude = copy.deepcopy(module).double(), copy.deepcopy(module).double()
    with torch.no_grad():
        for p in magnitude.parameters():
            p.abs_()
    rng = np.random.default_rng(9)
    for m in HALF_SUM_ROWS[name]:
        inputs = _inputs(name, m, rng)
        outs = await model.execute(*inputs)
        live = [d for i, d in enumerate(model.graph.dispatches) if all(model._default.state.grids[i]) and "var<workgroup> As" in (d.shader or "")]
        # CPU subgroup kernels: every row count; f16 matrices (f32 sums): K = 2,048 at these rows
        assert live or (kernel_variants == "cpu" and model.subgroups) or model.f16_matrices, m
        for d in live:
            assert ("var<workgroup> As: array<vec4<f16>" in d.shader) == (kernel_variants == "gpu"), (m, d.op)
        with torch.no_grad():
            want = exact(*(torch.from_numpy(x).double() for x in inputs))
            size = magnitude(*(torch.from_numpy(x).double().abs() for x in inputs))
        want, size = ((t,) if isinstance(t, torch.Tensor) else t for t in (want, size))
        for j, (got, w, s) in enumerate(list(zip(outs, want, size))[:3]):  # FusedLinears: q, k and v, products of the input
            w, s = w.numpy(), s.numpy()
            excess = np.abs(got.astype(np.float64) - w) - (2.0**-11 * np.abs(w) + 2.0**-9 * s)
            assert excess.max() <= 0, f"rows {m}, output {j}: {excess.max():.3g} past the bound at {np.unravel_index(excess.argmax(), w.shape)}"


@pytest.mark.parametrize("name", ["f16_fused", "f16_norm_fused_bias_k8"])
async def test_fp16_fused_linears_run_fused(name, load_pte):
    """The products merge (silu, swiglu, 2 residuals, q/k/v); biased q/k/v too, with the norms before them and SwiGLU."""
    data, _ = _export(name)
    model = await load_pte(data)
    names = {name for name, _ in model.graph.calls}
    normed = name != "f16_fused"
    fused = {"pte_wgpu.rms_linear_bias_group", "pte_wgpu.rms_linear_silu_mul"} if normed else {"pte_wgpu.linear_group", "pte_wgpu.linear_silu_mul"}
    assert fused | {"pte_wgpu.linear_residual"} <= names, names
    assert "aten.linear.default" not in names and model.fused == 5 + 2 * normed


@pytest.mark.parametrize("name", ["f16_linear_bias", "f16_q4"])
async def test_fp16_products_fall_back_to_f32(name, load_pte):
    """load(precision="f32") widens the same export: float16 in and out, f32 on the device."""
    data, module = _export(name)
    model = await load_pte(data, precision="f32")
    assert model.precision == "f32"
    rng = np.random.default_rng(6)
    await assert_matches_eager(model, module, [_inputs(name, m, rng) for m in (1, 33)], atol=Q_ATOL, rtol=Q_RTOL)


@pytest.mark.parametrize("name", ["f16_fused_widened", "f16_q4_widened"])
async def test_fp16_weights_of_many_rows_are_widened_first(name, load_pte, kernel_variants, monkeypatch):
    """With the GPU variants, products of WIDEN_MIN_ROWS rows or more (of any size here:
    WIDEN_MIN_WORK 0) over f16 weights (q/k/v as one column group, the residual linears, SwiGLU's)
    or 4-bit ones widen them to f32 (gemm.py's WIDEN) and run the f32 weights' GEMM; bitwise the
    GEMM that reads them as they are stored (the same file loaded with the widening off)."""
    if kernel_variants != "gpu":
        pytest.skip("the GPU variants")
    monkeypatch.setattr(gemm, "WIDEN_MIN_WORK", 0)  # these products are small
    data, _ = _export(name)
    ms = [CASES[name][1][0][0], gemm.WIDEN_MIN_ROWS - 1]
    model, outs = await load_pte(data), []
    if model.f16_matrices:
        pytest.skip("f16 rows' prompts take the f16 matrices (test_fp16_prompts_take_f16_matrices)")
    for m in ms:
        outs.append(await model.execute(*_inputs(name, m, np.random.default_rng(m))))
        live = [d for i, d in enumerate(model.graph.dispatches) if all(model._default.state.grids[i])]
        widened = {d.op for d in live if "wide[i] = b_k_quad(" in (d.shader or "")}
        gemms = {d.op for d in live if "var<workgroup> As" in (d.shader or "")}
        assert widened == (gemms if m >= gemm.WIDEN_MIN_ROWS else set()) and gemms, (m, widened, gemms)
    monkeypatch.setattr(gemm, "WIDEN_MIN_ROWS", 1 << 30)
    stored = await load_pte(data)
    for m, out in zip(ms, outs):
        for j, (got, want) in enumerate(zip(await stored.execute(*_inputs(name, m, np.random.default_rng(m))), out)):
            np.testing.assert_array_equal(got, want, err_msg=f"{m} rows, output {j}")


# rows past the subgroup kernels' (routes.py's SG_GPU_ROWS; the 4-bit ones' Q4_SG_GPU_ROWS) and
# from MATRIX_MIN_ROWS, in random order, and fewer
MATRIX_ROWS = {"f16_linear_matrix": (307, 129, 256, 200, 1, 128), "f16_fused_widened": (263, 128, 131, 40), "f16_fused_matrix": (200, 263, 17, 129),
               "f16_q4_widened": (263, 127, 128, 40, 200), "f16_q4_fused_matrix": (129, 263, 65, 1, 128),
               "f16_linear_k2048": (41, 17, 16, 1, 33), "f16_norm_fused_wide": (41, 16, 17, 1, 29), "f16_q4_k2048": (17, 41, 1, 16, 33)}


@pytest.mark.parametrize("name", sorted(MATRIX_ROWS))
async def test_fp16_prompts_take_f16_matrices(name, load_pte, kernel_variants):
    """Where the device offers f16 x f16 -> f32 subgroup matrices (Dawn on NVIDIA), the GEMM's
    products of f16 rows of K whole quads by f16 weights, or by 4-bit ones (each weight rounded as
    eager dequantizes it: as the tile reads a column's K step of 32, TileLoad.words, or for groups
    that are not whole steps, widened to f16 first), of MATRIX_MIN_ROWS rows or more, run on them
    (gemm.py's MATRIX_TILE: a plain linear with its bias, the q/k/v column group, the residual
    linears, SwiGLU's), and fewer rows in DECODE_MATRIX_TILE (a ragged pass of decode rows): f16
    weights of K >= FLOAT_GEMM_MIN_K past BITWISE_ROWS rows, 4-bit ones from the rows
    their GEMM takes (past the GEMVs and subgroup kernels: BITWISE_ROWS at K >=
    Q4_GEMM_MIN_K), the tile's loads rounding each weight to f16; against eager fp16 as the other
    routes (f32 sums of the same halves), K split where the tiles are few. The GPU variants: the
    CPU ones take the subgroup kernels at every row count."""
    data, module = _export(name)
    model = await load_pte(data)
    if not model.f16_matrices or kernel_variants != "gpu":
        pytest.skip(f"the GPU variants on a device with f16 subgroup matrices (here: {kernel_variants} variants, f16 matrices {model.f16_matrices})")
    tol = (ATOL, RTOL) if name == "f16_linear_matrix" else (Q_ATOL, Q_RTOL)
    q4 = "q4" in name
    first = R.Q4_SG_GPU_ROWS[1] + 1 if q4 else max(gemm.MATRIX_MIN_ROWS, R.SG_GPU_ROWS[1] + 1)
    if name in ("f16_linear_k2048", "f16_norm_fused_wide", "f16_q4_k2048"):  # K = FLOAT_GEMM_MIN_K: decode rows
        first = R.BITWISE_ROWS + 1
    rng = np.random.default_rng(11)
    for m in MATRIX_ROWS[name]:
        inputs = _inputs(name, m, rng)
        await assert_matches_eager(model, module, [inputs], atol=tol[0], rtol=tol[1])
        live = [d for i, d in enumerate(model.graph.dispatches) if all(model._default.state.grids[i])]
        matrices = [d for d in live if "subgroup_matrix_left<f16" in (d.shader or "")]
        assert bool(matrices) == (m >= first), (m, [d.op for d in live])
        widened = [d for d in live if "wide[i] = b_k_halves(" in (d.shader or "")]  # the 4-bit weights widened to f16 before
        words = [d for d in matrices if "= b_words" in d.shader]  # ... or read a column's K step at a time (groups of 32)
        assert bool(widened) == (name == "f16_q4_widened" and m >= gemm.MATRIX_MIN_ROWS) and len(widened) <= len(matrices), (m, [d.op for d in live])
        assert bool(words) == (q4 and name != "f16_q4_widened" and m >= first), (m, [d.op for d in live])


@pytest.mark.parametrize("name", ["f16_q4_k2048", "f16_q4_norm_fused_wide", "f16_linear_k2048", "f16_norm_fused_wide", *WIDE_TINY_CASES])
async def test_batch_variant_products_take_f16_matrices_past_8_rows(name, load_pte, kernel_variants):
    """load(batch_invariant=False): products of f16 rows and K >= 2,048 by 4-bit weights (a plain
    one; the q/k/v group and SwiGLU with their RMS norms folded in) or by f16 weights (a plain
    one; the fused ones after their norms) take the f16 matrices past BATCH_VARIANT_ROWS rows,
    where a batch-invariant load keeps the subgroup kernels and GEMVs to BITWISE_ROWS; the norms
    then run where the fused kernels leave them, against eager fp16. The wide products take the
    16-row tiles of 256 columns at 9-16 rows."""
    data, module = _export(name)
    model = await load_pte(data, batch_invariant=False)
    if not model.f16_matrices or kernel_variants != "gpu":
        pytest.skip(f"the GPU variants on a device with f16 subgroup matrices (here: {kernel_variants} variants, f16 matrices {model.f16_matrices})")
    invariant = await load_pte(data)
    tol = Q_ATOL if "q4" in name or "fused" in name else ATOL
    rng = np.random.default_rng(13)
    for m in (9, 1, 16, 8, 13, 2, 33):
        inputs = _inputs(name, m, rng)
        for loaded, first in ((model, R.BATCH_VARIANT_ROWS + 1), (invariant, R.BITWISE_ROWS + 1)):
            await assert_matches_eager(loaded, module, [inputs], atol=tol, rtol=tol)
            live = [d for i, d in enumerate(loaded.graph.dispatches) if all(loaded._default.state.grids[i])]
            matrices = [d for d in live if "subgroup_matrix_left<f16" in (d.shader or "")]
            assert bool(matrices) == (m >= first), (m, loaded.batch_invariant, [d.op for d in live])
            wide = [d for d in matrices if WIDE_TINY_B_TILE in d.shader]
            assert bool(wide) == (name in WIDE_TINY_CASES and first <= m <= gemm.WIDE_TINY_DECODE_MATRIX_TILE.bm), (m, loaded.batch_invariant)


def _built_for_a_gpu(name, f16_matrices=False):
    """Without a GPU: the graph of export `name` as the load fuses it, every op built for a GPU
    with subgroups (and f16 matrices)."""
    graph = link(read_program(_export(name)[0]).method("forward"))
    scales_in_row_quads(graph)
    fuse(graph)
    for op_name, args in list(graph.calls):
        build_node(graph, op_name, args, GPU, subgroups=True, f16_matrices=f16_matrices)
    return graph


@pytest.mark.parametrize("name, wide", [("f16_q4_k2048_n4104", True), ("f16_q4_norm_fused_wide_swiglu", True), ("f16_q4_k2048", False)])
def test_wide_products_build_16_row_tiles_of_256_columns(name, wide):
    """Without a GPU: built as for a device with f16 matrices, the 4-bit products of N 4,104 and of
    SwiGLU's 2 x 2,048 columns (tiles of 256 within each weight) have the 16 x 256 tile; one of N 76
    not (gemm.py's takes_wide_tiny_tile), nor a group whose weights would share a tile."""
    graph = _built_for_a_gpu(name, f16_matrices=True)
    assert any(WIDE_TINY_B_TILE in (d.shader or "") for d in graph.dispatches) == wide
    assert gemm.takes_wide_tiny_tile(4096, (2048, 4096)) and not gemm.takes_wide_tiny_tile(4096, (2176, 4096))
    assert not gemm.takes_wide_tiny_tile(3072)  # (a 1B's q/k/v: 12 tiles of 256 would leave the split target short)


@pytest.mark.parametrize("name, per_workgroup", [("f16_q4_k2048", 2), ("f16_q4_k2048_n4104", 8)])
def test_4bit_products_of_few_weight_rows_take_two_a_workgroup(name, per_workgroup):
    """Without a GPU: built for a GPU with subgroups, a 4-bit product at K 2,048 of N 76 runs its
    one and two rows at 2 weight rows a workgroup (routes.py's Q4_SG_GPU_NARROW_SPLIT), one of N
    4,104 at Q4_SG_GPU_WIDE's 8 (its subgroups walk all of K); by the rows of an op's weights
    together, a 1B's q/k/v (3,072) and output (2,048) take 2, the 8B's (6,144; 4,096) 4 a
    workgroup, and an LM head walks all of K."""
    graph = _built_for_a_gpu(name)
    assert any(f"let nw = wg0 * {per_workgroup}u;" in (d.shader or "") for d in graph.dispatches)
    assert R.q4_wide_shapes(2048, 3072) == R.q4_wide_shapes(2048, 2048) == R.Q4_SG_GPU_NARROW_SPLIT
    assert R.q4_wide_shapes(4096, 6144) == R.q4_wide_shapes(4096, 4096) == R.Q4_SG_GPU_WIDE_SPLIT
    assert R.q4_wide_shapes(128256, 128256) == R.Q4_SG_GPU_WIDE


def test_4bit_words_become_halves_as_eager_rounds_them():
    """The f16 matrices' read of 4-bit weights a word an invocation (f16_matrix.B_WORD_KEEP:
    nibbles as f16 mantissas, less 1032, times the f16 scale) gives each weight as eager's fp16
    dequantization does, (nibble - 8) * scale rounded once to f16 (to nearest even: numpy's), on
    every device with shader-f16: every nibble and position of a word, scales from f16's
    subnormals to past where products overflow. Under Dawn only, whose devices alone have the
    matrices: naga types bitcast<vec2<f16>> of a u32 as vec2<f32>."""
    from pte_wgpu.kernels.matmul import f16_matrix

    from async_runtime import backend
    from async_runtime.pipelines import wgsl_for_device

    from .one_kernel import run_kernel

    if backend.NAME != "dawn":
        pytest.skip("Dawn's WGSL compiler (naga types bitcast<vec2<f16>> of a u32 as vec2<f32>)")

    columns, rng = 256, np.random.default_rng(7)
    words = rng.integers(0, 1 << 32, (columns, 4), dtype=np.uint32)
    words[:16] = np.arange(16, dtype=np.uint32)[:, None] * 0x11111111  # every nibble in every place
    scales = (rng.standard_normal(columns) * 10.0 ** rng.integers(-8, 5, columns)).astype(np.float16)
    scales[:4] = [2.0**-24, 6e4, -1e4, 0.0]
    # invocation li of a workgroup keeps word v = 64 wid + li (column v / 4, its word v % 4) at 8 li of a tile of rows of 32
    keep = fill(f16_matrix.B_WORD_KEEP, S="scales[v / 4u]", W="words[v]", V="li", B_BUF=0, ROW=32)
    src = wgsl_for_device(
        "@group(0) @binding(0) var<storage, read> words: array<u32>;\n"
        "@group(0) @binding(1) var<storage, read> scales: array<f32>;\n"
        "@group(0) @binding(2) var<storage, read_write> y: array<f32>;\n"
        "var<workgroup> b_tile: array<f16, 512>;\n"
        "@compute @workgroup_size(64) fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {\n"
        f"    let v = wid.x * 64u + li; let buf = 0u;\n{keep}\n"
        "    for (var k = 0u; k < 8u; k = k + 1u) { y[v * 8u + k] = f32(b_tile[li * 8u + k]); }\n}\n"
    )
    got = run_kernel(src, (words, scales.astype(np.float32)), np.float32, columns * 32, workgroup=64 * 8, features=["shader-f16"])
    nibbles = (words[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15  # [column, word, k of the word]
    with np.errstate(over="ignore"):
        want = ((nibbles.reshape(columns, 32).astype(np.float32) - 8) * scales[:, None].astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(got.reshape(columns, 32), want.astype(np.float32))


def test_f16_matrix_tiles_read_halves_as_stored():
    """The f16 matrices' loads (no GPU needed): f16 operands of K whole quads have the halves
    readers, f32 ones or K of other shapes none; 4-bit weights of f16 rows (not of int8 ones: the
    int8 matrices') have them too, rounding the f32 dequantization to halves (or, in groups of 32,
    reading them a word at a time, no quad packers). A column group of
    whole-tile weights (all but the last) runs one K loop a weight, each reading its weight alone,
    others one loop picking per column; 4-bit groups (the fused products' GEMM) alike. Every tile
    reads halves two K steps ahead of the products, 4-bit words one."""
    assert gemm.weight_load("f16", "f16", 268).halves_functions and not gemm.weight_load("f16", "f16", 267).halves_functions
    assert not gemm.weight_load("f32", "f32", 268).halves_functions and not gemm.weight_load("f32", "f16", 268).halves_functions
    half, single = q4_linear.Storage("f16", "f16", "f16", "f16", "f16"), q4_linear.Storage()
    words, quads = q4_linear.q4_load(False, False, 32, 96, half), q4_linear.q4_load(False, False, 24, 96, half)
    assert "pack2x16float(w.xy)" in quads.halves_functions and not quads.words  # groups not whole steps: quads packed
    assert words.words and "fn b_word(" in words.halves_functions and "pack2x16float" not in words.halves_functions
    assert not q4_linear.q4_load(False, False, 32, 96, q4_linear.Storage("f16", "f16", "f32", "f16", "f16")).words  # f32 scales: by quads
    assert not any(q4_linear.q4_load(dq8, False, 32, k, t).halves_functions for dq8, k, t in ((True, 96, half), (False, 98, half), (False, 96, single)))
    tile = gemm.MATRIX_TILE.bn
    assert tile == gemm.DECODE_MATRIX_TILE.bn  # matrix_weights serves both tiles
    groups = {"f16": lambda ns: gemm.column_group("f16", ["f16"] * len(ns), ns, 68),
              "4-bit": lambda ns: (q4_fused_linear.columns_load(ns, 96, 32, {"x": "f16", "scales": ["f16"] * len(ns)})[0], gemm.column_store(ns))}
    for (kind, group), (ns, whole) in itertools.product(groups.items(), (((2 * tile, tile, 37), True), ((tile, tile + 64, tile), False))):
        load, store = group(ns)
        assert load.weight_ends == (tuple(itertools.accumulate(ns)) if whole else ()), (kind, ns)
        reader = "b_word" if kind == "4-bit" else "b_k_halves"  # 4-bit weights of groups of 32, f16 scales: a word of a column's step an invocation
        for matrices in (gemm.MATRIX_TILE, gemm.DECODE_MATRIX_TILE, gemm.SHORT_DECODE_MATRIX_TILE):
            shader = gemm.gemm_shader(load, False, tile=matrices, out="f16", store=store)
            assert shader.count("for (var k0 = kbeg;") == (len(ns) if whole else 1), (kind, ns)
            assert all((f"= {reader}_{j}(" in shader) == whole for j in range(len(ns))), (kind, ns)
            assert (f"= {reader}(" in shader) == (not whole), (kind, ns)
            assert ("q0n = " in shader) == (kind == "f16"), (kind, ns)  # halves two K steps ahead, 4-bit words one
    shader = gemm.gemm_shader(gemm.weight_load("f16", "f16", 68), False, tile=gemm.MATRIX_TILE, out="f16")
    assert shader.count("for (var k0 = kbeg;") == 1 and "b_k_halves_0" not in shader
    # a tile of one subgroup along M stores only the result matrices that hold live rows, split-K's
    # whole ones straight into the scratch; prompts' tiles every matrix through workgroup memory
    decode = gemm.gemm_shader(gemm.weight_load("f16", "f16", 68), False, tile=gemm.DECODE_MATRIX_TILE, out="f16")
    assert [decode.count(f"if (m0 + {16 * i}u < p.M)") for i in range(5)] == [0, 1, 1, 1, 0] and "if (m0 + " not in shader
    assert [decode.count(f"if (direct && m0 + {16 * i}u <= p.M)") for i in range(6)] == [0, 1, 1, 1, 1, 0]
    assert decode.count("subgroupMatrixStore<row_major>(&part,") == 8 and "(&part," not in shader
