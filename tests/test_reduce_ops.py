"""Reductions, softmax and norms (kernels/reduce.py) end to end: export with the VulkanPartitioner,
run on WebGPU, compare with torch eager. Odd and prime sizes; a dynamic dim run at several live
sizes in random order, including its minimum and maximum."""

import random

import numpy as np
import pytest
import torch

from .exporting import eager, export_pte
from .models import RMSNorm

ATOL = 1e-4
S_MAX = 13


def _check(outs, refs, what):
    assert len(outs) == len(refs), what
    for k, (o, r) in enumerate(zip(outs, refs)):
        o = np.asarray(o)
        assert o.shape == r.shape, f"{what}: output {k} has shape {o.shape}, expected {r.shape}"
        if r.dtype.kind in "iu":
            np.testing.assert_array_equal(o, r, err_msg=f"{what}: output {k}")
        else:
            np.testing.assert_allclose(o, r, atol=ATOL, rtol=1e-4, err_msg=f"{what}: output {k}")


class Reductions(torch.nn.Module):
    """Every reduction on one input: last dim (per-row), inner dims, several dims, all dims."""

    def forward(self, x):
        return (
            torch.softmax(x, -1),
            torch.log_softmax(x, 1),
            x.sum(-1),
            x.sum([0, 2], keepdim=True),
            x.mean(1, keepdim=True),
            x.mean(-1),
            x.amax(-1),
            x.amin(1, keepdim=True),
            x.argmax(-1),
            x.argmax(1),
            x.sum(),
        )


class DynReductions(torch.nn.Module):
    """Reductions along and across a dynamic middle dim."""

    def forward(self, x):
        return (
            torch.softmax(x, -1),
            torch.log_softmax(x, 1),
            x.sum(-1),
            x.mean(1, keepdim=True),
            x.amax(-1),
            x.amin(-1),
            x.argmax(-1),
        )


class Norms(torch.nn.Module):
    """LayerNorm (affine), ExecuTorch's llama RMSNorm (fused to et_vk.rms_norm) and a layer norm
    over two trailing dims without weight or bias."""

    def __init__(self, dim):
        super().__init__()
        self.ln = torch.nn.LayerNorm(dim, eps=1e-5)
        self.rms = RMSNorm(dim, eps=1e-6)
        with torch.no_grad():
            for p in (self.ln.weight, self.ln.bias, self.rms.weight):
                p.copy_(torch.randn(p.shape))

    def forward(self, x):
        return self.ln(x), self.rms(x), torch.nn.functional.layer_norm(x, x.shape[-2:])


def _dyn():
    return ({1: torch.export.Dim("S", min=1, max=S_MAX)},)


def _live_sizes(seed):
    sizes = [1, S_MAX, 2, 7, 11, S_MAX, 1, 5]
    random.Random(seed).shuffle(sizes)
    return sizes


@pytest.mark.anyio
async def test_reductions_static(adapter):
    import async_runtime as ar

    buf, module = export_pte("reduce_static", Reductions, (torch.randn(3, 7, 11),))
    model = await ar.load(buf)
    try:
        rng = np.random.default_rng(0)
        for _ in range(2):
            x = rng.standard_normal((3, 7, 11)).astype(np.float32)
            _check(await model.execute(x), eager(module, x), "static reductions")
    finally:
        await model.aclose()


@pytest.mark.anyio
async def test_reductions_dynamic(adapter):
    import async_runtime as ar

    buf, module = export_pte("reduce_dyn", DynReductions, (torch.randn(2, 5, 13),), dynamic_shapes=_dyn())
    model = await ar.load(buf)
    try:
        rng = np.random.default_rng(1)
        for s in _live_sizes(1):
            x = (rng.standard_normal((2, s, 13)) * 3).astype(np.float32)
            _check(await model.execute(x), eager(module, x), f"dynamic reductions at S={s}")
    finally:
        await model.aclose()


@pytest.mark.anyio
async def test_norms_dynamic(adapter):
    import async_runtime as ar

    buf, module = export_pte("norms_dyn", lambda: Norms(13), (torch.randn(3, 5, 13),), dynamic_shapes=_dyn())
    model = await ar.load(buf)
    try:
        rng = np.random.default_rng(2)
        for s in _live_sizes(2):
            x = (rng.standard_normal((3, s, 13)) * 2 + 0.5).astype(np.float32)
            _check(await model.execute(x), eager(module, x), f"norms at S={s}")
    finally:
        await model.aclose()
