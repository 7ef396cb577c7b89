"""The GPU-timestamp profiler (async_runtime/tools/profile.py): per-dispatch passes, and whole
steps timed as they run unprofiled."""

import time

import numpy as np
import pytest

from async_runtime.tools.profile import Profiler

from .test_linear_ops import _export, _inputs

pytestmark = pytest.mark.usefixtures("adapter")

NAME = "mm_dyn_split"  # a GEMM that splits K: a step of several dispatches


async def _profile(model, whole_steps, m):
    profiler = Profiler(model, whole_steps=whole_steps)
    session = model._default
    session.profiler = profiler
    walls = []
    try:
        for k in range(2):
            profiler.label_next_step(f"run {k}")
            t = time.perf_counter()
            (got,) = await model.execute(*_inputs(NAME, m, np.random.default_rng(1)))
            walls.append((time.perf_counter() - t) * 1e6)
    finally:
        session.profiler = None
    await profiler.collect()
    return profiler, got, min(walls)


async def test_whole_steps_and_each_dispatch(load_pte):
    """Per-dispatch mode times every dispatch the step runs, each in a pass of its own; whole-step
    mode one row, "step", a timing a step, from its first pass's start to its last's end. The
    results are the unprofiled step's."""
    model = await load_pte(_export(NAME)[0])
    if "timestamp-query" not in model.device_info.features:
        pytest.skip("no timestamp-query on this adapter")
    m = 67
    (want,) = await model.execute(*_inputs(NAME, m, np.random.default_rng(1)))
    running = sum(1 for i, d in enumerate(model.graph.dispatches) if d.shader and all(model._default.state.grids[i]))
    assert running >= 2  # the split GEMM and its reduce
    each, got, _ = await _profile(model, False, m)
    np.testing.assert_array_equal(got, want)
    table = each.op_table()
    assert sum(r["count"] for r in table) == 2 * running
    assert all(r["total_us"] > 0 for r in table)
    whole, got, wall_us = await _profile(model, True, m)
    np.testing.assert_array_equal(got, want)
    table = whole.op_table()
    assert [(r["op"], r["count"]) for r in table] == [("step", 2)]
    assert 0 < min(e - b for *_, b, e in whole.records) / 1e3 < wall_us  # (ns) within the execute that ran it
    assert whole.steps_labelled("run") == {0, 1}
    assert whole.steps_labelled("run 1") == {1} and not whole.steps_labelled("ru")  # whole words, not any prefix
