"""Shape and memory ops (kernels/tensor/shape.py) end to end: export with the VulkanPartitioner, run on
WebGPU, compare exactly with torch eager. Odd and prime sizes; dynamic dims run at several live
sizes in random order, including their minimum and maximum."""

import numpy as np
import pytest
import torch

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls
from pte_wgpu.resize.values import IntList, Scalar, SymInt, Tensor, ValueList

from .exporting import export_pte
from .hooks import Graph, resize

S_MAX = 11


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


class StaticShapes(torch.nn.Module):
    """Every op with static shapes, including index_select and gather (no resize hooks upstream)."""

    def forward(self, x, i, g):
        a, b = torch.split(x, [2, 3], 2)
        return (
            x.permute(2, 0, 1) * 2,
            torch.index_select(x, 1, i) * 2,
            torch.gather(x, 2, g) * 2,
            torch.cat([x, a.sum(2, keepdim=True).expand(3, 7, 5)], 0) * 2,
            a * 2,
            b * 3,
            x[:, 2:7:3, 1:] * 2,
            x[:, -2] * 2,
            (x > 0).float() + x.to(torch.int32).float(),
            (x + 1).view(7, 3, 5) * 2,
        )


class DynShapes(torch.nn.Module):
    """Shape ops on a dynamic middle dim S; y has its own dynamic dim T for cat."""

    def forward(self, x, y):
        a, b = torch.split(x, [2, 3], 2)
        return (
            x.permute(2, 0, 1) * 2,
            (x + 1).view(3, -1) * 2,
            x[:, -1] * 2,
            torch.cat([x, y], 1) * 2,
            a * 2,
            b * 3,
            (x + 1).unsqueeze(0).squeeze(0).unsqueeze(-1) * 2,
            x[:, :, 1:4] * 2,
            (x > 0).float() + x.to(torch.int32).float(),
            (y[:, :1] * 2).expand(3, x.shape[1], 5) * 3,  # lands outside the delegate: aten::expand_copy.out
        )


class DynSlices(torch.nn.Module):
    """Slices and selects along the dynamic dim itself (end INT64_MAX, a step, a negative start)."""

    def forward(self, x):
        return (
            x[:, 1:] * 2,
            x[:, ::2] * 2,
            x[:, -2:] * 2,
            x[:, 1] * 2,
            (x[:, :, None] * 2).expand(-1, -1, 2, -1) * 3,
        )


def _static():
    x = torch.randn(3, 7, 5)
    return export_pte("shape_static", StaticShapes, [x, torch.tensor([6, 0, 3, 3]), torch.randint(0, 5, (3, 7, 2))])


S, T = torch.export.Dim("S", min=1, max=S_MAX), torch.export.Dim("T", min=1, max=S_MAX)
DYN_SAMPLE, DYN_SHAPES = (torch.randn(3, S_MAX, 5), torch.randn(3, S_MAX, 5)), ({1: S}, {1: T})
S3 = torch.export.Dim("S", min=3, max=S_MAX)  # the slices' `* 2` guards out the live size 2
SLICES_SAMPLE, SLICES_SHAPES = (torch.randn(3, S_MAX, 7),), ({1: S3},)


def _dynamic():
    return export_pte("shape_dyn", DynShapes, DYN_SAMPLE, dynamic_shapes=DYN_SHAPES)


def _dynamic_slices():
    return export_pte("shape_dyn_slices", DynSlices, SLICES_SAMPLE, dynamic_shapes=SLICES_SHAPES)


async def test_static_shape_ops_match_eager(load_pte):
    pte, module = _static()
    x = rand(3, 7, 5)
    i = np.array([6, 0, 3, 3], np.int64)
    g = np.random.default_rng(1).integers(0, 5, (3, 7, 2)).astype(np.int64)
    await assert_matches_eager(await load_pte(pte), module, [(x, i, g)], atol=0, rtol=0)


async def test_dynamic_shape_ops_at_live_sizes_in_random_order(load_pte):
    pte, module = _dynamic()
    calls = dynamic_shape_calls(DYN_SAMPLE, DYN_SHAPES, n=6, seed=3)  # S and T drawn apart
    await assert_matches_eager(await load_pte(pte), module, calls, atol=0, rtol=0)


async def test_dynamic_slices_along_the_dynamic_dim(load_pte):
    pte, module = _dynamic_slices()
    calls = dynamic_shape_calls(SLICES_SAMPLE, SLICES_SHAPES, n=5, seed=5)
    await assert_matches_eager(await load_pte(pte), module, calls, atol=0, rtol=0)


class QuadCopies(torch.nn.Module):
    """Copies that keep the last dim D whole: at D a multiple of 4 the strided copy moves vec4s."""

    def forward(self, x):
        return (
            x.permute(1, 0, 2) * 2,
            x[:, 1:] * 2,
            x[:, 1] * 2,
            torch.cat([x, x + 1], 0) * 2,
            (x * 8).to(torch.int32).float(),
        )


D = torch.export.Dim("D", min=1, max=12)
QUADS_SAMPLE, QUADS_SHAPES = (torch.randn(3, S_MAX, 12),), ({1: S3, 2: D},)


async def test_copies_of_whole_last_dims_move_vec4s(load_pte):
    pte, module = export_pte("shape_quads", QuadCopies, QUADS_SAMPLE, dynamic_shapes=QUADS_SHAPES)
    model = await load_pte(pte)
    calls = [(torch.from_numpy(rand(3, s, d, seed=s)),) for s, d in ((5, 12), (11, 1), (3, 8), (9, 7), (4, 4))]
    for (x,) in calls:
        await model.execute(x.numpy())
        grids = model._default.state.grids
        running = [d.shader or "" for i, d in enumerate(model.graph.dispatches) if all(grids[i])]
        quads = sum("src: array<vec4<" in s for s in running)  # cat: one a part; the casts: two
        assert quads == (7 if x.shape[2] % 4 == 0 else 0), (tuple(x.shape), quads)
    await assert_matches_eager(model, module, calls, atol=0, rtol=0)


class PermuteChains(torch.nn.Module):
    """ViT's attention output, three permutes in a row (two of them each other's inverse), and
    two permutes whose first another op also reads (kept)."""

    def forward(self, x):
        y = x * 2
        q = y.permute(0, 3, 1, 2)
        return y.permute(2, 0, 1, 3).permute(1, 2, 0, 3).permute(0, 2, 1, 3) + 1, q.permute(0, 2, 3, 1) - 1, q * 3


async def test_permutes_of_permutes_are_one_copy(load_pte):
    shapes = ({2: torch.export.Dim("N", min=1, max=13)},)
    pte, module = export_pte("shape_permute_chains", PermuteChains, (torch.randn(2, 3, 13, 8),), dynamic_shapes=shapes)
    model = await load_pte(pte)
    permutes = [name for name, _ in model.graph.calls if "permute" in name]
    assert len(permutes) == 3, permutes  # 5 in the file: the chain of three is one
    calls = [(torch.from_numpy(rand(2, 3, n, 8, seed=n)),) for n in (13, 1, 6, 11)]
    await assert_matches_eager(model, module, calls, atol=0, rtol=0)


# -- the hooks alone: no device -------------------------------------------------------------------


def test_view_resolves_symints_and_minus_one_and_copies_live_bytes():
    g = Graph()
    x, s = g.add(Tensor("float32", (11, 6))), g.add(SymInt())
    size = g.add(ValueList((s, g.add(Scalar(-1)), g.add(Scalar(3)))))
    out = g.add(Tensor("float32", (11, 2, 3)))
    state = resize(g, "aten.view_copy.default", [x, size, out], {x: (5, 6)}, {s: 5})
    assert state.dims[out] == (5, 2, 3) and state.grids == [(5 * 6 * 4, 1, 1)]
    with pytest.raises(ValueError, match="aten.view_copy.default"):
        resize(g, "aten.view_copy.default", [x, size, out], {x: (5, 6)}, {s: 4})


def test_packed_copies_round_bytes_up_to_words():
    g = Graph()
    w, out = g.add(Tensor("uint8", (7, 3))), g.add(Tensor("uint8", (7, 3)))
    assert resize(g, "et_vk.prepack.default", [w, out], {}).grids == [(24, 1, 1)]


def test_slice_clamps_symint_bounds_like_torch():
    g = Graph()
    x, start, end = g.add(Tensor("float32", (13, 3))), g.add(SymInt()), g.add(SymInt())
    args = [x, g.add(Scalar(0)), start, end, g.add(Scalar(2)), g.add(Tensor("float32", (13, 3)))]
    for (a, e), n in {(4, 9): 3, (-5, 2**63 - 1): 3, (0, 100): 5, (-100, 4): 2}.items():
        state = resize(g, "aten.slice_copy.Tensor", args, {x: (9, 3)}, {start: a, end: e})
        assert state.dims[args[-1]] == (len(range(9)[a:e:2]), 3) == (n, 3)
    with pytest.raises(ValueError, match="empty slice"):
        resize(g, "aten.slice_copy.Tensor", args, {x: (9, 3)}, {start: 9, end: 12})


def test_split_and_cat_check_live_shapes():
    g = Graph()
    x = g.add(Tensor("float32", (4, 9, 3)))
    outs = g.add(ValueList((g.add(Tensor("float32", (4, 2, 3))), g.add(Tensor("float32", (4, 7, 3))))))
    args = [x, g.add(IntList((2, 7))), g.add(Scalar(1)), outs]
    state = resize(g, "aten.split_with_sizes_copy.default", args, {x: (3, 9, 3)})
    assert [state.dims[o] for o in g.values[outs].items] == [(3, 2, 3), (3, 7, 3)]
    with pytest.raises(ValueError, match="split sizes"):
        resize(g, "aten.split_with_sizes_copy.default", args, {x: (3, 8, 3)})
    a, b = g.add(Tensor("float32", (3, 5))), g.add(Tensor("float32", (4, 5)))
    cat = [g.add(ValueList((a, b))), g.add(Scalar(0)), g.add(Tensor("float32", (7, 5)))]
    assert resize(g, "aten.cat.default", cat, {a: (2, 5)}).dims[cat[-1]] == (6, 5)
    with pytest.raises(ValueError, match="aten.cat.default: cannot concatenate"):
        resize(g, "aten.cat.default", cat, {a: (2, 4)})


def test_expand_takes_symint_sizes_and_rejects_bad_ones():
    g = Graph()
    x, s = g.add(Tensor("float32", (1, 3, 1))), g.add(SymInt())
    size = g.add(ValueList((g.add(Scalar(2)), s, g.add(Scalar(-1)), g.add(Scalar(5)))))
    args = [x, size, g.add(Scalar(False)), g.add(Tensor("float32", (2, 11, 3, 5)))]
    assert resize(g, "aten.expand_copy.default", args, {}, {s: 7}).dims[args[-1]] == (2, 7, 3, 5)
    with pytest.raises(ValueError, match="aten.expand_copy.default: cannot expand"):
        resize(g, "aten.expand_copy.default", args, {x: (2, 3, 1)}, {s: 7})
