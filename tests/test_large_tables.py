"""An embedding table or a linear weight larger than one storage binding (lavapipe binds at most
128 MiB; an H100 2 GiB, less than Phi-4-mini's 2.46 GB fp32 embedding) is cut into parts of whole
rows at load (async_runtime/program/tables.py): the table looked up from them
(`pte_wgpu.embedding_parts`), the linear run per part and its outputs joined (`aten.cat`); a tied
table and LM head cut once for both, a linear's bias cut with its weight."""

import functools

import numpy as np
import pytest
import torch

from async_runtime.testing import assert_matches_eager
from pte_wgpu.resize.shapes import numel_of
from pte_wgpu.resize.values import Tensor

from .exporting import export_pte

VOCAB, DIM = 33_001, 1_024  # 135 MB of fp32: past lavapipe's binding


class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)

    def forward(self, idx):
        return self.emb(idx) * 2.0


def _export():
    example = torch.randint(0, VOCAB, (1, 37))
    return export_pte("large_table", Lookup, [example], ({1: torch.export.Dim("t", min=1, max=37)},))


class Head(torch.nn.Module):
    """An LM head of VOCAB rows (135 MB of fp32) behind a small layer, as a decoder's last."""

    def __init__(self):
        super().__init__()
        self.mix = torch.nn.Linear(DIM, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        return self.head(torch.tanh(self.mix(x)))


def _export_head():
    example = torch.randn(1, 37, DIM)
    return export_pte("large_linear", Head, [example], ({1: torch.export.Dim("t", min=1, max=37)},))


PREBUILD = [functools.partial(_export), _export_head]  # tests/prebuild.py


async def _load_past_one_binding(load_pte, export):
    """(model, its binding limit, the eager module) of an export whose big tensor passes the limit."""
    pte, module = export()
    model = await load_pte(pte)
    limit = model.device_info.max_storage_binding
    if VOCAB * DIM * 4 <= limit:
        pytest.skip(f"the adapter binds {limit} bytes: the tensor fits one binding")
    return model, limit, module


async def test_a_table_past_one_binding_is_looked_up_from_parts(load_pte):
    model, limit, module = await _load_past_one_binding(load_pte, _export)
    names = [n for n, _ in model.graph.calls]
    assert "pte_wgpu.embedding_parts" in names and not any("embedding.default" in n or "embedding.out" in n for n in names), names
    rng = np.random.default_rng(3)
    calls = []
    for t in (1, 37, 5, 16):  # rows from both parts, the first and last rows, each part's edges
        idx = rng.integers(0, VOCAB, (1, t))
        idx[0, : min(t, 4)] = [0, VOCAB - 1, limit // (DIM * 4) - 1, limit // (DIM * 4)][: min(t, 4)]
        calls.append(idx)
    await assert_matches_eager(model, module, calls, atol=0, rtol=0)


async def test_a_linear_weight_past_one_binding_runs_in_parts_of_its_rows(load_pte):
    model, limit, module = await _load_past_one_binding(load_pte, _export_head)
    names = [n for n, _ in model.graph.calls]
    assert "aten.cat.default" in names, names  # the parts' outputs joined (their linears fused into one group)
    constants = [v for v in model.graph.values if isinstance(v, Tensor) and v.constant is not None]
    assert max(numel_of(v.dims) * 4 for v in constants) <= limit
    assert sum(v.dims[0] for v in constants if v.dims[1:] == (DIM,) and v.constant.rows) == VOCAB
    rng = np.random.default_rng(5)
    calls = [rng.standard_normal((1, t, DIM)).astype(np.float32) for t in (1, 37, 2, 13)]  # min, max, and between
    await assert_matches_eager(model, module, calls, atol=2e-4, rtol=2e-4)


class TiedAndBiased(torch.nn.Module):
    """A tied embedding and LM head (one tensor: torch.export keeps one constant for both) and a
    linear with a bias, each past a binding of CUT bytes."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(301, 64)
        self.mix = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 301, bias=False)
        self.head.weight = self.emb.weight
        self.biased = torch.nn.Linear(64, 307)

    def forward(self, idx):
        h = torch.tanh(self.mix(self.emb(idx)))
        return self.head(h), self.biased(h)


CUT = 20_000  # bytes a part: 78 rows of 64 floats, 4 parts of each big tensor


async def test_a_tied_table_and_head_and_a_biased_linear_are_cut_once_into_parts(load_pte, monkeypatch):
    import async_runtime.model

    real = async_runtime.model.split_constants
    monkeypatch.setattr(async_runtime.model, "split_constants", lambda graph, limit: real(graph, CUT))
    example = torch.randint(0, 301, (1, 7))
    pte, module = export_pte("tied_and_biased", TiedAndBiased, [example], ({1: torch.export.Dim("t", min=1, max=9)},))
    model = await load_pte(pte)
    names = [n for n, _ in model.graph.calls]
    assert "pte_wgpu.embedding_parts" in names and "aten.cat.default" in names, names
    constants = [v for v in model.graph.values if isinstance(v, Tensor) and v.constant is not None]
    assert max(numel_of(v.dims) * 4 for v in constants) <= CUT
    table_rows = [v.dims[0] for v in constants if v.constant.rows and v.constant.rows[2] == (301, 64)]
    assert sum(table_rows) == 301 and len(table_rows) == 4  # one set of parts for the lookup and the head
    rng = np.random.default_rng(7)
    calls = [rng.integers(0, 301, (1, t)) for t in (1, 9, 4, 7)]
    calls[0][0, 0], calls[1][0, :2] = 300, [0, 300]  # the last row and the first (the first and last parts)
    await assert_matches_eager(model, module, calls, atol=1e-5, rtol=1e-5)
