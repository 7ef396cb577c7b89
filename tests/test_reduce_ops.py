"""Reductions, softmax and norms (kernels/tensor/reduce.py) end to end: export with the VulkanPartitioner,
run on WebGPU, compare with torch eager. Odd and prime sizes; a dynamic dim run at several live
sizes in random order, including its minimum and maximum."""

import numpy as np
import pytest
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


@pytest.mark.parametrize("width", [13, 44, 1028])
async def test_norms_dynamic(width, load_pte, kernel_variants):
    """Rows narrower than a norm kernel's invocations, and wider (1,028: each invocation sums
    several elements of a row), with both kernel variant sets."""
    name = "norms_dyn" if width == 13 else f"norms_dyn_{width}"
    pte, module = export_pte(name, lambda: Norms(width), (torch.randn(3, 5, width),), dynamic_shapes=DYNAMIC)
    calls = dynamic_shape_calls(np.zeros((3, S_MAX, width), np.float32), DYNAMIC, n=5, seed=2)
    await assert_matches_eager(await load_pte(pte), module, [x * 2 + 0.5 for x in calls], atol=ATOL)


class MaskedAttention(torch.nn.Module):
    """scaled_dot_product_attention with a boolean mask over a dynamic number of query rows:
    PyTorch decomposes it with `_safe_softmax`, whose rows that the mask hides entirely are
    zeros, not NaN (here the rows whose `visible` is 0)."""

    def forward(self, q, k, v, visible):
        keys = torch.arange(k.shape[-2])
        mask = keys[None, :] < visible[:, None]  # row i sees keys 0..visible[i] - 1
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


async def test_safe_softmax_is_one_kernel_and_zeroes_hidden_rows(load_pte):
    """The seven ops of `_safe_softmax` run as one pte_wgpu.safe_softmax (kernels/fusion.py), and
    rows with every key hidden come out as eager's zeros, at several live row counts."""
    heads, keys, dim = 3, 11, 7
    dynamic = ({2: torch.export.Dim("S", min=1, max=S_MAX)}, None, None, {0: torch.export.Dim("S", min=1, max=S_MAX)})
    sample = (torch.randn(1, heads, 5, dim), torch.randn(1, heads, keys, dim), torch.randn(1, heads, keys, dim), torch.tensor([3, 0, 11, 1, 0]))
    pte, module = export_pte("safe_softmax_attention", MaskedAttention, sample, dynamic_shapes=dynamic)
    model = await load_pte(pte)
    names = [name for name, _ in model.graph.calls]
    pieces = {n for n in names if any(piece in n for piece in ("logical_not", "any", "full_like", "eq."))}
    assert names.count("pte_wgpu.safe_softmax") == 1 and not pieces, names  # the mask's own where stays
    rng = np.random.default_rng(5)
    calls = []
    for s in rng.permutation([1, 2, 7, S_MAX]):
        visible = rng.integers(0, keys + 1, s)
        visible[0] = 0  # a row with no key visible
        calls.append(tuple(rng.standard_normal((1, heads, n, dim)).astype(np.float32) for n in (s, keys, keys)) + (visible,))
    await assert_matches_eager(model, module, calls, atol=ATOL)
    outputs = await model.execute(*calls[0])
    assert np.all(outputs[0][:, :, 0] == 0)  # the hidden row: zeros, not NaN
