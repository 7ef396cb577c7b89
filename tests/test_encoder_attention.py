"""Attention exported without a KV cache (torch's multi-head attention and scaled_dot_product_attention,
as ViT and encoders export them: bmm -> safe softmax -> bmm) runs as one pte_wgpu.attention
(kernels/fusion.py, kernels/attention/sdpa.py), the query-tiled flash-attention kernel, against
torch eager: prime token counts, head dims 12 and 20 (vec4s, not powers of 2) and 64, a dynamic
number of query rows and keys at several live sizes in random order, including 1 and the maximum.
timm's attention (ViT's, DeiT's: q, k and v sliced from one projection's [B, S, 3, H, D], the result
transposed back to [B, S, H, D]) runs as pte_wgpu.attention_packed, reading and writing those
layouts in place."""

import numpy as np
import torch

from async_runtime.testing import assert_matches_eager

from .exporting import export_pte
from .zoo_models import Attention

ATOL = 2e-5
FUSED_AWAY = ("bmm", "softmax", "mul.Scalar", "eq.", "any", "where", "full_like")  # the scores' ops


class SelfAttention(torch.nn.Module):
    """ViT's attention block: torch's multi-head attention over a [batch, tokens, width] input."""

    def __init__(self, width, heads):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class Sdpa(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def mha_export(width=36, heads=3):
    """(pte, module) of SelfAttention over [2, 13, width]."""
    return export_pte(f"mha_w{width}_h{heads}", lambda: SelfAttention(width, heads), (torch.randn(2, 13, width),))


def _names(model):
    return [name for name, _ in model.graph.calls]


async def test_multi_head_attention_is_one_kernel(load_pte):
    """ViT's pattern at batch 2, 13 tokens, 3 heads of 12 and 2 of 64: one pte_wgpu.attention, none
    of the scores' ops and no multiplies left; eager's outputs."""
    rng = np.random.default_rng(3)
    for width, heads in ((36, 3), (128, 2)):
        pte, module = mha_export(width, heads)
        model = await load_pte(pte)
        names = _names(model)
        assert names.count("pte_wgpu.attention") == 1, names
        assert not [n for n in names if any(op in n for op in FUSED_AWAY)], names
        calls = [rng.standard_normal((2, 13, width)).astype(np.float32) * 2 for _ in range(3)]
        await assert_matches_eager(model, module, calls, atol=ATOL, rtol=ATOL)


async def test_dynamic_rows_and_keys(load_pte):
    """scaled_dot_product_attention with 1 to 37 query rows and 1 to 41 keys (a key count past
    one key block of the kernel), 5 heads of 20: one pte_wgpu.attention at every live size."""
    rows, keys = torch.export.Dim("S", min=1, max=37), torch.export.Dim("L", min=1, max=41)
    dynamic = ({2: rows}, {2: keys}, {2: keys})
    sample = (torch.randn(1, 5, 7, 20), torch.randn(1, 5, 11, 20), torch.randn(1, 5, 11, 20))
    pte, module = export_pte("sdpa_dyn_rows_keys", Sdpa, sample, dynamic_shapes=dynamic)
    model = await load_pte(pte)
    assert _names(model).count("pte_wgpu.attention") == 1, _names(model)
    rng = np.random.default_rng(4)
    calls = []
    for s, n in zip(rng.permutation([1, 2, 19, 37, 8]), rng.permutation([1, 41, 23, 2, 40])):
        calls.append(tuple(rng.standard_normal((1, 5, m, 20)).astype(np.float32) for m in (s, n, n)))
    await assert_matches_eager(model, module, calls, atol=ATOL, rtol=ATOL)


async def test_timm_attention_reads_its_projection_in_place(load_pte):
    """timm's layout at 13 tokens (3 heads of 12, 2 of 64) and at 1 to 37 tokens (dynamic): one
    pte_wgpu.attention_packed, no slice or permute copies of q, k, v or the result; eager's outputs."""
    rng = np.random.default_rng(6)
    tokens = torch.export.Dim("tokens", min=1, max=37)
    for width, heads, dynamic in ((36, 3, None), (128, 2, None), (36, 3, ({1: tokens},))):
        n = 37 if dynamic else 13
        name = f"timm_attention_w{width}_h{heads}" + ("_dyn" if dynamic else "")
        pte, module = export_pte(name, lambda: Attention(width, heads), (torch.randn(2, n, width),), dynamic_shapes=dynamic)
        model = await load_pte(pte)
        names = _names(model)
        assert names.count("pte_wgpu.attention_packed") == 1, names
        assert not [n for n in names if "slice" in n or "permute" in n or any(op in n for op in FUSED_AWAY)], names
        sizes = rng.permutation([1, 2, 19, 37, 8]) if dynamic else [13, 13]
        calls = [rng.standard_normal((2, int(m), width)).astype(np.float32) for m in sizes]
        await assert_matches_eager(model, module, calls, atol=ATOL, rtol=ATOL)
