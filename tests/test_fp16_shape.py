"""float16 on f16 storage for the generic families: shape ops and casts (kernels/tensor/shape.py), creation
(creation.py), advanced indexing (indexing.py), flip/repeat/pad (rearrange.py), pixel shuffles and
unfold (spatial_copy.py), cumsum and any/all (scan.py) and the SymInt ops reading f16 tensors
(symint.py). Each module is `.half()` exported with the VulkanPartitioner (dynamic dims) and
compared with torch eager fp16 on the same inputs: exactly where the op only moves or converts
elements, within a stated tolerance for cumsum. The model must run in f16 (`model.precision`), and
once with `precision="f32"` (the widened fallback) against the same eager outputs."""

import numpy as np
import pytest
import torch

from async_runtime.storage import to_storage
from async_runtime.testing import assert_matches_eager, dynamic_shape_calls
from pte_wgpu.resize.values import IntList, Tensor

from .exporting import export_pte
from .hooks import Graph, resize
from .test_shape_ops import DynShapes

pytestmark = pytest.mark.usefixtures("adapter", "half_adapter")

S_MAX = 11
S = torch.export.Dim("S", min=1, max=S_MAX)
T = torch.export.Dim("T", min=1, max=S_MAX)


class Moves(DynShapes):
    """test_shape_ops' shape ops on x [3, S, 5] and y [3, T, 5] float16, then index_select, gather
    and index.Tensor (i int64 [4] into dim 2, g int64 [3, S, 2]) and casts to and from float16."""

    def forward(self, x, y, i, g):
        return (
            *super().forward(x, y),
            torch.index_select(x, 2, i) * 2,
            torch.gather(x, 2, g) * 2,
            x[:, :, i] * 2,  # aten.index.Tensor
            x.float() * 3,  # f16 -> f32
            (x * 2).to(torch.int32),  # f16 -> i32
            (x > 0).half() + 1,  # bool -> f16
            (x.float() * 3).half(),  # f32 -> f16, rounding at the store
            torch.round(x).bool(),  # f16 -> bool
        )


class Rearranges(torch.nn.Module):
    """flip, repeat, constant_pad_nd, pixel_shuffle/unshuffle and unfold on x [2, 8, S, 4]."""

    def forward(self, x):
        return (
            torch.flip(x, [0, 2]) * 2,
            x.repeat(2, 1, 3, 1) * 2,
            torch.nn.functional.pad(x, (1, 2, 0, 3), value=2.5) * 2,
            torch.nn.functional.pad(x, (-1, 2, 1, 0)) * 2,
            torch.nn.functional.pixel_shuffle(x, 2) * 2,
            torch.nn.functional.pixel_unshuffle(x[:, :, :2], 2) * 2,
            (x * 2).unfold(3, 2, 1) * 2,
        )


class Creates(torch.nn.Module):
    """Creation ops with float16 outputs at the live sizes of x [S, 3] float16, and scans."""

    def forward(self, x):
        n = x.shape[0]
        return (
            torch.full((n, 3), 0.1, dtype=torch.half) * x,
            torch.zeros_like(x) + x,
            torch.ones(n, 2, dtype=torch.half) * 3,
            torch.arange(n, dtype=torch.half) * 0.5,
            torch.cumsum(x, 0),
            torch.any(x > 1, 0).half() + x,
            torch.all(x > -1, 1).half() * 2,
            torch.any(torch.round(x), 1),  # over f16 elements
        )


def _rand(shape, rng):
    return (rng.standard_normal(shape) * 2).astype(np.float16)


def _moves():
    sample = (torch.randn(3, S_MAX, 5).half(), torch.randn(3, S_MAX, 5).half(), torch.tensor([4, 0, 3, 3]),
              torch.randint(0, 5, (3, S_MAX, 2)))  # fmt: skip
    return export_pte("f16gen_moves", lambda: Moves().half(), sample, ({1: S}, {1: T}, None, {1: S}))


def _moves_calls():
    rng = np.random.default_rng(7)
    i = np.array([4, 0, 3, 2], np.int64)
    calls = []
    for s, t in [(S_MAX, 1), (1, S_MAX), (5, 7), (S_MAX, S_MAX), (2, 3)]:
        g = rng.integers(0, 5, (3, s, 2)).astype(np.int64)
        calls.append((_rand((3, s, 5), rng), _rand((3, t, 5), rng), i, g))
    return calls


async def test_shape_ops_and_casts_on_f16_storage_are_exact(load_pte, kernel_variants):
    pte, module = _moves()
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    got = await model.execute(*_moves_calls()[0])
    assert [o.dtype for o in got][-5:] == [np.float32, np.int32, np.float16, np.float16, np.bool_]
    await assert_matches_eager(model, module, _moves_calls(), atol=0, rtol=0)


async def test_shape_ops_widened_to_f32_match_the_same_eager_outputs(load_pte):
    pte, module = _moves()
    model = await load_pte(pte, precision="f32")
    assert model.precision == "f32"
    await assert_matches_eager(model, module, _moves_calls(), atol=0, rtol=0)


async def test_rearranging_copies_on_f16_storage_are_exact(load_pte):
    sample = (torch.randn(2, 8, S_MAX + 1, 4).half(),)
    shapes = ({2: 2 * torch.export.Dim("H", min=1, max=(S_MAX + 1) // 2)},)
    pte, module = export_pte("f16gen_rearranges", lambda: Rearranges().half(), sample, shapes)
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    await assert_matches_eager(model, module, dynamic_shape_calls(sample, shapes, n=4, seed=2), atol=0, rtol=0)


async def test_creation_and_scans_with_f16_outputs(load_pte, kernel_variants):
    sample = (torch.randn(S_MAX, 3).half(),)
    pte, module = export_pte("f16gen_creates", lambda: Creates().half(), sample, ({0: S},))
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    rng = np.random.default_rng(5)
    calls = [(_rand((s, 3), rng),) for s in (S_MAX, 1, 6, 2)]
    # cumsum sums in f32 and rounds each prefix once, as torch's CPU kernel does: exact.
    await assert_matches_eager(model, module, calls, atol=0, rtol=0)


# -- the hooks alone: no device -------------------------------------------------------------------


def test_f16_copies_move_whole_words_and_packed_bytes_stay_excluded():
    g = Graph()
    x, out = g.add(Tensor("float16", (7, 3))), g.add(Tensor("float16", (7, 3)))
    assert resize(g, "move", [x, out], {}).grids == [(44, 1, 1)]  # 21 halves: 42 bytes, a word up
    assert resize(g, "aten.clone.default", [x, out], {x: (5, 3)}).grids[-1] == (32, 1, 1)  # 15: 30 bytes
    w, o = g.add(Tensor("uint8", (7, 3))), g.add(Tensor("uint8", (3, 7)))
    perm = g.add(IntList((1, 0)))
    with pytest.raises(NotImplementedError, match="packed uint8"):
        resize(g, "aten.permute_copy.default", [w, perm, o], {})


def test_odd_f16_constants_are_padded_to_a_word():
    """A bias of 5 halves is 10 bytes: uploaded as 12 (buffer writes are whole words)."""
    values = np.arange(5, dtype=np.float16) / 3
    data = to_storage(Tensor("float16", (5,)), values.tobytes(), "bias")
    assert data.nbytes == 12 and data.tobytes()[:10] == values.tobytes()
