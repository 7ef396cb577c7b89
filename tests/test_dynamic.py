"""Dynamic exports through the resize engine: live shapes, events, failures that keep the model."""

import dataclasses
import random

import numpy as np
import pytest
import torch

import async_runtime as ar

from .exporting import eager, export_pte
from .models import MLP, Block

pytestmark = pytest.mark.usefixtures("adapter")


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


def mlp_dynamic_batch():
    batch = torch.export.Dim("batch", min=1, max=23)
    return export_pte("mlp_dyn", MLP, [torch.randn(23, 13)], dynamic_shapes=({0: batch},))


def block_dynamic():
    s = torch.export.Dim("S", min=1, max=11)
    return export_pte("block_dyn", Block, [torch.randn(1, 11, 15)], dynamic_shapes=({1: s},))


async def test_mlp_over_a_dynamic_batch():
    pte, module = mlp_dynamic_batch()
    batches = [1, 23, 2, 17, 5, 11, 3, 23, 1]
    random.Random(3).shuffle(batches)
    async with await ar.load(pte) as model:
        for n in batches:
            x = rand(n, 13)
            (out,) = await model.execute(x)
            assert out.shape == (n, 7)
            np.testing.assert_allclose(out, eager(module, x)[0], atol=1e-4, rtol=1e-4)


async def test_block_with_delegates_around_non_delegated_ops():
    pte, module = block_dynamic()
    async with await ar.load(pte) as model:
        for s in [11, 1, 6, 2, 11, 7, 1]:
            x = rand(1, s, 15)
            (out,) = await model.execute(x)
            np.testing.assert_allclose(out, eager(module, x)[0], atol=1e-4, rtol=1e-4)
        stats = model.statistics()
        assert stats.submits == stats.executes == stats.readbacks == 7  # one submit for 3 delegates


async def test_resize_events_reach_subscribers():
    pte, _ = mlp_dynamic_batch()
    seen = []
    async with await ar.load(pte, on_resize=seen.append) as model:
        with model.resize_events() as events:
            await model.execute(rand(4, 13))
            await model.execute(rand(4, 13))  # same shape: no event
            await model.execute(rand(9, 13))
            got = [events.receive_nowait(), events.receive_nowait()]
        assert [(e.old, e.new) for e in got] == [((23, 13), (4, 13)), ((4, 13), (9, 13))]
        assert seen == got and got[0].session == 0 and got[0].input_index == 0
        assert model.statistics().resize_events == 2


async def test_a_non_converging_hook_gives_resize_error_and_keeps_the_state():
    pte, module = mlp_dynamic_batch()
    async with await ar.load(pte) as model:
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
