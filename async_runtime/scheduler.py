"""The GPU owner: one task at a time encodes every ready step, submits once, reads back.

Sessions resize and upload their step themselves, then hand it here. Whichever task finds no
owner becomes the owner; it encodes all ready steps back to back into one command encoder (or one
per submit with batching off), submits once and awaits the readbacks, until its own step is done.
It then promotes the next waiting step's task to owner, so no background task is needed and every
caller's task does its share. Everything after the hand-over is shielded: a cancelled caller's
step still completes, so a session is never left half-updated.
"""

from dataclasses import dataclass, field

import anyio

from .errors import BrokenResourceError


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
        self._ready.append(step)
        with anyio.CancelScope(shield=True):
            if self._owned:
                await step.wake.wait()
            self._owned = True
            while not step.done:
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
            encoder = model.device.create_command_encoder()
            for step in batch:
                step.reads = step.session._encode(encoder)
            model.device.queue.submit([encoder.finish()])
            model._counters.submits += 1
            for step in batch:
                step.session._counters.submits += 1
                # "READ" would first submit an empty command buffer, synchronously, and on lavapipe
                # that waits for the whole step on the event loop; the poll thread maps it anyway.
                await step.session._staging.map_async("READ_NOSYNC")
                step.outputs = step.session._read_outputs(step.reads)
        except Exception as e:
            self.broken = e
            for step in batch:
                step.error = BrokenResourceError(f"the GPU failed: {e}")
                step.error.__cause__ = e
        finally:
            for step in batch:
                step.done = True
                step.wake.set()
