"""`ar.load`'s progress callback, its warm-up (every kernel compiled and dispatched once) and the
staged uploads of its constants."""

import threading

import numpy as np
import pytest
import wgpu

import async_runtime as ar
from async_runtime import uploads
from async_runtime.device import open_device
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


async def test_staged_uploads_land_every_byte_through_the_reused_stages(monkeypatch):
    """Tensors of word counts odd and even, tensors that span several stages and more bytes than
    the ring holds (so each stage is mapped again after its copies), each at the start of its own
    buffer: every byte where it belongs. A size of part of a word is refused."""
    monkeypatch.setattr(uploads, "STAGE_BYTES", 1024)
    _, device, _ = await open_device()
    rng = np.random.default_rng(3)
    sizes = [4, 12, 1500, 1024, 8, 4100, 20, 1020, 2052, 4, 4096 + 12]  # 14,852 bytes through 4 stages of 1,024
    tensors = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
    targets = [device.create_buffer(size=n, usage=usage) for n in sizes]
    staged = uploads.StagedUploads(device)
    for target, data in zip(targets, tensors):
        staged.write(target, data)
    staged.finish()
    for target, data in zip(targets, tensors):
        assert (np.frombuffer(device.queue.read_buffer(target), np.uint8) == data).all(), data.size
    with pytest.raises(ValueError, match="an upload of 6 bytes: buffer copies move whole 4-byte words"):
        staged.write(targets[0], bytes(6))
