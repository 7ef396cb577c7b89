"""`ar.load`'s progress callback and its warm-up: every kernel compiled and dispatched once."""

import threading

import numpy as np
import pytest

import async_runtime as ar
from async_runtime.progress import PHASES

from .models import block_dynamic

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("adapter")]


async def test_load_reports_its_phases_in_order_on_the_loop_thread(tmp_path):
    pte, _ = block_dynamic()
    path = tmp_path / "block.pte"
    path.write_bytes(pte)
    events, loop_thread = [], threading.get_ident()

    def progress(phase, done, total):
        assert threading.get_ident() == loop_thread
        events.append((phase, done, total))

    async with await ar.load(path, progress=progress) as model:
        phases = [phase for phase, _, _ in events]
        assert sorted(set(phases), key=phases.index) == list(PHASES)
        assert phases == sorted(phases, key=PHASES.index)  # each phase once, in order
        for phase in PHASES:
            steps = [(done, total) for p, done, total in events if p == phase]
            assert steps[0][0] == 0 and steps[-1][0] == steps[-1][1], (phase, steps)
            assert [d for d, _ in steps] == sorted(d for d, _ in steps), (phase, steps)
            assert {t for _, t in steps} == {steps[-1][1]}, (phase, steps)
        totals = {p: t for p, _, t in events}
        assert totals["read"] == len(pte)
        assert totals["compile"] == totals["warm-up"] == len(model._pipelines) > 0
        (out,) = await model.execute(np.zeros((1, 3, 15), np.float32))  # and it runs
        assert out.shape[1] == 3


async def test_bytes_load_reports_the_read_as_one_step_and_a_bad_callback_is_refused():
    pte, _ = block_dynamic()
    events = []
    async with await ar.load(pte, progress=lambda *e: events.append(e)):
        assert events[0] == ("read", 1, 1)
    with pytest.raises(TypeError, match="progress must be callable"):
        await ar.load(pte, progress="yes")
