"""Reductions, softmax and norms (kernels/tensor/reduce.py) end to end: export with the VulkanPartitioner,
run on WebGPU, compare with torch eager. Odd and prime sizes; a dynamic dim run at several live
sizes in random order, including its minimum and maximum."""

import numpy as np
import torch

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

from .exporting import export_pte
from .models import RMSNorm

ATOL = 1e-4  # argmax outputs are integers: any difference fails
S_MAX = 13
DYNAMIC = ({1: torch.export.Dim("S", min=1, max=S_MAX)},)


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


async def test_reductions_static(load_pte):
    pte, module = export_pte("reduce_static", Reductions, (torch.randn(3, 7, 11),))
    rng = np.random.default_rng(0)
    calls = [rng.standard_normal((3, 7, 11)).astype(np.float32) for _ in range(2)]
    await assert_matches_eager(await load_pte(pte), module, calls, atol=ATOL)


async def test_reductions_dynamic(load_pte):
    pte, module = export_pte("reduce_dyn", DynReductions, (torch.randn(2, 5, 13),), dynamic_shapes=DYNAMIC)
    calls = dynamic_shape_calls(np.zeros((2, S_MAX, 13), np.float32), DYNAMIC, n=5, seed=1)
    await assert_matches_eager(await load_pte(pte), module, [x * 3 for x in calls], atol=ATOL)


async def test_norms_dynamic(load_pte):
    pte, module = export_pte("norms_dyn", lambda: Norms(13), (torch.randn(3, 5, 13),), dynamic_shapes=DYNAMIC)
    calls = dynamic_shape_calls(np.zeros((3, S_MAX, 13), np.float32), DYNAMIC, n=5, seed=2)
    await assert_matches_eager(await load_pte(pte), module, [x * 2 + 0.5 for x in calls], atol=ATOL)
