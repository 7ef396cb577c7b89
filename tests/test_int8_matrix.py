"""8-bit dynamic activations with 4-bit weights (`et_vk.linear_dq8ca_q4gsw`) on subgroup matrices,
where the device offers them (Dawn on NVIDIA GPUs; skipped elsewhere, lavapipe included, but for the
f16 route's bindings, checked from its build alone): the int8
route (kernels/matmul/int8_matrix.py), and where f16 matrices are offered too, the f16 route that
prompts take there (the activations' q - zp as f16, the 4-bit weights rounded once to f16), each
against the GEMM route of the same export on the same device, which test_quantized_ops and
test_llama hold to torch eager. Every product of more rows than the GEMV takes runs on the
matrices here (their minimum tile and row counts set to the GEMV's).

The routes quantize the activations alike; the int8 matrices sum each group exactly in int32 where
the GEMM sums dequantized products in f32, so the outputs agree within f32 rounding; the f16 route
differs by the weights' rounding to f16 (2^-11 of each), as an fp16 export's products do, and a
model's logits by what that does to the next products' int8 activations."""

import random
import re
from pathlib import Path

import numpy as np
import pytest

import async_runtime.model as runtime_model
from async_runtime.backend import SUBGROUP_MATRIX_FEATURE
from async_runtime.program.graph import link
from async_runtime.program.pte import read_program
from pte_wgpu.kernels import build_node, fuse
from pte_wgpu.kernels.matmul import gemm, int8_matrix, q4_fused_linear, q4_linear
from pte_wgpu.kernels.matmul.q4_linear import scales_in_row_quads
from pte_wgpu.kernels.variants import GPU

from . import exporting
from .test_llama import CONTEXT, recorded
from .test_quantized_ops import _export, _rows

ATOL = RTOL = 1e-4
F16_TOL = 4e-3
# ... and a model's logits there: the rounding moves some of the next products' int8 activations a
# step, which every later layer carries on. The tiny Llama's prompt and greedy steps below, eager on the
# CPU with its 4-bit weights rounded to f16, need 2.5x F16_TOL; rounded otherwise (stochastically, or a
# ulp off), up to 3.7x; a group dropped or its scale doubled in a v, attention-output, MLP or head
# product, 10x and more (in q's or k's, 2.5-4.3x: hidden in the rounding's)
F16_MODEL_TOL = 5 * F16_TOL
GEMV_ROWS = 32  # the most rows the GEMV takes here: the matrices take more


@pytest.fixture
def matrix_adapter(wgpu_adapter):
    """Skip before any export where the adapter has no subgroup matrices."""
    if SUBGROUP_MATRIX_FEATURE not in wgpu_adapter.features:
        pytest.skip(f"{wgpu_adapter.summary} offers no subgroup matrices")


def _pte(name):
    """The export's bytes: from the store without building the eager module (a GPU machine
    without torchao), else exported here."""
    stored = Path(exporting.STORE) / f"{name}.pte" if exporting.STORE else None
    return stored.read_bytes() if stored is not None and stored.exists() else _export(name)[0]


async def _both_routes(load_pte, data, monkeypatch, route, **kwargs):
    """(model on the `route` ("int8" or "f16") matrices at every row count past the GEMV's, model on
    the GEMM), or skip without them. Both without the 4-bit subgroup kernels, which on GPUs take
    17-64 rows of these narrow weights: the matrices then take every row count past the GEMV's 32."""
    monkeypatch.setattr(int8_matrix, "MIN_TILES", 0)
    for module in (q4_linear, q4_fused_linear):
        monkeypatch.setattr(module, "q4_subgroup_shapes", lambda *_: ())
    if route == "int8":  # (where the device has f16 matrices, the prompts take those)
        monkeypatch.setattr(runtime_model, "F16_MATRIX", None)
    else:
        for name in ("MATRIX_MIN_ROWS", "HALF_WIDEN_MIN_ROWS"):
            monkeypatch.setattr(gemm, name, GEMV_ROWS + 1)
    matrices = await load_pte(data, **kwargs)
    if not (matrices.int8_matrices if route == "int8" else matrices.f16_matrices):
        pytest.skip(f"no {route} subgroup matrices on {matrices.device_info.name}")
    monkeypatch.setattr(runtime_model, "INT8_MATRIX", None)
    monkeypatch.setattr(runtime_model, "F16_MATRIX", None)
    return matrices, await load_pte(data, **kwargs)


def _ran_matrices(model, route, session=None):
    """Whether the last execute of `session` (the model's own) ran a product on `route`'s matrices."""
    grids = (session or model._default).state.grids
    left = f"subgroup_matrix_left<{'i8' if route == 'int8' else 'f16'}"
    return any(left in (d.shader or "") and all(grids[i]) for i, d in enumerate(model.graph.dispatches))


def _assert_close(route, got, want, msg, atol=ATOL, rtol=RTOL, f16_tol=F16_TOL):
    """`got` within the route's tolerance of `want`: `atol` and `rtol` (f32 rounding) on the int8
    matrices; on the f16 ones `f16_tol` of each output plus `f16_tol` of its row's largest (the
    weights' rounding)."""
    if route == "int8":
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=msg)
        return
    bound = f16_tol * (np.abs(want) + np.abs(want).max(axis=-1, keepdims=True))
    worst = float((np.abs(got - want) - bound).max())
    assert worst <= 0, f"{msg}: {worst} past the tolerance (largest difference {float(np.abs(got - want).max())}, largest value {float(np.abs(want).max())})"


# 70 rows by K = 160 (five steps) into 76 outputs, group 32; 64 to 64 with a diagonal weight (one
# product an output); K = 192 in groups of 64 (two steps a group) into 44 outputs
@pytest.mark.usefixtures("matrix_adapter")
@pytest.mark.parametrize("route", ["int8", "f16"])
@pytest.mark.parametrize("name", ["dq8_large", "dq8_diagonal", "dq8_n44"])
async def test_dq8_products_on_matrices_match_the_gemm(name, route, load_pte, monkeypatch):
    matrices, gemm_model = await _both_routes(load_pte, _pte(name), monkeypatch, route)
    most = int(matrices.inputs[0].max_shape[0])
    ms = sorted(m for m in {1, 32, 33, 34, 47, most - 1, most} if m <= most)
    random.Random(name).shuffle(ms)
    rng = np.random.default_rng(11)
    for m in ms:
        x = _rows(name, m, rng)
        (got,) = await matrices.execute(x)
        (want,) = await gemm_model.execute(x)
        _assert_close(route, got, want, f"{m} rows")
        assert _ran_matrices(matrices, route) == (m > GEMV_ROWS), m
        assert not _ran_matrices(gemm_model, route)


@pytest.mark.usefixtures("matrix_adapter")
@pytest.mark.parametrize("route", ["int8", "f16"])
async def test_llama_prompt_on_matrices_matches_the_gemm(route, load_pte, monkeypatch, tmp_path_factory):
    """The tiny 8da4w Llama (K = 96, the residual linears' epilogue): a prompt of 41 tokens, then
    greedy steps; the same tokens where the GEMM's top two logits stand apart, logits within the
    route's tolerance (on the f16 matrices, a model's: F16_MODEL_TOL)."""
    pte, _ = recorded("8da4w", tmp_path_factory)
    matrices, gemm_model = await _both_routes(load_pte, pte, monkeypatch, route, batch_submits=False)
    prompt = np.random.default_rng(41).integers(0, 260, (1, 41))
    async with matrices.session() as a, gemm_model.session() as b:
        tokens, pos = prompt, 0
        while pos + tokens.shape[1] < CONTEXT:
            (got,) = await a.execute(tokens, np.array([pos]))
            assert _ran_matrices(matrices, route, a) == (pos == 0)
            (want,) = await b.execute(tokens, np.array([pos]))
            _assert_close(route, got, want, f"position {pos}", atol=2e-4, rtol=1e-3, f16_tol=F16_MODEL_TOL)
            top = np.sort(want.ravel())[-2:]
            if route == "int8" or top[1] - top[0] > 8 * F16_TOL * float(np.abs(want).max()):
                assert int(got.argmax()) == int(want.argmax())
            pos += tokens.shape[1]
            tokens = np.array([[int(got.argmax())]])


def test_f16_route_binds_what_its_shaders_declare(tmp_path_factory):
    """Without a GPU: the tiny 8da4w Llama's products built as for a device with f16 and int8
    matrices (GPU kernels, the int8 activations kept) each have the f16 route, its rows quantized as
    halves into the tile's A, and every dispatch declaring `row_scale` binds the product's activation
    scales there (the route's tile and split-K's reduce alike)."""
    graph = link(read_program(recorded("8da4w", tmp_path_factory)[0]).method("forward"))
    scales_in_row_quads(graph)
    fuse(graph, int8_matrices=True)
    products = [args for name, args in graph.calls if name in runtime_model.DQ8_PRODUCTS]
    assert products
    for name, args in list(graph.calls):
        first = len(graph.dispatches)
        build_node(graph, name, args, GPU, subgroups=True, int8_matrices=True, f16_matrices=True)
        if name not in runtime_model.DQ8_PRODUCTS:
            continue
        built = graph.dispatches[first:]
        quantize = [d for d in built if d.shader and "pack2x16float(h.xy)" in d.shader]
        tiles = [d for d in built if d.shader and "subgroup_matrix_left<f16" in d.shader]
        scaled = [d for d in built if d.shader and "var<storage, read> row_scale" in d.shader]
        assert len(quantize) == 1 and tiles and {id(d) for d in tiles} <= {id(d) for d in scaled}, name
        rows = quantize[0].bindings[3]
        assert graph.values[rows].dtype == "float16" and all(d.bindings[0] == rows for d in tiles), name
        for d in scaled:
            at = int(re.search(r"@binding\((\d+)\) var<storage, read> row_scale", d.shader).group(1))
            assert d.bindings[at] == args[1] and len(d.bindings) == len(re.findall(r"@binding\(", d.shader)), name
        assert not any("subgroup_matrix_left<i8" in (d.shader or "") for d in built), name  # the f16 route, not the int8 one
