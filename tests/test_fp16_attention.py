"""f16 storage for attention, its KV caches, RoPE, embeddings and the greedy sampler.

Each module is cast with `.half()` before export, so its inputs, caches and outputs are float16;
the model must load with f16 storage (`model.precision == "f16"`) and match a reference of the
same float16 values:

- attention (`sdpa_with_kv_cache`, its ragged form over concurrent sessions, `custom_sdpa` after
  `update_cache`, `et_vk.sdpa`) against float64 attention, for every route: split-K decode (the
  GPU's vec4 and scalar kernels, the CPU adapters' one) and the one-pass prefill (the query-tiled
  kernel at head dim 64, the plain one at 80), under both kernel variant sets. Tolerance 2e-3
  (rtol = atol): f16 storage rounds each output to 11 bits (half an ulp is 4.9e-4 of the value)
  after f32 arithmetic;
- RoPE and embeddings against torch eager fp16 (an embedding exactly; RoPE within 2e-3: torch
  rounds each product to f16, the kernel only the result), and the ragged RoPE that stores k and
  v in the f16 caches (rope_into_cache) against float64 attention of the f16-rounded rotations;
- the greedy sampler's kernel over f16 logits against numpy's argmax (ties to the first index).

The f32 fallback (`load(..., precision="f32")`) runs the attention steps too, against the same
reference.
"""

import copy
import math
from unittest import mock

import anyio
import numpy as np
import pytest
import torch

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls
from pte_wgpu.kernels.attention.kv_cache_sdpa import SPLIT_MAX_ROWS

from . import test_attention_tiled as tiled
from .exporting import eager, export_pte
from .test_adapter_ops import HfRope
from .test_more_ops import _delegate_ops

pytestmark = [pytest.mark.usefixtures("adapter", "half_adapter"), pytest.mark.anyio]

TOL = 2e-3
HQ, HKV, CONTEXT = 6, 2, 96
S_MAX = 40  # past SPLIT_MAX_ROWS: the one-pass route
ROWS = torch.export.Dim("s", min=1, max=S_MAX)


def _half(*arrays):
    return tuple(np.asarray(a, np.float16) for a in arrays)


def _attend(q, k, v, positions, scale=None):
    """float64 causal attention: row i of q [S, Hq, d] at position positions[i] over keys
    0..positions[i] of k, v [context, Hkv, d] (grouped-query heads)."""
    hq, d = q.shape[1], q.shape[2]
    k, v = (np.repeat(t.astype(np.float64), hq // t.shape[1], axis=1) for t in (k, v))
    scores = np.einsum("shd,thd->sht", q.astype(np.float64), k) * (scale or 1 / math.sqrt(d))
    hidden = np.arange(k.shape[0])[None, :] > np.asarray(positions)[:, None]
    scores = np.where(hidden[:, None, :], -np.inf, scores)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("sht,thd->shd", w / w.sum(-1, keepdims=True), v)


# -- sdpa_with_kv_cache: q, k, v given, the caches the module's f16 buffers ------------------------


class CachedAttention(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, CONTEXT, HKV, dim))
        self.register_buffer("v_cache", torch.zeros(1, CONTEXT, HKV, dim))

    def forward(self, q, k, v, input_pos):
        s = q.shape[1]
        pos = input_pos[0].item()
        torch._check_is_size(pos)
        torch._check(pos + s <= CONTEXT)
        return torch.ops.llama.sdpa_with_kv_cache(q, k, v, self.k_cache, self.v_cache, pos, s, None, 0, True)


def _cached_attention(dim):
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    sample = (torch.randn(1, 5, HQ, dim), torch.randn(1, 5, HKV, dim), torch.randn(1, 5, HKV, dim), torch.tensor([3]))
    sample = tuple(t.half() if t.is_floating_point() else t for t in sample)
    dynamic = ({1: ROWS}, {1: ROWS}, {1: ROWS}, None)
    pte, _ = export_pte(f"f16att_sdpa_d{dim}", lambda: CachedAttention(dim).half(), sample, dynamic)
    return pte


# rows per step, each plan filling the context: decode rows (split-K), up to SPLIT_MAX_ROWS rows
# (split-K's limit) and S_MAX (the one-pass route), the minimum and maximum row counts included
PLANS = [[S_MAX, 1, 7, SPLIT_MAX_ROWS + 1, 1, 14], [1, SPLIT_MAX_ROWS, 1, S_MAX, 22]]


async def _steps(session, dim, counts, rng):
    k_hist, v_hist = (np.zeros((CONTEXT, HKV, dim), np.float16) for _ in range(2))
    pos = 0
    for s in counts:
        q, k, v = _half(*(rng.standard_normal((1, s, h, dim)) * 2 for h in (HQ, HKV, HKV)))
        k_hist[pos : pos + s], v_hist[pos : pos + s] = k[0], v[0]
        (got,) = await session.execute(q, k, v, np.array([pos], np.int64))
        assert got.dtype == np.float16
        want = _attend(q[0], k_hist, v_hist, np.arange(pos, pos + s))
        np.testing.assert_allclose(got[0], want, rtol=TOL, atol=TOL, err_msg=f"{s} rows at {pos}")
        pos += s


@pytest.mark.parametrize("dim", [64, 80], ids=["tiled-vec4", "plain"])
async def test_sdpa_with_kv_cache_every_route(load_pte, kernel_variants, dim):
    """Head dim 64 takes the query-tiled kernel and (GPU) split-K's vec4 one, 80 the plain kernels."""
    pte = _cached_attention(dim)
    model = await load_pte(pte, batch_submits=False)
    assert (model.precision, model.kernels) == ("f16", kernel_variants)
    rng = np.random.default_rng(dim)
    for counts in PLANS:
        async with model.session() as session:
            await _steps(session, dim, counts, rng)


async def test_sdpa_caches_take_half_the_bytes_and_f32_still_matches(load_pte):
    pte = _cached_attention(64)
    half = await load_pte(pte, batch_submits=False)
    wide = await load_pte(pte, batch_submits=False, precision="f32")
    assert (half.precision, wide.precision) == ("f16", "f32")
    async with half.session() as a, wide.session() as b:
        cache_bytes = 2 * CONTEXT * HKV * 64 * 2  # both caches in f16
        assert b.memory() - a.memory() >= cache_bytes
        await _steps(b, 64, PLANS[0], np.random.default_rng(5))


# -- ragged passes: token embeddings as q, k, v (test_attention_tiled's module, cast to f16) --------


async def _concurrent_sessions(model, plans, reference, rng):
    """One session a plan of rows per step, all at once (ragged passes), fed random tokens; each
    step's output must match `reference(history, pos, rows)` within TOL."""

    async def run(counts):
        history, pos = rng.integers(0, tiled.VOCAB, sum(counts)), 0
        async with model.session() as session:
            for s in counts:
                tokens = np.asarray(history[pos : pos + s], np.int64)[None]
                (got,) = await session.execute(tokens, np.array([pos], np.int64))
                want = reference(history, pos, s)
                np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL, err_msg=f"{s} rows at {pos}")
                pos += s

    async with anyio.create_task_group() as tg:
        for counts in plans:
            tg.start_soon(run, counts)


async def test_ragged_sessions(load_pte, kernel_variants):
    """Concurrent sessions' steps share ragged passes (kernels/attention/kv_cache_sdpa.py ragged_sdpa, its cache
    update and both routes) over f16 KV-cache slots."""
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    sample = (torch.randint(0, tiled.VOCAB, (1, 41)), torch.tensor([5]))
    dynamic = ({1: torch.export.Dim("s", min=1, max=tiled.S_MAX)}, None)
    pte, module = export_pte("f16att_embedded_attention", lambda: tiled.EmbeddedAttention().half(), sample, dynamic)
    model = await load_pte(pte)
    assert (model.precision, model.batching, model.kernels) == ("f16", "ragged", kernel_variants)
    await _concurrent_sessions(model, tiled.PLANS, lambda *step: tiled._eager(module, *step), np.random.default_rng(4))
    stats = model.statistics()
    assert stats.executes == sum(map(len, tiled.PLANS)) and stats.submits < stats.executes


class RopedAttention(torch.nn.Module):
    """Embedded q, k, v (v first), Llama's RoPE at the positions' rows of a table, attention over
    the KV cache: in a ragged pass, the RoPE stores k and v in the caches (pte_wgpu.rope_into_cache)."""

    DIM, CONTEXT = 16, 64

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Embedding(tiled.VOCAB, HQ * self.DIM)
        self.k = torch.nn.Embedding(tiled.VOCAB, HKV * self.DIM)
        self.v = torch.nn.Embedding(tiled.VOCAB, HKV * self.DIM)
        angles = torch.rand(self.CONTEXT, self.DIM // 2) * 6.3
        self.register_buffer("freqs_cos", angles.cos())
        self.register_buffer("freqs_sin", angles.sin())
        self.register_buffer("k_cache", torch.zeros(1, self.CONTEXT, HKV, self.DIM))
        self.register_buffer("v_cache", torch.zeros(1, self.CONTEXT, HKV, self.DIM))

    def forward(self, tokens, input_pos):
        s = tokens.shape[1]
        pos = input_pos[0].item()
        torch._check_is_size(pos)
        torch._check(pos + s <= self.CONTEXT)
        v = self.v(tokens).view(1, s, HKV, self.DIM)
        q = self.q(tokens).view(1, s, HQ, self.DIM)
        k = self.k(tokens).view(1, s, HKV, self.DIM)
        q, k = torch.ops.et_vk.apply_rotary_emb(q, k, self.freqs_cos[pos : pos + s], self.freqs_sin[pos : pos + s])
        y = torch.ops.llama.sdpa_with_kv_cache(q, k, v, self.k_cache, self.v_cache, pos, s, None, 0, True)
        return y.view(1, s, HQ * self.DIM)

    def reference(self, history, pos, s):
        """float64 attention of rows pos..pos+s-1, q and k rotated and rounded to f16 as stored."""
        tokens = torch.from_numpy(np.asarray(history[: pos + s], np.int64))
        c, sn = (t.double().numpy()[: pos + s, None, :] for t in (self.freqs_cos, self.freqs_sin))
        rows = []
        for table, heads in ((self.q, HQ), (self.k, HKV), (self.v, HKV)):
            rows.append(table(tokens).detach().double().numpy().reshape(pos + s, heads, self.DIM))
        for i in (0, 1):
            a, b = rows[i][..., 0::2], rows[i][..., 1::2]
            rows[i] = np.stack([a * c - b * sn, a * sn + b * c], -1).reshape(rows[i].shape).astype(np.float16)
        q, k, v = rows
        return _attend(q[pos:], k, v, np.arange(pos, pos + s)).reshape(1, s, HQ * self.DIM)


async def test_ragged_rope_into_cache(load_pte, kernel_variants):
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")
    sample = (torch.randint(0, tiled.VOCAB, (1, 7)), torch.tensor([5]))
    dynamic = ({1: torch.export.Dim("s", min=1, max=S_MAX)}, None)
    pte, module = export_pte("f16att_roped_attention", lambda: RopedAttention().half(), sample, dynamic)
    model = await load_pte(pte)
    assert (model.precision, model.batching) == ("f16", "ragged")
    assert "pte_wgpu.rope_into_cache" in {name for name, _ in model.graph.calls}
    plans = ([S_MAX, 1, 1, 22], [1, 33, 1, 2], [7, 1, 1, 1])
    await _concurrent_sessions(model, plans, module.reference, np.random.default_rng(8))


# -- update_cache, then custom_sdpa over the caches (the causal_sdpa fusion turned off) --------------


class UpdateThenAttend(CachedAttention):
    """k and v stored by `llama::update_cache`, then causal and non-causal `custom_sdpa` reads."""

    def forward(self, q, k, v, input_pos):
        pos = input_pos[0].item()
        torch._check_is_size(pos)
        torch._check(pos + q.shape[1] <= CONTEXT)
        llama = torch.ops.llama
        llama.update_cache(k, self.k_cache, pos)
        llama.update_cache(v, self.v_cache, pos)
        return (
            llama.custom_sdpa(q, self.k_cache, self.v_cache, pos, None, 0.0, True, None),
            llama.custom_sdpa(q, self.k_cache, self.v_cache, pos, None, 0.0, False, 0.25),
        )


async def test_update_cache_and_custom_sdpa(load_pte):
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    from executorch.backends.vulkan.patterns import fusable_patterns

    dim = 12
    sample = (torch.randn(1, 5, HQ, dim), torch.randn(1, 5, HKV, dim), torch.randn(1, 5, HKV, dim), torch.tensor([3]))
    sample = tuple(t.half() if t.is_floating_point() else t for t in sample)
    with mock.patch.dict(fusable_patterns):
        del fusable_patterns["causal_sdpa"]  # it would fuse the updates into sdpa_with_kv_cache
        dynamic = ({1: ROWS}, {1: ROWS}, {1: ROWS}, None)
        pte, _ = export_pte("f16att_update_custom_sdpa", lambda: UpdateThenAttend(dim).half(), sample, dynamic)
    assert {"update_cache.default", "llama.custom_sdpa.default", "et_vk.prepack.default"} <= _delegate_ops(pte)
    model = await load_pte(pte)
    assert model.precision == "f16"
    rng = np.random.default_rng(7)
    k_hist, v_hist = (np.zeros((CONTEXT, HKV, dim), np.float16) for _ in range(2))
    pos = 0
    for s in [S_MAX, 1, 13, 1, S_MAX]:
        q, k, v = _half(*(rng.standard_normal((1, s, h, dim)) for h in (HQ, HKV, HKV)))
        k_hist[pos : pos + s], v_hist[pos : pos + s] = k[0], v[0]
        causal, full = await model.execute(q, k, v, np.array([pos], np.int64))
        want_causal = _attend(q[0], k_hist, v_hist, np.arange(pos, pos + s))
        want_full = _attend(q[0], k_hist, v_hist, np.full(s, pos + s - 1), scale=0.25)
        np.testing.assert_allclose(causal[0], want_causal, rtol=TOL, atol=TOL, err_msg=f"causal, {s} rows at {pos}")
        np.testing.assert_allclose(full[0], want_full, rtol=TOL, atol=TOL, err_msg=f"non-causal, {s} rows at {pos}")
        pos += s


# -- et_vk.sdpa: an additive f16 mask, grouped heads -------------------------------------------------


class VkSdpa(torch.nn.Module):
    def forward(self, q, k, v, mask, k1, v1):
        vk = torch.ops.et_vk
        return vk.sdpa.default(q, k, v, mask, None), vk.sdpa.default(q, k1, v1, None, 0.3)


async def test_et_vk_sdpa(load_pte):
    pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")
    s_dim = torch.export.Dim("S", min=1, max=7)
    shapes = ((2, 3, 7, 12), (2, 3, 11, 12), (2, 3, 11, 12), (7, 11), (2, 1, 11, 12), (2, 1, 11, 12))
    sample = tuple(torch.randn(s).half() for s in shapes)
    dynamic = ({2: s_dim}, None, None, {0: s_dim}, None, None)
    pte, module = export_pte("f16att_vk_sdpa", lambda: VkSdpa().half(), sample, dynamic)
    model = await load_pte(pte)
    assert model.precision == "f16"
    calls = dynamic_shape_calls(sample, dynamic, n=3, seed=4)
    # against fp32 eager of the same f16 values (the CPU's fp16 attention rounds every step)
    wide = copy.deepcopy(module).float()
    with torch.no_grad():
        expected = [[o.numpy() for o in wide(*(torch.from_numpy(np.asarray(a, np.float32)) for a in c))] for c in calls]
    await assert_matches_eager(model, None, calls, expected=expected, atol=TOL, rtol=TOL)


# -- RoPE ---------------------------------------------------------------------------------------------


class LlamaRope(torch.nn.Module):
    def forward(self, xq, xk, freqs_cos, freqs_sin):
        return torch.ops.et_vk.apply_rotary_emb(xq, xk, freqs_cos, freqs_sin)


class InterleavedRope(torch.nn.Module):
    def forward(self, x, freqs_cis):
        return torch.ops.et_vk.apply_rotary_emb_interleaved(x, freqs_cis)


# kind -> (module, input shapes at the maximum, each input's position axis)
ROPES = {
    "llama": (LlamaRope, ((1, 9, 5, 14), (1, 9, 3, 14), (9, 7), (9, 7)), (1, 1, 0, 0)),
    "interleaved": (InterleavedRope, ((3, 9, 14), (1, 9, 7, 2)), (1, 1)),
}


@pytest.mark.parametrize("kind", ROPES)
async def test_rope(load_pte, kind):
    pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")
    make, shapes, axes = ROPES[kind]
    s_dim = torch.export.Dim("s", min=1, max=9)
    dynamic = tuple({axis: s_dim} for axis in axes)
    sample = tuple(torch.randn(s).half() for s in shapes)
    pte, module = export_pte(f"f16att_rope_{kind}", lambda: make().half(), sample, dynamic)
    model = await load_pte(pte)
    assert model.precision == "f16"
    calls = dynamic_shape_calls(sample, dynamic, n=4, seed=3)
    await assert_matches_eager(model, module, calls, atol=TOL, rtol=TOL)


async def test_rope_hf(load_pte):
    """Rotate-half over the first 6 of 10 dims (4 pass through), the tables read at a live position."""
    sample = (torch.randn(1, 5, 3, 10).half(), torch.randn(1, 5, 1, 10).half(), torch.tensor([3]))
    s_dim = torch.export.Dim("s", min=1, max=16)
    pte, module = export_pte("f16att_rope_hf", lambda: HfRope(6).half(), sample, ({1: s_dim}, {1: s_dim}, None))
    model = await load_pte(pte)
    assert model.precision == "f16"
    rng = np.random.default_rng(6)
    for s, pos in [(5, 3), (16, 16), (1, 31), (16, 0), (2, 29)]:
        args = (*_half(*(rng.standard_normal((1, s, h, 10)) for h in (3, 1))), np.array([pos], np.int64))
        got = await model.execute(*args)
        for k, (g, w) in enumerate(zip(got, eager(module, *args))):
            np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL, err_msg=f"s={s} pos={pos} output {k}")


# -- embedding: an odd table (37 x 11 f16 values) --------------------------------------------------------


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(37, 11)

    def forward(self, tokens):
        return self.table(tokens)


async def test_embedding_is_exact(load_pte):
    sample = (torch.randint(0, 37, (1, 9)),)
    dynamic = ({1: torch.export.Dim("s", min=1, max=9)},)
    pte, module = export_pte("f16att_embedding", lambda: Embed().half(), sample, dynamic)
    model = await load_pte(pte)
    assert model.precision == "f16"
    calls = [(np.random.default_rng(n).integers(0, 37, (1, n)),) for n in (9, 1, 4, 9)]
    await assert_matches_eager(model, module, calls, atol=0, rtol=0)
