"""index_put (x.index_put, index_copy, index_add, a KV-cache write `cache[:, :, pos] = k`), scatter,
scatter with a value, scatter_add and masked_scatter: ops that ExecuTorch runs as portable kernels,
outside its Vulkan delegates. Each compared with torch eager on the same inputs, at prime and odd
sizes; duplicate indices where the op sums (in index order, as torch's CPU kernels), negative
indices where torch takes them; a dynamic dim at several live sizes in random order. Refused
inputs fail with a message naming what was wrong."""

import numpy as np
import pytest
import torch

from async_runtime.errors import UnsupportedOperatorError
from async_runtime.program.graph import COPY_INTO, link
from async_runtime.program.pte import read_program
from async_runtime.testing import assert_matches_eager, dynamic_shape_calls
from pte_wgpu.resize.values import Scalar, Tensor, ValueList

from .exporting import eager, export_pte, without_delegates
from .hooks import Graph, resize
from .test_more_ops import _kernel_calls

pytestmark = pytest.mark.anyio

put = torch.ops.aten.index_put.default  # takes None entries, which Tensor.index_put does not
OPS = {"aten::index_put.out", "aten::scatter.src_out", "aten::scatter.value_out", "aten::scatter_add.out", "aten::masked_scatter.out"}


class Scatters(torch.nn.Module):
    """x, y float [5, 7, 3]; i int64 [3] (distinct rows of x, negative ones among them); d int64 [6]
    (columns of x with duplicates, -1 among them naming column 6 again); s int64 [4, 5, 2] (distinct
    along dim 1, index smaller than x in every dim); a int64 [5, 6, 3] (duplicates along dim 1);
    m bool [5, 7, 3]; n int32 [5, 4]."""

    def forward(self, x, y, i, d, s, a, m, n):
        rows, cols = torch.tensor([[4], [1]]), torch.tensor([0, 6, -2, 3])  # broadcast to [2, 4], distinct pairs
        cols_dup = d[:4]
        nonneg = torch.remainder(d, 7)  # index_add and index_copy take no negative index
        distinct = torch.tensor([5, 0, 3, 1])
        return (
            x.index_put((i,), y[:3]),  # one index tensor
            x.index_put((i,), y[0, :, :1]),  # values broadcast to the indexed shape [3, 7, 3]
            x.index_put((i,), y[:3], accumulate=True),
            x.index_put((rows, cols), y[0, :4]),  # two broadcast index tensors, adjacent: [2, 4, 3]
            x.index_put((rows, cols_dup), y[0, :4], accumulate=True),
            put(x, [None, d], y[:, :6], True),  # a None entry first: duplicates summed
            put(x, [i[:1], None, torch.tensor([2, -1, 2, 0])], y[:4, :, 0], True),  # apart: B first, [4, 7]
            x.index_copy(1, distinct, y[:, :4]),
            x.index_add(1, nonneg, y[:, :6]),
            torch.scatter(x, 1, s, y),
            torch.scatter(x, 2, torch.remainder(s, 3), -2.5),
            torch.scatter_add(x, 1, a, y),
            torch.scatter_add(x, 0, torch.remainder(a[:3, :2], 5), y),
            torch.scatter_add(n, 1, torch.remainder(d[:4], 4)[None, :].expand(5, -1), n * 3 + 1),  # int32 sums
            n.index_put((torch.remainder(d, 5),), n[0], accumulate=True),
            x.masked_scatter(m, y),
            x.masked_scatter(m[0, :, :1], y * 2),  # the mask broadcast to x's shape
        )


def _scatters_sample():
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(5, 7, 3, generator=g), torch.randn(5, 7, 3, generator=g)
    i = torch.tensor([-1, 0, 2])
    d = torch.tensor([3, -1, 3, 0, 6, 3])
    s = torch.argsort(torch.rand(4, 7, 2, generator=g), dim=1)[:, :5]
    a = torch.randint(0, 7, (5, 6, 3), generator=g)
    m = torch.rand(5, 7, 3, generator=g) > 0.4
    n = torch.randint(-50, 50, (5, 4), generator=g, dtype=torch.int32)
    return x, y, i, d, s, a, m, n


async def test_index_put_scatter_and_masked_scatter_without_delegates(load_pte):
    """Every case of Scatters as a portable kernel, equal to torch eager; the sums in index order."""
    module, sample = Scatters(), _scatters_sample()
    pte = without_delegates("scatters", module, sample)
    assert OPS <= _kernel_calls(pte), sorted(_kernel_calls(pte))
    inputs = [t.numpy() for t in sample]
    outs = await (await load_pte(pte)).execute(*inputs)
    for k, (out, want) in enumerate(zip(outs, eager(module, *inputs), strict=True)):
        assert out.dtype == want.dtype and out.shape == want.shape, f"output {k}"
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6, err_msg=f"output {k}")


class CacheWrites(torch.nn.Module):
    """A buffer that each call writes rows of (a KV cache's update, `cache[:, :, pos] = k`) and one
    that each call adds into (index_put with accumulate, two rows named twice)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 3, 17, 5))
        self.register_buffer("sums", torch.zeros(7, 5))

    def forward(self, k, pos):
        self.cache[:, :, pos] = k
        self.sums.index_put_((torch.tensor([1, 4, 1, 6, 4]),), k[0, 0, :1].expand(5, 5) * torch.arange(1.0, 6.0)[:, None], accumulate=True)
        return self.cache * 1.0, self.sums + 0.0


@pytest.mark.parametrize("reinplace", [False, True], ids=["copied_back", "in_place"])
async def test_buffer_updates_persist_per_session(load_pte, reinplace):
    """A program's buffers updated by index_put: copied back into the buffer (aten::copy_), or,
    after ExecuTorch's reinplace pass, written in place (aten::index_put_); the copied-back form
    runs in place too (no whole copy of a buffer a step). Two sessions, each call at other
    positions: every output equal to the eager module's after the same calls, and each session's
    buffers its own."""
    g = torch.Generator().manual_seed(4)
    calls = [(torch.randn(1, 3, 3, 5, generator=g), torch.tensor(p)) for p in ([2, 3, 4], [0, 16, 9], [5, 6, 1])]
    pte = without_delegates(f"cache_writes_{reinplace}", CacheWrites(), calls[0], reinplace=reinplace)
    assert ("aten::index_put_" in _kernel_calls(pte)) == reinplace
    linked = link(read_program(pte).method("forward"))
    assert [name for name, _ in linked.calls if name.startswith("aten::index_put")] == ["aten::index_put_"] * 2
    assert all(args[0] == args[1] for name, args in linked.calls if name == COPY_INTO)
    model = await load_pte(pte)
    async with model.session() as first, model.session() as second:
        for session, order in ((first, calls), (second, calls[::-1])):
            module = CacheWrites()
            for k, pos in order:
                got = await session.execute(k.numpy(), pos.numpy())
                for out, want in zip(got, module(k, pos), strict=True):
                    np.testing.assert_allclose(out, want.numpy(), rtol=1e-6, atol=1e-6)


class HalfScatters(torch.nn.Module):
    def forward(self, x, y, d, a, m):
        return (
            put(x, [None, d], y[:, :6], True),
            x.index_put((d[3:],), y[:3]),  # distinct rows: which duplicate wins is left open, as torch leaves it
            torch.scatter_add(x, 1, a, y),
            torch.scatter(x, 2, torch.remainder(a[:, :, :1], 3), 1.5),
            x.masked_scatter(m, y),
        )


@pytest.mark.usefixtures("half_adapter")
async def test_float16_sums_round_as_torch(load_pte):
    """On f16 storage: index_put's accumulation rounds each sum to f16, scatter_add sums in f32 and
    rounds once, as torch's CPU kernels do (1000 + 0.3 + 0.3 - 1000 is 0.5 one way and 0.6 the
    other): exact."""
    module = HalfScatters()
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(5, 7, 3, generator=g).half(), torch.randn(5, 7, 3, generator=g).half()
    y[:, :4] = torch.tensor([1000.0, 0.3, 0.3, -1000.0])[:, None]
    d = torch.tensor([2, 2, 2, 2, 1, -1])
    a = torch.randint(0, 7, (5, 6, 3), generator=g)
    a[:, :4] = 2
    m = torch.rand(5, 7, 3, generator=g) > 0.5
    sample = (x, y, d, a, m)
    pte = without_delegates("scatters_f16", module, sample)
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    inputs = [t.numpy() for t in sample]
    outs = await model.execute(*inputs)
    for k, (out, want) in enumerate(zip(outs, eager(module, *inputs), strict=True)):
        assert out.dtype == np.float16, f"output {k}"
        np.testing.assert_array_equal(out, want, err_msg=f"output {k}")


S_MAX = 11
S = torch.export.Dim("S", min=1, max=S_MAX)


class LiveScatters(torch.nn.Module):
    """x [3, S, 7], y [3, S, 7], cache [1, 2, 11, 5], k [1, 2, S, 5], pos int64 [S] (distinct),
    idx int64 [5] (duplicates, into x's dim 2), sidx int64 [3, S, 4] (duplicates along dim 2), m bool
    [3, S, 7]."""

    def forward(self, x, y, cache, k, pos, idx, sidx, m):
        c = cache.clone()
        c[:, :, pos] = k  # a KV-cache write
        return (
            c,
            x.index_add(2, idx, y[:, :, :5]),
            torch.scatter_add(x, 2, sidx, y),
            torch.scatter(x, 2, sidx, 1.5),
            x.masked_scatter(m, y),
        )


LIVE_SAMPLE = (torch.randn(3, S_MAX, 7), torch.randn(3, S_MAX, 7), torch.randn(1, 2, S_MAX, 5), torch.randn(1, 2, S_MAX, 5),
               torch.arange(S_MAX), torch.tensor([6, 0, 6, 3, 6]), torch.randint(0, 7, (3, S_MAX, 4)), torch.rand(3, S_MAX, 7) > 0.5)
LIVE_SHAPES = ({1: S}, {1: S}, None, {2: S}, {0: S}, None, {1: S}, {1: S})


async def test_scatters_at_live_sizes(load_pte):
    """Exported with the VulkanPartitioner and a dynamic dim: the ops stay outside the delegate, and
    their hooks follow the live size (minimum, maximum and others, in random order)."""
    pte, module = export_pte("scatters_live", LiveScatters, LIVE_SAMPLE, LIVE_SHAPES)
    assert OPS - {"aten::scatter.src_out"} <= _kernel_calls(pte), sorted(_kernel_calls(pte))
    rng = np.random.default_rng(4)
    calls = []
    for x, y, cache, k, pos, idx, sidx, m in dynamic_shape_calls(LIVE_SAMPLE, LIVE_SHAPES, n=6, seed=4):
        pos = torch.from_numpy(rng.permutation(S_MAX)[: len(pos)])  # distinct positions: no write wins over another
        idx = rng.integers(0, 7, 5)
        idx[3] = idx[0]  # a duplicate
        calls.append((x, y, cache, k, pos, torch.from_numpy(idx), sidx, m))
    assert {len(c[4]) for c in calls} >= {1, S_MAX}
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-6, rtol=1e-6)


class ScatterOnly(torch.nn.Module):
    def forward(self, x, idx, src):
        return torch.scatter(x, 1, idx, src), torch.scatter(x, 1, idx, -1.0), torch.scatter_add(x, 1, idx, src)


async def test_scatters_take_any_shape_that_fits_their_buffers(load_pte):
    """The scatters compute everything from live dims (capacity=True): exported at x [4, 6], index
    [4, 3], src [4, 6] with no dynamic dim, they run at x [6, 4], index [5, 2] (distinct along dim 1)
    and src [6, 2]."""
    g = torch.Generator().manual_seed(7)
    sample = (torch.randn(4, 6, generator=g), torch.argsort(torch.rand(4, 6, generator=g), 1)[:, :3], torch.randn(4, 6, generator=g))
    module = ScatterOnly()
    pte = without_delegates("scatter_capacity", module, sample)
    model = await load_pte(pte)
    x, src = np.random.default_rng(7).standard_normal((2, 6, 4), dtype=np.float32)
    idx = np.argsort(np.random.default_rng(8).random((5, 4)), 1)[:, :2]
    for inputs in ((x, idx, src[:, :2].copy()), tuple(t.numpy() for t in sample)):
        outs = await model.execute(*inputs)
        for k, (out, want) in enumerate(zip(outs, eager(module, *inputs), strict=True)):
            np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6, err_msg=f"output {k}")


class MaskIndex(torch.nn.Module):
    def forward(self, x, m):
        return x.index_put((m,), torch.tensor(2.0))


async def test_a_boolean_mask_index_is_refused_at_load(load_pte):
    sample = (torch.randn(4, 5), torch.rand(4, 5) > 0.5)
    pte = without_delegates("index_put_mask", MaskIndex(), sample)
    with pytest.raises(UnsupportedOperatorError, match="bool index tensors"):
        await load_pte(pte)


# -- the hooks alone: no device -------------------------------------------------------------------


def test_index_put_hook_keeps_self_shape_and_refuses_values_that_do_not_broadcast():
    g = Graph()
    x, v = g.add(Tensor("float32", (5, 7, 3))), g.add(Tensor("float32", (7, 3)))
    i, none, acc = g.add(Tensor("int64", (4,))), g.add(Scalar(None)), g.add(Scalar(True))
    out = g.add(Tensor("float32", (5, 7, 3)))
    args = [x, g.add(ValueList((none, i))), v, acc, out]
    assert resize(g, "aten::index_put.out", args, {x: (5, 6, 3), v: (4, 1)}).dims[out] == (5, 6, 3)
    with pytest.raises(ValueError, match=r"values of shape \[7, 3\] do not broadcast to the indexed shape \[5, 4, 3\] of self \[5, 7, 3\]"):
        resize(g, "aten::index_put.out", args, {})


def test_scatter_hooks_refuse_an_index_larger_than_src_or_self():
    g = Graph()
    x, src = g.add(Tensor("float32", (5, 7))), g.add(Tensor("float32", (5, 7)))
    idx, dim = g.add(Tensor("int64", (5, 7))), g.add(Scalar(1))
    out = g.add(Tensor("float32", (5, 7)))
    args = [x, dim, idx, src, out]
    assert resize(g, "aten::scatter_add.out", args, {idx: (2, 3)}).dims[out] == (5, 7)
    with pytest.raises(ValueError, match=r"index of shape \[5, 7\] is larger than src \[5, 4\]"):
        resize(g, "aten::scatter.src_out", args, {src: (5, 4)})
    with pytest.raises(ValueError, match=r"index of shape \[5, 2\] is larger than .* self \[3, 7\] off dim 1"):
        resize(g, "aten::scatter_add.out", args, {x: (3, 7), idx: (5, 2)})


def test_masked_scatter_hook_refuses_a_mask_that_does_not_broadcast():
    g = Graph()
    x, m, src = g.add(Tensor("float32", (5, 7))), g.add(Tensor("bool", (5, 7))), g.add(Tensor("float32", (35,)))
    out = g.add(Tensor("float32", (5, 7)))
    with pytest.raises(ValueError, match=r"mask of shape \[5, 7\] does not broadcast to self's shape \[5, 3\]"):
        resize(g, "aten::masked_scatter.out", [x, m, src, out], {x: (5, 3)})
