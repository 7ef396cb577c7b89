"""An embedding table larger than one storage binding (lavapipe binds at most 128 MiB; an H100 2 GiB,
less than Phi-4-mini's 2.46 GB fp32 embedding) is cut into parts of whole rows at load
(async_runtime/program/tables.py) and looked up from them (`pte_wgpu.embedding_parts`)."""

import functools

import numpy as np
import pytest
import torch

from async_runtime.testing import assert_matches_eager

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


PREBUILD = [functools.partial(_export)]  # tests/prebuild.py


async def test_a_table_past_one_binding_is_looked_up_from_parts(load_pte):
    pte, module = _export()
    model = await load_pte(pte)
    limit = model.device_info.max_storage_binding
    if VOCAB * DIM * 4 <= limit:
        pytest.skip(f"the adapter binds {limit} bytes: the table fits one binding")
    names = [n for n, _ in model.graph.calls]
    assert "pte_wgpu.embedding_parts" in names and not any("embedding.default" in n or "embedding.out" in n for n in names), names
    rng = np.random.default_rng(3)
    calls = []
    for t in (1, 37, 5, 16):  # rows from both parts, the first and last rows, each part's edges
        idx = rng.integers(0, VOCAB, (1, t))
        idx[0, : min(t, 4)] = [0, VOCAB - 1, limit // (DIM * 4) - 1, limit // (DIM * 4)][: min(t, 4)]
        calls.append(idx)
    await assert_matches_eager(model, module, calls, atol=0, rtol=0)
