"""ExecuTorch's capacity rule: an input takes any shape of its rank whose element count fits its
buffer, dims not declared dynamic included, as ExecuTorch's own runtime allows (`resize_tensor`).
An op not audited for it (`@op(capacity=True)`) keeps every dim of its tensors within the exported
maximum. Too many elements, in an input or in an intermediate, is an InputError naming the inputs
and what was expected, and the model and its sessions keep working."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import async_runtime as ar
from async_runtime.testing import assert_matches_eager

from .exporting import export_pte
from .models import mlp_dynamic

pytestmark = pytest.mark.usefixtures("adapter")

SAMPLE = (torch.randn(3, 5, 13, 11),)  # only the batch is dynamic: the maximum is [5, 5, 13, 11]
CAPACITY = 5 * 5 * 13 * 11  # 3575 elements


class PoolAndShapes(torch.nn.Module):
    """Capacity-safe ops only: scalar arithmetic, relu, max and avg pooling, permute, cat."""

    def forward(self, x):
        m = F.max_pool2d(torch.relu(x * 1.5 - 0.25), kernel_size=(2, 3), stride=(1, 2))
        a = F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True).permute(0, 1, 3, 2)
        return m, torch.cat([a, a * 2.0], dim=1)


def pool_and_shapes():
    return export_pte("capacity_pool", PoolAndShapes, SAMPLE, dynamic_shapes=({0: torch.export.Dim("batch", max=5)},))


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


# Non-dynamic dims both smaller and larger than exported, each within the 3575 elements.
SHAPES = [(2, 7, 13, 11), (1, 3, 29, 17), (5, 5, 13, 11), (1, 1, 5, 7), (3, 11, 9, 7), (2, 3, 23, 19), (2, 5, 13, 11)]


async def test_non_dynamic_dims_smaller_and_larger_match_eager(load_pte):
    pte, module = pool_and_shapes()
    model = await load_pte(pte)
    assert all(np.prod(s) <= CAPACITY for s in SHAPES)
    calls = [(rand(*s),) for s in SHAPES]
    await assert_matches_eager(model, module, calls, atol=1e-5, seed=7)  # in order, shuffled, then the first again
    async with model.session() as session:  # another session, from the initial state
        await assert_matches_eager(session, module, calls[::-1], atol=1e-5, seed=11)


async def test_too_many_elements_is_an_input_error_and_the_model_keeps_working(load_pte):
    """An input over its capacity, then an input within it whose pooled intermediate is not: each an
    InputError saying what was expected, leaving the model and a session as they were."""
    pte, module = pool_and_shapes()
    model = await load_pte(pte)
    session = model.session()
    good = (rand(3, 11, 9, 7),)
    for runner in (model, session):
        await assert_matches_eager(runner, module, [good], atol=1e-5)
        with pytest.raises(ar.InputError, match=r"input 0: shape \[5, 5, 13, 12\] has 3900 elements, its buffer holds 3575"):
            await runner.execute(rand(5, 5, 13, 12))
        # 3250 elements fit, but the avg pool's output [5, 65, 2, 3] has 1950, its buffer 1050
        overflow = r"these inputs \(input 0 \[5, 65, 2, 5\]\) do not fit the model: aten.avg_pool2d.default: .*shape \[5, 65, 2, 3\] has 1950 elements, its buffer holds 1050 \(exported shape \[5, 5, 7, 6\]\)"
        with pytest.raises(ar.InputError, match=overflow):
            await runner.execute(rand(5, 65, 2, 5))
        await assert_matches_eager(runner, module, [good, (rand(1, 3, 29, 17),)], atol=1e-5)
    await session.aclose()


async def test_an_op_not_audited_for_capacity_keeps_dims_within_the_maximum(load_pte):
    """The MLP's linear keeps its input within [23, 13] per dim: [3, 17] has few enough elements but
    is refused, naming the dim and the op; the next call works."""
    pte, module = mlp_dynamic()
    model = await load_pte(pte)
    with pytest.raises(ar.InputError, match=r"input 0: dim 1 is 17, expected 1..13 \(shape \[3, 17\]; .* keeps every dim within the exported maximum \[23, 13\]\)"):
        await model.execute(rand(3, 17))
    await assert_matches_eager(model, module, [(rand(4, 13),)], atol=1e-4)
