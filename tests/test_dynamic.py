"""Dynamic exports through the resize engine: live shapes, events, failures that keep the model."""

import dataclasses

import numpy as np
import pytest

import async_runtime as ar
from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

from .models import BLOCK_DYNAMIC, BLOCK_SAMPLE, MLP_DYNAMIC, MLP_SAMPLE, block_dynamic, mlp_dynamic

pytestmark = pytest.mark.usefixtures("adapter")


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


async def test_mlp_over_a_dynamic_batch(load_pte):
    pte, module = mlp_dynamic()
    model = await load_pte(pte)
    calls = dynamic_shape_calls(MLP_SAMPLE, MLP_DYNAMIC, n=5, seed=3)  # batch 1, 23, then random
    await assert_matches_eager(model, module, calls)


async def test_block_with_delegates_around_non_delegated_ops(load_pte):
    pte, module = block_dynamic()
    model = await load_pte(pte)
    calls = dynamic_shape_calls(BLOCK_SAMPLE, BLOCK_DYNAMIC, n=4)
    stats = await assert_matches_eager(model, module, calls)
    assert stats.submits == stats.executes == stats.readbacks == 9  # one submit for 3 delegates


async def test_resize_events_reach_subscribers(load_pte):
    pte, _ = mlp_dynamic()
    seen = []
    model = await load_pte(pte, on_resize=seen.append)
    with model.resize_events() as events:
        await model.execute(rand(4, 13))
        await model.execute(rand(4, 13))  # same shape: no event
        await model.execute(rand(9, 13))
        got = [events.receive_nowait(), events.receive_nowait()]
    assert [(e.old, e.new) for e in got] == [((23, 13), (4, 13)), ((4, 13), (9, 13))]
    assert seen == got and got[0].session == 0 and got[0].input_index == 0
    assert model.statistics().resize_events == 2


async def test_a_non_converging_hook_gives_resize_error_and_keeps_the_state(load_pte):
    pte, _ = mlp_dynamic()
    model = await load_pte(pte)
    x = rand(5, 13)
    (good,) = await model.execute(x)
    nodes = model.plan.nodes
    first_input = model.graph.inputs[0]
    index = next(i for i, n in enumerate(nodes) if first_input not in n.reads and n.reads)
    original = nodes[index]

    def bad_hook(ctx):
        original.hook(ctx)
        ctx.set_dims(first_input, (2, 13))  # writes a value its readers already used

    nodes[index] = dataclasses.replace(original, hook=bad_hook)
    with pytest.raises(ar.ResizeError, match="did not converge"):
        await model.execute(rand(8, 13))
    nodes[index] = original
    (again,) = await model.execute(x)  # the failed call left the previous state
    np.testing.assert_array_equal(again, good)
