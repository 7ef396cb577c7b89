"""f16 storage for reductions, softmax and the norms (kernels/tensor/reduce.py, kernels/vision/norm.py).

Each module is cast with `.half()` before export; the model must load with f16 storage and match
torch eager fp16 of the same module and inputs at several live shapes (the dynamic dim's minimum
and maximum included, odd and prime sizes). Tolerance 4e-3 (rtol = atol; argmax ids, integers, must be equal):
the kernels sum, average and normalize in f32 and round once at the store, torch's fp16 ops
round at every op (the RMS norm pattern is four of them), each rounding up to half an f16 ulp
(4.9e-4 of the value). The same reductions run once with `load(..., precision="f32")`.
"""

import numpy as np
import pytest
import torch

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

from .exporting import export_pte

pytestmark = [pytest.mark.usefixtures("adapter", "half_adapter"), pytest.mark.anyio]

TOL = 4e-3
S_MAX = 13
DYNAMIC = ({1: torch.export.Dim("S", min=1, max=S_MAX)},)


class RowReductions(torch.nn.Module):
    """Softmax, log-softmax and every reduction along the last dim, log-softmax along the dynamic one."""

    def forward(self, x):
        return (
            torch.softmax(x, -1),
            torch.log_softmax(x, 1),
            x.sum(-1),
            x.mean(-1),
            x.amax(-1),
            x.amin(-1),
            x.argmax(-1),
        )


class CrossReductions(torch.nn.Module):
    """Reductions across the dynamic dim and across two dims. (One module with both sets gets a
    clone from the partitioner, an op outside this file's families.)"""

    def forward(self, x):
        return x.mean(1, keepdim=True), x.sum([0, 2], keepdim=True), x.argmax(1)


class Norms(torch.nn.Module):
    """ExecuTorch's llama RMS norm in the module's dtype (fused to et_vk.rms_norm) and an affine
    layer norm, their weight and bias given as inputs."""

    def forward(self, x, w, b):
        rms = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
        return rms, torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, 1e-5)


class ChannelNorms(torch.nn.Module):
    """Batch norm (inference) and group norm over 6 channels, their statistics and affines f16."""

    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(6)
        self.gn = torch.nn.GroupNorm(3, 6)
        with torch.no_grad():
            for p in (self.bn.weight, self.bn.bias, self.bn.running_mean, self.gn.weight, self.gn.bias):
                p.copy_(torch.randn(p.shape))
            self.bn.running_var.copy_(torch.rand(6) + 0.5)

    def forward(self, x):
        return self.bn(x), self.gn(x)


def _calls(shape, dynamic, n, seed, scale=3.0, shift=0.0):
    """Live calls of f16 inputs drawn like `dynamic_shape_calls`, scaled and shifted."""
    calls = dynamic_shape_calls((np.zeros(shape, np.float16),), dynamic, n=n, seed=seed)
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(c[0].shape) * scale + shift).astype(np.float16) for c in calls]


REDUCTIONS = {"rows": RowReductions, "across": CrossReductions}


@pytest.mark.parametrize("precision", ["auto", "f32"])
@pytest.mark.parametrize("kind", REDUCTIONS)
async def test_reductions(load_pte, kind, precision):
    sample = (torch.randn(3, S_MAX, 11).half(),)
    pte, module = export_pte(f"f16norm_reduce_{kind}", lambda: REDUCTIONS[kind]().half(), sample, DYNAMIC)
    model = await load_pte(pte, precision=precision)
    assert model.precision == {"auto": "f16", "f32": "f32"}[precision]
    calls = _calls((3, S_MAX, 11), DYNAMIC, n=5, seed=1)
    await assert_matches_eager(model, module, calls, atol=TOL, rtol=TOL)  # argmax ids: integers, so exact


async def test_rms_and_layer_norm(load_pte):
    sample = (torch.randn(3, S_MAX, 13).half(), torch.randn(13).half(), torch.randn(13).half())
    dynamic = DYNAMIC + (None, None)
    pte, module = export_pte("f16norm_norms", lambda: Norms().half(), sample, dynamic)
    model = await load_pte(pte)
    assert model.precision == "f16"
    rng = np.random.default_rng(2)
    w, b = (rng.standard_normal(13).astype(np.float16) for _ in range(2))
    calls = [(x, w, b) for x in _calls((3, S_MAX, 13), DYNAMIC, n=5, seed=2, scale=2.0, shift=0.5)]
    await assert_matches_eager(model, module, calls, atol=TOL, rtol=TOL)


async def test_batch_and_group_norm(load_pte):
    """Static shapes: the partitioner cannot plan this module's outputs with a dynamic dim."""
    pte, module = export_pte("f16norm_channels", lambda: ChannelNorms().eval().half(), (torch.randn(2, 6, 5, 7).half(),))
    model = await load_pte(pte)
    assert model.precision == "f16"
    rng = np.random.default_rng(3)
    calls = [(rng.standard_normal((2, 6, 5, 7)) * 3 + 1).astype(np.float16) for _ in range(2)]
    await assert_matches_eager(model, module, calls, atol=TOL, rtol=TOL)
