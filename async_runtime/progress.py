"""Load progress: `ar.load(source, progress=callback)` calls `callback(phase, done, total)`.

The phases come in this order, each from done=0 to done=total:
- "read": bytes of the file read (a path; bytes given in memory count as one step),
- "upload": bytes of weights written to the GPU,
- "compile": kernels (shader module and pipeline) compiled, in parallel worker threads,
- "warm-up": kernels dispatched once, so drivers that compile at first use (lavapipe) do it now.
The callback always runs on the event loop's thread, so it may touch anything the caller owns.
"""

import anyio

PHASES = ("read", "upload", "compile", "warm-up")


class LoadProgress:
    """Reports to an optional `callback(phase, done, total)`, from the loop or a worker thread."""

    def __init__(self, callback=None):
        if callback is not None and not callable(callback):
            raise TypeError(f"load(): progress must be callable, got {type(callback).__name__}")
        self.callback = callback

    def __call__(self, phase, done, total):
        if self.callback is not None:
            self.callback(phase, done, total)

    def from_worker(self, phase, done, total):
        """The same, from a worker thread started by anyio.to_thread (waits for the loop)."""
        if self.callback is not None:
            anyio.from_thread.run_sync(self.callback, phase, done, total)
