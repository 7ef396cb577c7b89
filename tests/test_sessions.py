"""Sessions: concurrency with batched submits, cancellation, busy and closed resources."""

import gc
import pathlib
import random
import re

import anyio
import numpy as np
import pytest

import async_runtime as ar
from async_runtime.testing import assert_matches_eager

from .gpu_waits import record_gpu_waits_on_this_thread
from .models import BLOCK_S, block_dynamic

pytestmark = pytest.mark.usefixtures("adapter")
MAX_S = BLOCK_S.max


def plan_for(seed, steps=4):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, int(rng.integers(1, MAX_S + 1)), 15), dtype=np.float32) for _ in range(steps)]


def test_no_blocking_gpu_calls_in_the_runtime():
    """queue.read_buffer, *_sync and sync_wait block the event loop: banned in async_runtime/,
    except on lines that run in a worker thread and say so."""
    root = pathlib.Path(__file__).parent.parent / "async_runtime"
    banned = re.compile(r"read_buffer\(|(?<!\.run)_sync\(|sync_wait\(")  # anyio.to_thread.run_sync is fine
    offenders = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1) if banned.search(line) and "# worker thread" not in line]
    assert offenders == []


async def test_32_concurrent_sessions_match_each_session_alone(load_pte):
    pte, module = block_dynamic()
    model = await load_pte(pte)
    plans = [plan_for(seed) for seed in range(32)]
    alone = []
    async with model.session() as s:
        await assert_matches_eager(s, module, plans[0])  # a session alone gives eager's results
        for plan in plans:
            alone.append([(await s.execute(x))[0] for x in plan])
    results = [None] * 32

    async def stream(i):
        async with model.session() as s:
            results[i] = [(await s.execute(x))[0] for x in plans[i]]

    before = model.statistics()
    async with anyio.create_task_group() as tg:
        for i in range(32):
            tg.start_soon(stream, i)
    after = model.statistics()
    for i in range(32):
        for got, want in zip(results[i], alone[i]):
            np.testing.assert_array_equal(got, want)
    executes = after.executes - before.executes
    assert executes == 32 * 4
    assert after.submits - before.submits < executes  # concurrent steps shared submits


async def test_batching_off_gives_one_submit_per_step(load_pte):
    pte, _ = block_dynamic()
    model = await load_pte(pte, batch_submits=False)
    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(model.session().execute, plan_for(i, 1)[0])
    s = model.statistics()
    assert s.submits == s.executes == 4


async def test_two_executes_on_one_session_are_busy(load_pte):
    pte, _ = block_dynamic()
    model = await load_pte(pte)
    x = plan_for(0, 1)[0]
    errors = []

    async def call():
        try:
            await model.execute(x)
        except ar.BusyResourceError as e:
            errors.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        tg.start_soon(call)
    assert len(errors) == 1
    (out,) = await model.execute(x)  # and the session still works
    assert out.shape == x.shape


async def test_closed_session_and_model():
    pte, _ = block_dynamic()
    model = await ar.load(pte)
    s = model.session()
    await s.aclose()
    with pytest.raises(ar.ClosedResourceError):
        await s.execute(plan_for(0, 1)[0])
    await model.aclose()
    with pytest.raises(ar.ClosedResourceError):
        await model.execute(plan_for(0, 1)[0])
    with pytest.raises(ar.ClosedResourceError):
        model.session()


async def test_cancellation_storm_leaves_sessions_usable(load_pte):
    pte, module = block_dynamic()
    rng = random.Random(5)
    model = await load_pte(pte)
    sessions = [model.session() for _ in range(8)]
    cancelled = completed = 0

    async def worker(s, seed):
        nonlocal cancelled, completed
        local = random.Random(seed)
        for _ in range(125):  # 8 x 125 = 1,000 executes under random deadlines
            x = plan_for(local.randrange(10**6), 1)[0]
            with anyio.move_on_after(local.choice([0, 0.0005, 0.002, 0.01, 1])) as scope:
                await s.execute(x)
            cancelled += scope.cancelled_caught
            completed += not scope.cancelled_caught

    async with anyio.create_task_group() as tg:
        for i, s in enumerate(sessions):
            tg.start_soon(worker, s, rng.randrange(10**6))
    assert cancelled > 0 and completed > 0
    for i, s in enumerate(sessions):  # every session still gives the right answer
        await assert_matches_eager(s, module, plan_for(1000 + i, 1))


async def test_event_loop_keeps_ticking_during_load_and_execute(monkeypatch):
    """The event loop's thread calls nothing that waits for the GPU while a model loads and runs
    (each such call goes to a worker thread), and a ticker on the loop keeps ticking. A full
    garbage collection of this process's heap (torch, ExecuTorch) stops every thread for 130-330 ms
    here, a pause that is CPython's, not the runtime's: what lives before the load is frozen."""
    pte, _ = block_dynamic()
    waits, gaps = record_gpu_waits_on_this_thread(monkeypatch), []

    async def ticker():
        last = anyio.current_time()
        while True:
            await anyio.sleep(0.005)
            now = anyio.current_time()
            gaps.append(now - last)
            last = now

    gc.freeze()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            async with await ar.load(pte) as model:
                for _ in range(5):
                    await model.execute(plan_for(0, 1)[0])
            tg.cancel_scope.cancel()
    finally:
        gc.unfreeze()
    assert waits == [], f"the event loop's thread waited for the GPU in {sorted(set(waits))}"
    assert len(gaps) >= 3
    assert max(gaps) < 0.1, f"the loop stalled for {max(gaps) * 1e3:.0f} ms"


async def test_memory_budget_refuses_a_session_before_allocating():
    pte, _ = block_dynamic()
    async with await ar.load(pte) as probe:
        shared, per_session = probe.memory(), probe.session().memory()
    with pytest.raises(ar.MemoryBudgetError, match="budget"):
        await ar.load(pte, memory_budget=shared // 2)
    # room for the model, its default session and exactly one more session
    budget = shared + 2 * per_session + per_session // 2
    async with await ar.load(pte, memory_budget=budget) as model:
        first = model.session()
        allocated = model.statistics().buffer_allocations
        with pytest.raises(ar.MemoryBudgetError, match="a new session needs"):
            model.session()
        assert model.statistics().buffer_allocations == allocated  # nothing was allocated
        await first.aclose()
        second = model.session()  # the closed session's bytes are free again
        (out,) = await second.execute(plan_for(3, 1)[0])
        assert out.shape[2] == 15
