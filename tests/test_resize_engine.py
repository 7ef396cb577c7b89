"""The resize engine on its own: no device, no wgpu."""

import subprocess
import sys

import pytest

from pte_wgpu.resize import LiveState, Node, Plan, ResizeContext, broadcast_shapes, fold_grid, normalize_dim, numel_of, propagate_resize
from pte_wgpu.resize.engine import ResizeFailure, ShapeOverflow
from pte_wgpu.resize.values import Tensor


def test_importing_resize_does_not_import_wgpu():
    code = "import resize, sys; assert 'wgpu' not in sys.modules, 'wgpu imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shape_helpers():
    assert numel_of((3, 5, 7)) == 105 and numel_of(()) == 1
    assert normalize_dim(-1, 3) == 2 and normalize_dim(0, 0) == 0
    with pytest.raises(IndexError, match="dim 3 is out of range for rank 3"):
        normalize_dim(3, 3)
    assert broadcast_shapes((5, 1), (3, 1, 7)) == (3, 5, 7)
    with pytest.raises(ValueError):
        broadcast_shapes((2, 3), (4, 3))
    assert fold_grid(7) == (7, 1, 1) and fold_grid(0) == (0, 0, 0)
    x, y, _ = fold_grid(200_003)
    assert x <= 65535 and y <= 65535 and x * y >= 200_003


def _chain(n_ops, hook_log, bad_index=None):
    """A chain a -> t1 -> ... -> tn of ops that copy the live shape forward."""
    values = [Tensor("float32", (11, 4)) for _ in range(n_ops + 1)]

    def make(i):
        def hook(ctx):
            hook_log.append(i)
            ctx.set_dims(i + 1, ctx.dims(i))
            if i == bad_index:
                ctx.set_dims(0, (1, 4))  # writes a value whose reader already ran

        return hook

    nodes = [Node(f"op{i}", make(i), reads=(i,), writes=(i + 1,)) for i in range(n_ops)]
    plan = Plan(nodes, values)
    state = LiveState(len(values), 0, 0)
    state.dims = [(11, 4)] * len(values)
    return plan, state


@pytest.mark.anyio
async def test_sweep_runs_only_affected_hooks_in_order():
    log = []
    plan, state = _chain(5, log)
    ctx = ResizeContext(plan, state)
    await propagate_resize(plan, ctx, set())
    assert log == [] and ctx.hook_calls == 0  # nothing changed: nothing runs
    ctx.set_dims(0, (3, 4))
    await propagate_resize(plan, ctx, {0})
    assert log == [0, 1, 2, 3, 4] and state.dims[5] == (3, 4)
    log.clear()
    ctx = ResizeContext(plan, state)
    ctx.set_dims(0, (3, 4))  # the same shape again: not a change
    assert not ctx.changed_values


@pytest.mark.anyio
async def test_non_converging_hook_rolls_back():
    log = []
    plan, state = _chain(4, log, bad_index=2)
    before = list(state.dims)
    ctx = ResizeContext(plan, state)
    ctx.set_dims(0, (5, 4))
    with pytest.raises(ResizeFailure, match="did not converge"):
        await propagate_resize(plan, ctx, {0})
    assert state.dims == before


def test_live_shapes_fit_by_element_count_unless_an_op_bounds_their_dims():
    """ExecuTorch's capacity rule: any shape of the rank whose element count fits the buffer; a
    tensor of an op that is not capacity-safe (`Node.bounded`) also keeps each dim within its maximum."""
    plan, state = _chain(1, [])
    ctx = ResizeContext(plan, state)
    ctx.set_dims(0, (4, 11))  # a dim above its maximum, 44 elements of 44
    ctx.set_dims(0, (1, 43))
    assert state.dims[0] == (1, 43)
    with pytest.raises(ShapeOverflow, match="has 45 elements, its buffer holds 44"):
        ctx.set_dims(0, (3, 15))
    for dims, message in [((0, 4), "dim 0 is 0, expected at least 1"), ((44,), "rank 1, expected rank 2")]:
        with pytest.raises(ResizeFailure, match=message) as info:
            ctx.set_dims(0, dims)
        assert info.type is ResizeFailure  # not an overflow: a hook's mistake (ResizeError)
    assert state.dims[0] == (1, 43)
    values = [Tensor("float32", (11, 4)), Tensor("float32", (11, 4))]
    plan = Plan([Node("op", lambda ctx: None, reads=(0,), writes=(1,), bounded=(0, 1))], values)
    ctx = ResizeContext(plan, LiveState(2, 0, 0))
    ctx.set_dims(0, (7, 3))
    with pytest.raises(ShapeOverflow, match=r"dim 1 is 5, expected 1..4 .*op keeps every dim within the exported maximum"):
        ctx.set_dims(1, (7, 5))
    assert ctx.state.dims[1] is None


@pytest.mark.anyio
async def test_an_overflowing_output_names_its_op_and_rolls_back():
    """A hook whose output would not fit its buffer: ShapeOverflow naming the op, the state as before."""
    values = [Tensor("float32", (6,)), Tensor("float32", (6, 6))]

    def outer(ctx):
        (n,) = ctx.dims(0)
        ctx.set_dims(1, (n, n + 1))

    plan = Plan([Node("outer", outer, reads=(0,), writes=(1,))], values)
    state = LiveState(2, 0, 0)
    state.dims = [(5,), (5, 6)]
    ctx = ResizeContext(plan, state)
    ctx.set_dims(0, (6,))
    with pytest.raises(ShapeOverflow, match=r"outer: value 1: shape \[6, 7\] has 42 elements, its buffer holds 36"):
        await propagate_resize(plan, ctx, {0})
    assert state.dims == [(5,), (5, 6)]
