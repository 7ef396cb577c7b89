"""8-bit dynamic activations with 4-bit weights (`et_vk.linear_dq8ca_q4gsw`) on int8 subgroup
matrices (kernels/matmul/int8_matrix.py), where the device offers them (Dawn on NVIDIA GPUs;
skipped elsewhere, lavapipe included): against the GEMM route of the same export on the same
device, which test_quantized_ops and test_llama hold to torch eager. Every product of more rows
than the GEMV takes runs on the matrices here (their minimum tile count set to none).

The two routes quantize the activations alike; the matrices sum each group exactly in int32 where
the GEMM sums dequantized products in f32, so the outputs agree within f32 rounding."""

import random
from pathlib import Path

import numpy as np
import pytest

import async_runtime.model as runtime_model
from async_runtime.backend import SUBGROUP_MATRIX_FEATURE
from pte_wgpu.kernels.matmul import int8_matrix, q4_fused_linear, q4_linear

from . import exporting
from .test_llama import CONTEXT, recorded
from .test_quantized_ops import _export, _rows

ATOL = RTOL = 1e-4


@pytest.fixture(autouse=True)
def matrix_adapter(wgpu_adapter):
    """Skip before any export where the adapter has no subgroup matrices."""
    if SUBGROUP_MATRIX_FEATURE not in wgpu_adapter.features:
        pytest.skip(f"{wgpu_adapter.summary} offers no subgroup matrices")


def _pte(name):
    """The export's bytes: from the store without building the eager module (a GPU machine
    without torchao), else exported here."""
    stored = Path(exporting.STORE) / f"{name}.pte" if exporting.STORE else None
    return stored.read_bytes() if stored is not None and stored.exists() else _export(name)[0]


async def _both_routes(load_pte, data, monkeypatch, **kwargs):
    """(model on the matrices at every tile count, model on the GEMM), or skip without them. Both
    without the 4-bit subgroup kernels, which on GPUs take 17-64 rows of these narrow weights:
    the matrices then take every row count past the GEMV's 32."""
    monkeypatch.setattr(int8_matrix, "MIN_TILES", 0)
    for module in (q4_linear, q4_fused_linear):
        monkeypatch.setattr(module, "q4_subgroup_shapes", lambda *_: ())
    matrices = await load_pte(data, **kwargs)
    if not matrices.int8_matrices:
        pytest.skip(f"no int8 subgroup matrices on {matrices.device_info.name}")
    monkeypatch.setattr(runtime_model, "INT8_MATRIX", None)
    return matrices, await load_pte(data, **kwargs)


def _ran_matrices(model, session=None):
    """Whether the last execute of `session` (the model's own) ran a matrix product."""
    grids = (session or model._default).state.grids
    return any("subgroupMatrixLoad" in (d.shader or "") and all(grids[i]) for i, d in enumerate(model.graph.dispatches))


# 70 rows by K = 160 (five steps) into 76 outputs, group 32; 64 to 64 with a diagonal weight (one
# product an output); K = 192 in groups of 64 (two steps a group) into 44 outputs
@pytest.mark.parametrize("name", ["dq8_large", "dq8_diagonal", "dq8_n44"])
async def test_dq8_products_on_matrices_match_the_gemm(name, load_pte, monkeypatch):
    matrices, gemm = await _both_routes(load_pte, _pte(name), monkeypatch)
    most = int(matrices.inputs[0].max_shape[0])
    ms = sorted(m for m in {1, 32, 33, 34, 47, most - 1, most} if m <= most)
    random.Random(name).shuffle(ms)
    rng = np.random.default_rng(11)
    for m in ms:
        x = _rows(name, m, rng)
        (got,) = await matrices.execute(x)
        (want,) = await gemm.execute(x)
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL, err_msg=f"{m} rows")
        assert _ran_matrices(matrices) == (m > 32), m
        assert not _ran_matrices(gemm)


async def test_llama_prompt_on_matrices_matches_the_gemm(load_pte, monkeypatch, tmp_path_factory):
    """The tiny 8da4w Llama (K = 96, the residual linears' epilogue): a prompt of 41 tokens, then
    greedy steps; the same tokens, logits within the tolerance."""
    pte, _ = recorded("8da4w", tmp_path_factory)
    matrices, gemm = await _both_routes(load_pte, pte, monkeypatch, batch_submits=False)
    prompt = np.random.default_rng(41).integers(0, 260, (1, 41))
    async with matrices.session() as a, gemm.session() as b:
        tokens, pos = prompt, 0
        while pos + tokens.shape[1] < CONTEXT:
            (got,) = await a.execute(tokens, np.array([pos]))
            assert _ran_matrices(matrices, a) == (pos == 0)
            (want,) = await b.execute(tokens, np.array([pos]))
            np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-3, err_msg=f"position {pos}")
            assert int(got.argmax()) == int(want.argmax())
            pos += tokens.shape[1]
            tokens = np.array([[int(got.argmax())]])
