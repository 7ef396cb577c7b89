"""End-to-end executes: torch-eager results, live bytes, statistics, input errors."""

import random

import numpy as np
import pytest
import torch

import async_runtime as ar

from .exporting import eager, export_pte
from .models import MLP, Block, Elementwise

pytestmark = pytest.mark.usefixtures("adapter")


def rand(*shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


def elementwise_static():
    return export_pte("ew", Elementwise, [torch.randn(3, 5, 7), torch.randn(5, 1)])


def elementwise_dynamic():
    s = torch.export.Dim("S", min=1, max=9)
    return export_pte("ew_dyn", Elementwise, [torch.randn(3, 9, 7), torch.randn(9, 1)], dynamic_shapes=({1: s}, {0: s}))


async def test_static_elementwise_matches_eager_and_never_resizes():
    pte, module = elementwise_static()
    async with await ar.load(pte) as model:
        after_load = model.statistics()
        x, y = rand(3, 5, 7), rand(5, 1)
        for _ in range(3):
            (out,) = await model.execute(x, y)
            np.testing.assert_allclose(out, eager(module, x, y)[0], atol=1e-5)
        stats = model.statistics()
        assert stats.executes == 3
        assert stats.hook_calls == 0 and stats.resize_events == 0
        assert stats.buffer_allocations == after_load.buffer_allocations  # nothing allocated after load
        assert stats.bytes_up == 3 * (x.nbytes + y.nbytes) and stats.bytes_down == 3 * out.nbytes
        assert stats.submits == 3 and stats.readbacks == 3


async def test_dynamic_elementwise_at_live_shapes_in_random_order():
    pte, module = elementwise_dynamic()
    sizes = [1, 9, 2, 7, 5, 3]
    random.Random(7).shuffle(sizes)
    async with await ar.load(pte) as model:
        up = down = 0
        for s in sizes + [s for s in sizes[:2]]:
            x, y = rand(3, s, 7), rand(s, 1)
            (out,) = await model.execute(x, y)
            assert out.shape == (3, s, 7)
            np.testing.assert_allclose(out, eager(module, x, y)[0], atol=1e-5)
            up += x.nbytes + y.nbytes
            down += out.nbytes
        stats = model.statistics()
        assert stats.bytes_up == up and stats.bytes_down == down  # only live bytes cross the bus
        assert stats.resize_events > 0 and stats.hook_calls > 0


async def test_same_shape_again_runs_no_hooks():
    pte, _ = elementwise_dynamic()
    async with await ar.load(pte) as model:
        x, y = rand(3, 4, 7), rand(4, 1)
        await model.execute(x, y)
        before = model.statistics()
        await model.execute(x, y)
        after = model.statistics()
        assert after.hook_calls == before.hook_calls and after.resize_events == before.resize_events


@pytest.mark.parametrize(
    "inputs, message",
    [
        (lambda: (rand(3, 5, 7),), "expected 2 inputs"),
        (lambda: (rand(3, 10, 7), rand(10, 1)), "dim 1 is 10, expected 1..9"),
        (lambda: (rand(3, 5), rand(5, 1)), "rank 2"),
        (lambda: (np.ones((3, 5, 7), np.int32), rand(5, 1)), "dtype int32 given, expected float32"),
        (lambda: (rand(3, 0, 7), rand(0, 1)), "dim 1 is 0, expected 1..9"),
        (lambda: (rand(3, 5, 7), rand(4, 1)), "do not fit"),
    ],
)
async def test_bad_inputs_are_named_and_the_next_call_works(inputs, message):
    pte, module = elementwise_dynamic()
    async with await ar.load(pte) as model:
        with pytest.raises(ar.InputError, match=message):
            await model.execute(*inputs())
        x, y = rand(3, 6, 7), rand(6, 1)
        (out,) = await model.execute(x, y)
        np.testing.assert_allclose(out, eager(module, x, y)[0], atol=1e-5)


async def test_torch_tensors_and_file_objects_are_accepted(tmp_path):
    pte, module = elementwise_static()
    path = tmp_path / "ew.pte"
    path.write_bytes(pte)
    x, y = torch.randn(3, 5, 7), torch.randn(5, 1)
    for source in (str(path), path, pte):
        async with await ar.load(source) as model:
            (out,) = await model.execute(x, y)
            np.testing.assert_allclose(out, eager(module, x.numpy(), y.numpy())[0], atol=1e-5)
    with open(path, "rb") as f:
        model = await ar.load(f)
    await model.aclose()
    with pytest.raises(ar.ClosedResourceError):
        await model.execute(x, y)
