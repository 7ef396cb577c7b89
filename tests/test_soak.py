"""Soak: many executes at random live shapes across 8 concurrent sessions, then nothing has grown.

After a warm-up (every session has run, every batch size has been seen): the model's buffer
allocations stay where they were, wgpu's live object counts (`wgpu.diagnostics.object_counts`)
come back to where they were, and Python's traced memory (tracemalloc) stays flat. Results are
checked against torch eager at sampled steps.

`PTE_WGPU_SOAK_STEPS` sets the number of executes (default 10,000 per backend; RELIABILITY.md has the time
on lavapipe).

In a session of several files, tests/conftest.py runs this file in a pytest process of its own
from the first test on, niced below the other background work (`start_soak`), and the tests
here check that run's outcome: the soak (a minute of single-threaded work a backend) takes the
CPU the files before it leave idle.
"""

import gc
import os
import random
import sys
import time
import tracemalloc
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch
import wgpu

import async_runtime as ar

from .background import Background
from .exporting import eager, export_pte
from .models import MLP

pytestmark = pytest.mark.usefixtures("adapter")

STEPS = int(os.environ.get("PTE_WGPU_SOAK_STEPS", "10000"))  # ~2.5 min per backend on lavapipe
SESSIONS = 8
B_MAX = 23
CHECK_EVERY = 97  # steps whose result is compared with torch
WARM_UP = SESSIONS * 2 * B_MAX  # every session sees every batch size before the baseline
PY_GROWTH_LIMIT = 512 << 10  # bytes of traced Python memory that may appear after the warm-up
SAMPLE_EVERY = 1000  # executes between the traced-memory samples shown when the growth check fails


def mlp_dynamic_batch():
    batch = torch.export.Dim("batch", min=1, max=B_MAX)
    return export_pte("mlp_dyn", MLP, [torch.randn(B_MAX, 13)], dynamic_shapes=({0: batch},))


HERE = "PTE_WGPU_SOAK_HERE"  # set in start_soak's run: the soak runs in that process
_STARTED = {}


def start_soak(tmp_path_factory):
    """This file's tests in a pytest process of their own (nice 15), from now on; returns the
    Background run, which the tests here check (None in that run itself)."""
    if os.environ.get(HERE):
        return None
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", __file__]
    env = dict(os.environ, **{HERE: "1"})
    root = Path(__file__).parents[1]
    _STARTED["run"] = Background(cmd, tmp_path_factory.mktemp("soak"), cwd=root, nice=15, env=env)
    return _STARTED["run"]


def wgpu_counts():
    gc.collect()
    return {k: v["count"] for k, v in wgpu.diagnostics.object_counts.get_dict().items()}


async def test_soak_concurrent_sessions_at_random_shapes(anyio_backend):
    run = _STARTED.get("run")
    if run is None:  # alone, or in start_soak's run
        await soak()
        return
    result = await anyio.to_thread.run_sync(run.result)
    passed = f"PASSED tests/test_soak.py::test_soak_concurrent_sessions_at_random_shapes[{anyio_backend}]"
    assert passed in result.stdout, f"the soak's run (start_soak) did not pass:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"


async def soak():
    pte, module = mlp_dynamic_batch()
    rng = random.Random(2024)
    inputs = {b: np.random.default_rng(b).standard_normal((b, 13), dtype=np.float32) for b in range(1, B_MAX + 1)}
    wants = {b: eager(module, x)[0] for b, x in inputs.items()}
    checked = 0
    mismatches = []

    async with await ar.load(pte) as model:
        sessions = [await model.open_session() for _ in range(SESSIONS)]
        schedule = [[rng.randint(1, B_MAX) for _ in range(-(-STEPS // SESSIONS))] for _ in range(SESSIONS)]
        for k, plan in enumerate(schedule):  # the warm-up sees every size on every session
            plan[: 2 * B_MAX] = list(range(1, B_MAX + 1)) * 2
        total = sum(len(p) for p in schedule)
        done = 0
        baseline = {}
        memory = []

        async def stream(s, plan):
            nonlocal done, checked
            for step, b in enumerate(plan):
                (out,) = await s.execute(inputs[b])
                done += 1
                if out.shape != (b, 7):
                    mismatches.append(f"session {s.id} step {step}: shape {out.shape}, batch {b}")
                elif (done % CHECK_EVERY == 0 or step < 2) and not np.allclose(out, wants[b], atol=1e-4, rtol=1e-4):
                    mismatches.append(f"session {s.id} step {step}: batch {b} differs from torch")
                checked += done % CHECK_EVERY == 0
                if done % SAMPLE_EVERY == 0 and tracemalloc.is_tracing():
                    gc.collect()
                    memory.append(tracemalloc.get_traced_memory()[0])
                if step == 2 * B_MAX - 1:
                    await barrier.wait()

        class Barrier:
            """The streams meet after the warm-up; the last to arrive takes the baseline."""

            def __init__(self, n):
                self.n, self.event = n, anyio.Event()

            async def wait(self):
                self.n -= 1
                if self.n == 0:
                    baseline["allocations"] = model.statistics().buffer_allocations
                    baseline["wgpu"] = wgpu_counts()
                    tracemalloc.start()
                    baseline["python"] = tracemalloc.get_traced_memory()[0]
                    baseline["t"] = time.perf_counter()
                    baseline["done"] = done
                    self.event.set()
                else:
                    await self.event.wait()

        barrier = Barrier(SESSIONS)

        t0 = time.perf_counter()
        try:
            async with anyio.create_task_group() as streams:
                for s, plan in zip(sessions, schedule):
                    streams.start_soon(stream, s, plan)
            gc.collect()
            python_after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        elapsed = time.perf_counter() - t0
        steady = time.perf_counter() - baseline["t"]
        stats = model.statistics()
        counts_after = wgpu_counts()
        for s in sessions:
            await s.aclose()

    assert mismatches == []
    assert done == total >= STEPS and checked > 0
    assert stats.buffer_allocations == baseline["allocations"], "buffers were allocated after the warm-up"
    grown = {k: (baseline["wgpu"].get(k), n) for k, n in counts_after.items() if n > baseline["wgpu"].get(k, 0)}
    assert grown == {}, f"wgpu objects grew after the warm-up: {grown}"
    growth = python_after - baseline["python"]
    assert growth < PY_GROWTH_LIMIT, f"Python memory grew by {growth} bytes (samples {memory[:3]}..{memory[-3:]})"
    print(
        f"\nsoak: {done} executes on {SESSIONS} sessions in {elapsed:.1f} s "
        f"({(done - baseline['done']) / steady:.0f}/s steady), {stats.submits} submits, {checked} checked vs torch; "
        f"python growth {growth} B, wgpu {counts_after}"
    )
