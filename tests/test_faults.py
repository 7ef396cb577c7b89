"""Faults: a lost device, a kernel that does not compile, a cancelled load."""

import dataclasses
import gc
import json
import pathlib
import sys
import threading

import anyio
import numpy as np
import pytest
import torch
import wgpu

import async_runtime as ar
from pte_wgpu.kernels import OPS

from .exporting import export_pte
from .models import MLP

pytestmark = pytest.mark.usefixtures("adapter")
B_MAX = 23


def mlp_dynamic_batch():
    batch = torch.export.Dim("batch", min=1, max=B_MAX)
    return export_pte("mlp_dyn", MLP, [torch.randn(B_MAX, 13)], dynamic_shapes=({0: batch},))


def x_of(b):
    return np.random.default_rng(b).standard_normal((b, 13), dtype=np.float32)


def live_objects():
    gc.collect()
    counts = wgpu.diagnostics.object_counts.get_dict()
    return {k: v["count"] for k, v in counts.items() if k not in ("Adapter",)}


DESTROY_SCENARIO = r"""
import json, sys
import anyio, numpy as np
import async_runtime as ar

def x_of(b):
    return np.random.default_rng(b).standard_normal((b, 13), dtype=np.float32)

async def main():
    outcomes, later = [], []
    async with await ar.load(sys.stdin.buffer.read()) as model:
        sessions = [model.session() for _ in range(8)]
        await sessions[0].execute(x_of(5))

        async def stream(s, seed):
            for step in range(200_000):  # until the device is gone, however fast the GPU is
                try:
                    await s.execute(x_of(1 + (seed + step) % 23))
                    outcomes.append("ok")
                except ar.BrokenResourceError:
                    outcomes.append("broken")
                    return
                except Exception as e:
                    outcomes.append(type(e).__name__)
                    return

        async with anyio.create_task_group() as tg:
            for i, s in enumerate(sessions):
                tg.start_soon(stream, s, i)
            await anyio.sleep(float(sys.argv[2]))  # executes in flight
            model.device.destroy()
        for call in [*(s.execute for s in sessions), model.execute, None]:
            try:
                await (call or (await model.open_session()).execute)(x_of(3))
                later.append("ok")
            except ar.BrokenResourceError:
                later.append("broken")
            except Exception as e:
                later.append(type(e).__name__)
    print(json.dumps({"outcomes": outcomes, "later": later}))

anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.3])
async def test_a_destroyed_device_breaks_pending_and_later_calls_without_hanging(delay, anyio_backend):
    """In a child process (a hang inside the runtime's shielded readback cannot be cancelled from
    here): executes on 8 sessions, `model.device.destroy()` while they are in flight. Every call
    then ends in BrokenResourceError, the later ones too, and the process finishes."""
    pte, _ = mlp_dynamic_batch()
    code = [sys.executable, "-c", DESTROY_SCENARIO, anyio_backend, str(delay)]
    with anyio.fail_after(120):  # cancelling kills the child
        done = await anyio.run_process(code, input=pte, check=False, cwd=str(pathlib.Path(__file__).parent.parent))
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    outcomes, later = result["outcomes"], result["later"]
    assert set(outcomes) <= {"ok", "broken"}, outcomes  # nothing but results and BrokenResourceError
    assert "broken" in outcomes
    assert outcomes[outcomes.index("broken") :].count("ok") <= 8  # at most steps already read back
    assert set(later) == {"broken"}, later


def _break_shaders_of(name, monkeypatch):
    original = OPS[name]

    def broken(b):
        before = len(b.graph.dispatches)
        original(b)
        for i in range(before, len(b.graph.dispatches)):
            d = b.graph.dispatches[i]
            if d.shader is not None:
                b.graph.dispatches[i] = dataclasses.replace(d, shader=d.shader + "\nfn broken( { this is not WGSL }\n")

    monkeypatch.setitem(OPS, name, broken)


async def test_a_kernel_that_fails_to_compile_names_the_op_and_the_shader(monkeypatch):
    pte, _ = mlp_dynamic_batch()
    _break_shaders_of("aten.relu.default", monkeypatch)
    before = live_objects()
    with anyio.fail_after(60):
        with pytest.raises(ar.RuntimeFault) as info:
            await ar.load(pte)
    text = str(info.value)
    assert "aten.relu.default" in text and "failed to compile" in text
    assert "--- shader ---" in text and "this is not WGSL" in text and "@compute" in text
    assert info.value.__cause__ is not None  # the wgpu error, for its details
    del info  # its traceback holds the half-built model's frames
    await anyio.sleep(0.05)
    assert {k: n for k, n in live_objects().items() if n > before.get(k, 0) and k == "Buffer"} == {}  # the load freed its buffers
    monkeypatch.undo()
    async with await ar.load(pte) as model:  # and the next load works
        (out,) = await model.execute(x_of(4))
        assert out.shape == (4, 7)


async def test_a_failed_load_leaves_nothing_behind(monkeypatch):
    pte, _ = mlp_dynamic_batch()
    _break_shaders_of("aten.relu.default", monkeypatch)
    before = live_objects()
    with pytest.raises(ar.RuntimeFault):
        await ar.load(pte)
    await anyio.sleep(0.05)
    leftovers = {k: (before.get(k, 0), n) for k, n in live_objects().items() if n > before.get(k, 0)}
    assert leftovers == {}, f"a failed load left objects behind: {leftovers}"


@pytest.mark.parametrize("checkpoint", [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 10**6])
async def test_a_cancelled_load_leaves_nothing_behind(checkpoint):
    """Cancel `ar.load` at its n-th checkpoint (the runtime's own awaits: worker threads, the
    warm-up); afterwards no wgpu object it made is alive and no worker thread of it is busy."""
    pte, _ = mlp_dynamic_batch()
    before = live_objects()
    threads_before = threading.active_count()
    loaded = None
    with anyio.fail_after(120):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def load():
                    nonlocal loaded
                    loaded = await ar.load(pte)

                tg.start_soon(load)
                for _ in range(checkpoint):
                    await anyio.lowlevel.checkpoint()
                    if loaded is not None:
                        break
                scope.cancel()
    if loaded is not None:  # it finished first: the largest checkpoints
        await loaded.aclose()
        loaded = None
    await anyio.sleep(0.05)  # on trio the worker thread drops its last reference to the device a moment later
    left = {k: (before.get(k, 0), n) for k, n in live_objects().items() if n > before.get(k, 0)}
    assert left == {}, f"cancelled at checkpoint {checkpoint}: {left} left alive"
    await anyio.sleep(0)
    # anyio keeps idle worker threads for reuse: at most its pool, and none of them busy with us
    assert threading.active_count() <= threads_before + 4
    async with await ar.load(pte) as model:
        (out,) = await model.execute(x_of(2))
        assert out.shape == (2, 7)


# -- memory_budget -----------------------------------------------------------------------------------


async def test_memory_budget_refuses_a_load_that_does_not_fit_before_allocating():
    pte, _ = mlp_dynamic_batch()
    async with await ar.load(pte) as model:
        need = model.memory() + model._default.memory()  # the model's buffers + the default session
    before = live_objects()
    with pytest.raises(ar.MemoryBudgetError, match=r"budget"):
        await ar.load(pte, memory_budget=need - 1)
    await anyio.sleep(0.05)
    left = {k: n for k, n in live_objects().items() if n > before.get(k, 0) and k == "Buffer"}
    assert left == {}  # refused before any buffer was created (or they were all freed)
    # The warm-up's throwaway session is counted while it lives, so a load needs one session more
    # than it keeps (reported: the warm-up could run on the default session).
    enough = need + model._default.memory()
    async with await ar.load(pte, memory_budget=enough) as model:
        assert model.memory_budget == enough
        assert model.memory() + sum(s.memory() for s in model._sessions) <= need


# How wgpu-native reports a buffer the device has no memory for: NVIDIA's driver on an H100 gave
# the validation error (a wgpu-native 0.32 probe, allocating 4 GiB buffers until one failed).
DEVICE_OUT_OF_MEMORY = {
    "out_of_memory_error": lambda: wgpu.GPUOutOfMemoryError("Out of Memory"),
    "validation_error": lambda: wgpu.GPUValidationError("Validation Error\n\nCaused by:\n  In wgpuDeviceCreateBuffer\n    Not enough memory left.\n"),
}


@pytest.mark.parametrize("error", DEVICE_OUT_OF_MEMORY)
async def test_the_device_running_out_of_memory_at_load_is_a_memory_budget_error(monkeypatch, error):
    """A load the device cannot hold (no budget given) fails with MemoryBudgetError naming the
    buffer and its bytes, frees what it had allocated, and a model already loaded keeps working."""
    pte, _ = mlp_dynamic_batch()
    async with await ar.load(pte) as model:
        largest = max(b.size for b in model._buffers.values())
        before = live_objects()
        real = type(model.device).create_buffer

        def create_buffer(device, *, size, **kw):
            if size >= largest:
                raise DEVICE_OUT_OF_MEMORY[error]()
            return real(device, size=size, **kw)

        with monkeypatch.context() as m:
            m.setattr(type(model.device), "create_buffer", create_buffer)
            with pytest.raises(ar.MemoryBudgetError, match=rf"out of memory: .* needs {largest} bytes"):
                await ar.load(pte)
        await anyio.sleep(0.05)
        assert {k: n for k, n in live_objects().items() if n > before.get(k, 0) and k == "Buffer"} == {}
        (out,) = await model.execute(x_of(3))
        assert out.shape == (3, 7)
    async with await ar.load(pte) as again:
        assert (await again.execute(x_of(2)))[0].shape == (2, 7)


def test_other_buffer_validation_errors_are_not_out_of_memory():
    from async_runtime.model import is_out_of_memory

    assert all(is_out_of_memory(make()) for make in DEVICE_OUT_OF_MEMORY.values())
    assert not is_out_of_memory(wgpu.GPUValidationError("In wgpuDeviceCreateBuffer\n    Buffer size 8 is greater than the maximum 4"))


async def test_memory_budget_counts_sessions_and_refuses_one_too_many():
    pte, _ = mlp_dynamic_batch()
    async with await ar.load(pte) as model:
        per_session = model._default.memory()
        base = model.memory() + per_session
    async with await ar.load(pte, memory_budget=base + 2 * per_session) as model:
        a, b = model.session(), model.session()
        with pytest.raises(ar.MemoryBudgetError, match="budget"):
            model.session()
        with pytest.raises(ar.MemoryBudgetError, match="budget"):
            await model.open_session()
        await a.aclose()
        c = await model.open_session()  # a closed session's bytes come back
        (out,) = await c.execute(x_of(3))
        assert out.shape == (3, 7)
        await b.aclose()
        await c.aclose()
