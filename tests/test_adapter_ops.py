"""Ops beyond the Llama export's: the `_hf` (rotate-half) and
`_interleaved` rotary embeddings (kernels/attention/rope.py), the standalone `llama::update_cache`
(kernels/attention/kv_cache.py) and `llama::gated_delta_rule` (kernels/attention/gated_delta.py). Each is exported through the VulkanPartitioner and compared with torch eager at
several live shapes and positions, large then small and back."""

import importlib

import numpy as np
import pytest
import torch

from async_runtime.program.graph import link
from async_runtime.program.pte import read_program

from .exporting import eager, export_pte

pytestmark = pytest.mark.usefixtures("adapter")

CONTEXT = 32
S = torch.export.Dim("s", min=1, max=16)


def _delegate_ops(pte):
    return set(link(read_program(pte).method("forward"), check=False).delegate_ops)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class HfRope(torch.nn.Module):
    """HuggingFace Llama's rotary embedding over the first `rd` dims of each head, the table sliced
    at the live position: ExecuTorch's pattern pass turns it into `et_vk.apply_rotary_emb_hf`."""

    def __init__(self, rd):
        super().__init__()
        self.register_buffer("cos", torch.randn(CONTEXT, rd))
        self.register_buffer("sin", torch.randn(CONTEXT, rd))

    def forward(self, xq, xk, input_pos):
        pos = input_pos[0].item()
        torch._check(pos >= 0)
        torch._check(pos + xq.shape[1] <= CONTEXT)
        cos = self.cos.narrow(0, pos, xq.shape[1]).unsqueeze(1)
        sin = self.sin.narrow(0, pos, xq.shape[1]).unsqueeze(1)
        rd = cos.shape[-1]
        q_rot, q_pass = xq[..., :rd], xq[..., rd:]
        k_rot, k_pass = xk[..., :rd], xk[..., rd:]
        q = torch.cat([q_rot * cos + _rotate_half(q_rot) * sin, q_pass], dim=-1)
        k = torch.cat([k_rot * cos + _rotate_half(k_rot) * sin, k_pass], dim=-1)
        return q, k


ROPE_HEADS = 3, 1, 10  # grouped-query heads, head dim 10


def _rope_hf(rd):
    heads, kv_heads, dim = ROPE_HEADS
    sample = (torch.randn(1, 5, heads, dim), torch.randn(1, 5, kv_heads, dim), torch.tensor([3]))
    return export_pte(f"rope_hf_{rd}", lambda: HfRope(rd), sample, ({1: S}, {1: S}, None))


@pytest.mark.parametrize("rd", [10, 6], ids=["full", "partial"])
async def test_apply_rotary_emb_hf(load_pte, rd):
    heads, kv_heads, dim = ROPE_HEADS
    pte, module = _rope_hf(rd)
    assert "et_vk.apply_rotary_emb_hf.default" in _delegate_ops(pte)
    model = await load_pte(pte)
    rng = np.random.default_rng(rd)
    for s, pos in [(5, 3), (16, 16), (1, 31), (7, 0), (16, 0), (2, 29)]:
        args = [rng.standard_normal((1, s, h, dim)).astype(np.float32) for h in (heads, kv_heads)]
        args.append(np.array([pos], np.int64))
        got = await model.execute(*args)
        for k, (g, w) in enumerate(zip(got, eager(module, *args))):
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5, err_msg=f"s={s} pos={pos} output {k}")


class InterleavedRope(torch.nn.Module):
    def forward(self, x, freqs_cis):
        return torch.ops.et_vk.apply_rotary_emb_interleaved(x, freqs_cis)


def _rope_interleaved():
    pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")
    sample = (torch.randn(3, 7, 14), torch.randn(1, 7, 7, 2))
    return export_pte("rope_interleaved", InterleavedRope, sample, ({1: S}, {1: S}))


async def test_apply_rotary_emb_interleaved(load_pte):
    pte, module = _rope_interleaved()
    assert "et_vk.apply_rotary_emb_interleaved.default" in _delegate_ops(pte)
    model = await load_pte(pte)
    rng = np.random.default_rng(0)
    for n in [7, 16, 1, 11, 16, 2]:
        args = [rng.standard_normal(shape).astype(np.float32) for shape in ((3, n, 14), (1, n, 7, 2))]
        (got,) = await model.execute(*args)
        np.testing.assert_allclose(got, eager(module, *args)[0], atol=1e-5, rtol=1e-5, err_msg=f"n={n}")


class CacheUpdate(torch.nn.Module):
    """`llama::update_cache` into a mutable K cache [1, CONTEXT, 3, 5], then a read of the whole cache."""

    def __init__(self):
        super().__init__()
        importlib.import_module("executorch.extension.llm.custom_ops.custom_ops")  # registers llama::

        self.register_buffer("k_cache", torch.zeros(1, CONTEXT, 3, 5))

    def forward(self, k, input_pos):
        pos = input_pos[0].item()
        torch._check(pos >= 0)
        torch._check(pos < CONTEXT)
        torch._check(pos + k.shape[1] <= CONTEXT)
        torch.ops.llama.update_cache(k, self.k_cache, pos)
        return self.k_cache * 2.0


def _cache_pte():
    pytest.importorskip("executorch.extension.llm.custom_ops")
    sample = (torch.randn(1, 4, 3, 5), torch.tensor([2]))
    return export_pte("update_cache", CacheUpdate, sample, ({1: S}, None))


async def test_update_cache(load_pte):
    pte, _ = _cache_pte()
    assert "update_cache.default" in _delegate_ops(pte)
    model = await load_pte(pte)
    module = CacheUpdate().eval()  # a fresh eager cache, updated call for call with the session's
    rng = np.random.default_rng(1)
    for s, pos in [(4, 0), (1, 4), (3, 5), (16, 16), (1, 31), (16, 7), (2, 0)]:
        args = (rng.standard_normal((1, s, 3, 5)).astype(np.float32), np.array([pos], np.int64))
        (got,) = await model.execute(*args)
        np.testing.assert_array_equal(got, eager(module, *args)[0], err_msg=f"s={s} pos={pos}")


async def test_update_cache_sessions_do_not_share(load_pte):
    pte, _ = _cache_pte()
    model = await load_pte(pte)
    await model.execute(np.ones((1, 4, 3, 5), np.float32), np.array([0], np.int64))
    async with model.session() as other:
        (got,) = await other.execute(np.ones((1, 1, 3, 5), np.float32), np.array([8], np.int64))
    want = np.zeros((1, CONTEXT, 3, 5), np.float32)
    want[:, 8] = 2.0
    np.testing.assert_array_equal(got, want)


class GatedDelta(torch.nn.Module):
    """`llama::gated_delta_rule` (Qwen3.5's linear attention) over 3 heads, keys of 6 and values of
    5, T tokens; `decay` a scalar a (head, token), or a value a key dim (`channelwise`). ExecuTorch's
    Vulkan partitioner leaves it to the portable runtime."""

    def __init__(self, channelwise=False):
        super().__init__()
        importlib.import_module("executorch.extension.llm.custom_ops.custom_ops")  # registers llama::
        self.channelwise = channelwise

    def forward(self, q, k, v, decay, beta, state):
        return torch.ops.llama.gated_delta_rule(q, k, v, decay, beta, state)


@pytest.mark.parametrize("channelwise", [False, True], ids=["scalar_decay", "channelwise_decay"])
async def test_gated_delta_rule(load_pte, channelwise):
    """Outputs and final state within 1e-5 of ExecuTorch's own kernel at 1 to 13 tokens, in random
    order; a state carried from one call to the next as a model would."""
    pytest.importorskip("executorch.extension.llm.custom_ops")
    t = torch.export.Dim("t", min=1, max=13)
    shapes = [(1, 3, 13, 6), (1, 3, 13, 6), (1, 3, 13, 5), (1, 3, 13, 6) if channelwise else (1, 3, 13), (1, 3, 13), (1, 3, 6, 5)]
    sample = tuple(torch.rand(shape) for shape in shapes)
    dynamic = tuple({2: t} if i < 5 else None for i in range(6))
    pte, module = export_pte(f"gated_delta_rule_{channelwise}", lambda: GatedDelta(channelwise), sample, dynamic)
    model = await load_pte(pte)
    rng = np.random.default_rng(5)
    state = np.zeros((1, 3, 6, 5), np.float32)
    for n in [13, 1, 7, 2, 13, 4]:
        q, k = (rng.standard_normal((1, 3, n, 6)).astype(np.float32) / 3 for _ in range(2))
        v = rng.standard_normal((1, 3, n, 5)).astype(np.float32)
        decay = rng.uniform(0.5, 1.0, (1, 3, n, 6) if channelwise else (1, 3, n)).astype(np.float32)
        beta = rng.uniform(0.0, 1.0, (1, 3, n)).astype(np.float32)
        args = (q, k, v, decay, beta, state)
        got = await model.execute(*args)
        want = eager(module, *args)
        for g, w, name in zip(got, want, ("output", "final state")):
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5, err_msg=f"{name}, {n} tokens")
        state = got[1]


class Rearranged(torch.nn.Module):
    """flip, repeat, constant_pad_nd (padding and cropping), div with rounding modes and a clamp
    bound that is a SymInt, on x [3, S, 5] and an int32 tensor of the same shape."""

    def forward(self, x, y, n):
        return (
            torch.flip(x, [0, 2]),
            x.repeat(2, 1, 3),
            x.repeat(2, 3, 1, 2),
            torch.nn.functional.pad(x, (1, 2, 0, 3), value=2.5),
            torch.nn.functional.pad(x, (-1, 2, 1, 0)),
            torch.div(x, y, rounding_mode="floor"),
            torch.div(x, y, rounding_mode="trunc"),
            torch.div(n, 3, rounding_mode="floor"),
            torch.div(n, -4, rounding_mode="trunc"),
            torch.clamp(x * 10, max=x.shape[1]),
        )


REARRANGED_MAX = 11


def _rearranged():
    seq = torch.export.Dim("seq", min=1, max=REARRANGED_MAX)
    n = REARRANGED_MAX
    sample = (torch.randn(3, n, 5), torch.randn(3, n, 5), torch.randint(-50, 50, (3, n, 5), dtype=torch.int32))
    return export_pte("rearranged", Rearranged, sample, ({1: seq}, {1: seq}, {1: seq}))


# tests/prebuild.py: this file's exports, the rotary ones among the suite's slowest
PREBUILD = [lambda: _rope_hf(10), lambda: _rope_hf(6), _cache_pte, _rearranged, _rope_interleaved]


async def test_flip_repeat_pad_div_mode_clamp_symint(load_pte):
    S_MAX = REARRANGED_MAX
    pte, module = _rearranged()
    model = await load_pte(pte)
    rng = np.random.default_rng(3)
    for s in [7, S_MAX, 1, 4, S_MAX, 2]:
        x, y = (rng.standard_normal((3, s, 5)).astype(np.float32) * 4 for _ in range(2))
        n = rng.integers(-50, 50, (3, s, 5)).astype(np.int32)
        got = await model.execute(x, y, n)
        want = eager(module, x, y, n)
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"s={s} output {k}")
