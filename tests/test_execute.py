"""End-to-end executes: torch-eager results, live bytes, statistics, input errors."""

import numpy as np
import pytest
import torch

import async_runtime as ar
from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

from .exporting import export_pte
from .models import EW_DYNAMIC, EW_SAMPLE, Elementwise, elementwise_dynamic

pytestmark = pytest.mark.usefixtures("adapter")


def rand(*shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


def elementwise_static():
    return export_pte("ew", Elementwise, [torch.randn(3, 5, 7), torch.randn(5, 1)])


async def test_static_elementwise_matches_eager_and_never_resizes(load_pte):
    pte, module = elementwise_static()
    model = await load_pte(pte)
    after_load = model.statistics()
    x, y = rand(3, 5, 7), rand(5, 1)
    stats = await assert_matches_eager(model, module, [(x, y)], atol=1e-5)  # one call, run 3 times
    assert stats.executes == 3
    assert stats.hook_calls == 0 and stats.resize_events == 0
    assert stats.buffer_allocations == after_load.buffer_allocations  # nothing allocated after load
    assert stats.bytes_up == 3 * (x.nbytes + y.nbytes) and stats.bytes_down == 3 * x.nbytes  # out: x's shape
    assert stats.submits == 3 and stats.readbacks == 3


async def test_dynamic_elementwise_at_live_shapes_in_random_order(load_pte):
    pte, module = elementwise_dynamic()
    calls = dynamic_shape_calls(EW_SAMPLE, EW_DYNAMIC, n=6, seed=7)
    model = await load_pte(pte)
    stats = await assert_matches_eager(model, module, calls, atol=1e-5)
    runs = [3] + [2] * (len(calls) - 1)  # in order, shuffled, and the first once more
    up = sum(r * (x.nbytes + y.nbytes) for r, (x, y) in zip(runs, calls))
    down = sum(r * x.nbytes for r, (x, _) in zip(runs, calls))  # the output has x's shape
    assert stats.bytes_up == up and stats.bytes_down == down  # only live bytes cross the bus
    assert stats.resize_events > 0 and stats.hook_calls > 0


async def test_shapes_seen_before_are_restored_as_the_hooks_compute_them(load_pte):
    pte, module = elementwise_dynamic()
    calls = dynamic_shape_calls(EW_SAMPLE, EW_DYNAMIC, n=5, seed=13)
    model, fresh = await load_pte(pte), await load_pte(pte)
    stats = await assert_matches_eager(model, module, calls, atol=1e-5)  # each call 2-3 times, shuffled
    assert stats.resize_reuses > 0 and stats.hook_calls > 0
    for x, y in calls[::-1] + calls:  # the states a fresh sweep computes, every time, for the same calls
        fresh._resized.clear()
        out_fresh = await fresh.execute(x, y)
        hooks = model.statistics().hook_calls
        out = await model.execute(x, y)
        assert model.statistics().hook_calls == hooks, "a shape seen before runs no hook"
        np.testing.assert_array_equal(out[0], out_fresh[0])
        a, b = model._default.state, fresh._default.state
        assert (a.dims, a.params, a.grids, a.symints) == (b.dims, b.params, b.grids, b.symints)
    assert fresh.statistics().resize_reuses == 0


async def test_same_shape_again_runs_no_hooks(load_pte):
    pte, _ = elementwise_dynamic()
    model = await load_pte(pte)
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
        (lambda: (rand(3, 10, 7), rand(10, 1)), r"shape \[3, 10, 7\] has 210 elements, its buffer holds 189"),
        (lambda: (rand(3, 5), rand(5, 1)), "rank 2"),
        (lambda: (np.ones((3, 5, 7), np.int32), rand(5, 1)), "dtype int32 given, expected float32"),
        (lambda: (rand(3, 0, 7), rand(0, 1)), "dim 1 is 0, expected at least 1"),
        (lambda: (rand(3, 5, 7), rand(4, 1)), "do not fit"),
    ],
)
async def test_bad_inputs_are_named_and_the_next_call_works(inputs, message, load_pte):
    pte, module = elementwise_dynamic()
    model = await load_pte(pte)
    with pytest.raises(ar.InputError, match=message):
        await model.execute(*inputs())
    await assert_matches_eager(model, module, [(rand(3, 6, 7), rand(6, 1))], atol=1e-5)


async def test_torch_tensors_and_file_objects_are_accepted(tmp_path):
    pte, module = elementwise_static()
    path = tmp_path / "ew.pte"
    path.write_bytes(pte)
    x, y = torch.randn(3, 5, 7), torch.randn(5, 1)
    for source in (str(path), path, pte):  # loaded by the helper, and closed
        await assert_matches_eager(source, module, [(x, y)], atol=1e-5)
    with open(path, "rb") as f:
        model = await ar.load(f)
    await model.aclose()
    with pytest.raises(ar.ClosedResourceError):
        await model.execute(x, y)
