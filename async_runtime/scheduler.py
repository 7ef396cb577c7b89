"""The GPU owner: one task at a time encodes every ready step, submits once, reads back.

Sessions resize and upload their step themselves, then hand it here. Whichever task finds no
owner becomes the owner; it encodes all ready steps back to back into one command encoder (or one
per submit with batching off), submits once and awaits the readbacks, until its own step is done.
It then promotes the next waiting step's task to owner, so no background task is needed and every
caller's task does its share. For a model that batches ragged (async_runtime.batching), the owner
runs passes over all ready steps instead, each pass finishing some of them. Everything after the
hand-over is shielded: a cancelled caller's step still completes, so a session is never left
half-updated. anyio's shield stops anyio's (and trio's) cancellation; a native asyncio
`Task.cancel()` from code outside anyio (Ray Serve cancels a request's task that way when its
client leaves) would still break through it, so on asyncio the hand-over runs in a task of its
own that the caller waits for, cancelled or not.
"""

import asyncio

from dataclasses import dataclass, field

import anyio

from .backend import device_gone
from .encoding import Pieces
from .errors import BrokenResourceError, InputError, ResizeError

COALESCE_CHECKPOINTS = 2  # event-loop turns a ragged pass waits for more steps to arrive
LOST_CHECK_S = 0.05  # how often a pending readback checks that its device still exists


@dataclass(eq=False)
class Step:
    session: object
    wake: anyio.Event = field(default_factory=anyio.Event)
    done: bool = False
    reads: list = None
    outputs: list = None
    error: BaseException = None


class Scheduler:
    def __init__(self, model, batching=True):
        self.model = model
        self.batching = batching
        self._ready = []
        self._owned = False
        self.broken = None  # the device error once the GPU failed

    async def run(self, step):
        if self.broken is not None:
            raise BrokenResourceError("the GPU device was lost") from self.broken
        if not _on_asyncio():
            return await self._run(step)
        handed_over = asyncio.ensure_future(self._run(step))
        cancelled = None
        with anyio.CancelScope(shield=True):  # anyio's own cancellation waits outside, as on trio
            while not handed_over.done():
                try:
                    await asyncio.shield(handed_over)
                except asyncio.CancelledError as e:  # a native cancel: the step completes first
                    cancelled = cancelled or e
        if cancelled is not None:
            raise cancelled
        return handed_over.result()

    async def _run(self, step):
        self._ready.append(step)
        with anyio.CancelScope(shield=True):
            if self._owned:
                await step.wake.wait()  # woken when done, or when promoted to owner
            if not step.done:
                self._owned = True
                if not _on_asyncio():
                    # trio runs this task until it waits, and a map that is already done (Dawn
                    # resolves one at once) never waits: let the tasks ready now add their steps to
                    # this submit, and see this session busy (asyncio runs _run as a task of its own)
                    await anyio.lowlevel.checkpoint()
                while not step.done:
                    if self.model._batcher is not None:
                        await self._ragged_pass()
                        continue
                    n = len(self._ready) if self.batching else 1
                    batch, self._ready = self._ready[:n], self._ready[n:]
                    await self._submit(batch)
                if self._ready:
                    self._ready[0].wake.set()  # promote the next waiting task to owner
                else:
                    self._owned = False
        if step.error is not None:
            raise step.error
        return step.outputs

    async def _submit(self, batch):
        model = self.model
        try:
            pieces = Pieces(model.device)
            for step in batch:
                step.reads = step.session._encode(pieces)
            pieces.finish()
            model._counters.submits += 1  # a pass, whatever its pieces
            for step in batch:
                step.session._counters.submits += 1
                # "READ" would first submit an empty command buffer, synchronously, and on lavapipe
                # that waits for the whole step on the event loop; the poll thread maps it anyway.
                await self._unless_lost(step.session._staging.map_async("READ_NOSYNC"))
                step.outputs = step.session._read_outputs(step.reads)
        except Exception as e:
            self.fail(e, batch + self._ready)
            self._ready = []
        finally:
            for step in batch:
                step.done = True
                step.wake.set()

    async def _ragged_pass(self):
        """One pass of the model's ragged batch (async_runtime.batching): its finished steps end."""
        for _ in range(COALESCE_CHECKPOINTS):  # the tasks of the last pass's steps send their next ones
            await anyio.lowlevel.checkpoint()
        pieces, refused = self.model._batcher.compose(self._ready)
        self._end(refused)  # no blocks for their rows: they fail alone
        if not pieces:
            return
        try:
            finished = await self.model._batcher.run_pass(pieces, self._unless_lost, lambda: len(self._ready) > len(pieces))
        except (InputError, ResizeError) as e:  # checked before the hand-over: a bug if seen here
            finished = [step for step, _, _ in pieces]
            for step in finished:
                step.error = e
        except Exception as e:
            self.fail(e, self._ready)
            self._ready = []
            return
        self._end(finished)

    def _end(self, steps):
        """These ready steps are done (their outputs or error set): wake their tasks."""
        for step in steps:
            self._ready.remove(step)
            step.done = True
            step.wake.set()

    async def _unless_lost(self, promise):
        """Await `promise` unless the device is lost first: a destroyed device's pending readback
        would wait forever, so every LOST_CHECK_S of waiting looks at the device
        (backend.device_gone). A timeout rather than a watcher task: one task per readback cost
        more host time than the rest of the hand-over."""
        device = self.model.device
        while True:
            with anyio.move_on_after(LOST_CHECK_S):
                return await promise
            if device_gone(device):
                raise BrokenResourceError("the GPU device was destroyed")

    def fail(self, error, steps=()):
        """The device is lost: these steps and every later call get BrokenResourceError. The error
        is kept without its traceback, whose frames hold the arrays and views a failed upload or
        readback was handing to the device (collected in any order at exit, Dawn's crashed)."""
        error.__traceback__ = None
        self.broken = error
        for step in steps:
            step.error = BrokenResourceError(f"the GPU failed: {error}")
            step.error.__cause__ = error
            step.done = True
            step.wake.set()


def _on_asyncio():
    try:
        return asyncio.current_task() is not None
    except RuntimeError:  # no asyncio loop runs this code: trio
        return False
