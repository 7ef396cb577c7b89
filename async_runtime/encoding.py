"""Encoding a run of compute dispatches, the hot loop of every execute.

A decode step of a small LLM is ~500 tiny dispatches; through wgpu-py's public methods each costs
several microseconds of Python (argument checks, a fresh cffi array for the empty dynamic
offsets, error capture around every call). wgpu-py's own native backend exposes the C functions
and object handles, so when it is the backend in use, the loop calls them directly with the
handles prepared once. Errors still surface: `encoder.finish()` and `queue.submit()` go through
the public, checked API.
"""

from .backend import native

try:  # the backend's C functions (wgpu-native's or Dawn's webgpu.h)
    ffi, lib = native.ffi, native.lib

    _SET_PIPELINE = lib.wgpuComputePassEncoderSetPipeline
    _SET_BIND_GROUP = lib.wgpuComputePassEncoderSetBindGroup
    _DISPATCH = lib.wgpuComputePassEncoderDispatchWorkgroups
    _NO_OFFSETS = ffi.NULL
except (ImportError, AttributeError):  # pragma: no cover - another backend: the public API
    lib = None


def prepare(pipeline, bind_group):
    """What `encode_dispatches` needs of a pipeline and bind group (native handles if it can)."""
    if lib is not None and hasattr(pipeline, "_internal") and hasattr(bind_group, "_internal"):
        return pipeline._internal, bind_group._internal
    return pipeline, bind_group


def encode_dispatches(compute, dispatches):
    """Encode [(pipeline, bind_group, (x, y, z)), ...] (from `prepare`) into a compute pass; a
    pipeline stays bound across consecutive dispatches of the same kernel."""
    current = None
    if lib is not None and hasattr(compute, "_internal"):
        handle = compute._internal
        for pipeline, bind_group, (x, y, z) in dispatches:
            if pipeline is not current:
                _SET_PIPELINE(handle, pipeline)
                current = pipeline
            _SET_BIND_GROUP(handle, 0, bind_group, 0, _NO_OFFSETS)
            _DISPATCH(handle, x, y, z)
        return
    for pipeline, bind_group, (x, y, z) in dispatches:  # pragma: no cover - other backends
        if pipeline is not current:
            compute.set_pipeline(pipeline)
            current = pipeline
        compute.set_bind_group(0, bind_group)
        compute.dispatch_workgroups(x, y, z)


# A step is submitted in pieces: the first after FIRST_PIECE dispatches, each next one twice as
# long up to MAX_PIECE, none leaving fewer than PIECE_TAIL behind. Doubling keeps the GPU fed:
# on an H100 the host encodes and finishes a dispatch in ~8 µs, a prefill's dispatch runs ~21 µs
# on the GPU and a decode step's ~9, and a submit boundary costs the GPU ~22 µs (BENCHMARKS.md,
# "A step goes to the GPU in pieces").
FIRST_PIECE, MAX_PIECE, PIECE_TAIL = 16, 256, 16


class Pieces:
    """A step's command encoders, each submitted as soon as the next begins.

    Encoding a few hundred dispatches and `finish()`ing them takes the host milliseconds (2.5 ms
    for a 512-token prefill on an H100, whose GPU then runs 7.8 ms), which the GPU would wait out
    if the step went in as one command buffer. In pieces, the GPU starts on the first while the
    rest is encoded. Every encoder begun here is finished and submitted, never dropped: call
    `finish` after the last command."""

    def __init__(self, device):
        self.device, self.encoder = device, device.create_command_encoder()
        self.since, self.submits = 0, 0  # dispatches in the current piece; pieces submitted

    def cuts(self, count):
        """The dispatch indices of a run of `count` at which a piece ends; counts them in."""
        cuts, at = [], 0
        while True:
            room = max(min(FIRST_PIECE << (self.submits + len(cuts)), MAX_PIECE) - self.since, 1)
            if count - at - room < PIECE_TAIL:
                self.since += count - at
                return cuts
            at += room
            cuts.append(at)
            self.since = 0

    def submit(self):
        """Submit the commands so far; later ones go into a new encoder."""
        self.finish()
        self.encoder = self.device.create_command_encoder()

    def finish(self):
        """Submit the commands so far, the step's last."""
        self.device.queue.submit([self.encoder.finish()])
        self.submits += 1
        self.encoder = None
