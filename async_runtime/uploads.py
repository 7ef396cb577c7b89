"""A model's constants into its device buffers through a few reused staging buffers.

`queue.write_buffer` gives every write a staging buffer of its own, which wgpu-native allocates
and the driver maps anew: 1.1-1.5 GB/s on an H200, whether a tensor is written whole or in
chunks. `StagedUploads` fills STAGES mapped MAP_WRITE buffers of STAGE_BYTES in turn, as many
tensors (or parts of one) to a buffer as fit, and copies each into place with
`copy_buffer_to_buffer` once it is full; a buffer is mapped again (waiting for its copies) only
when its turn comes back. The same H200 uploads 6.6-8.2 GB/s this way
(results/h200/upload_paths/). Synchronous: a worker thread's.
"""

import wgpu

STAGES = 4
STAGE_BYTES = 16 << 20
MAP_ALIGNMENT = 8  # a mapped range starts at a multiple of 8 bytes (WebGPU's getMappedRange)


class StagedUploads:
    def __init__(self, device):
        self.device = device
        self.stages = []  # created on first use, mapped at creation
        self.turn = 0  # the stage being filled
        self.used = 0  # its bytes taken
        self.copies = []  # (stage offset, target buffer, target offset, bytes) of the stage being filled

    def write(self, target, data):
        """Write `data` (bytes-like, C-contiguous, whole 4-byte words, as `storage.to_storage`
        gives) at the start of buffer `target`."""
        view = memoryview(data).cast("B")
        if len(view) % 4:
            raise ValueError(f"an upload of {len(view)} bytes: buffer copies move whole 4-byte words")
        done = 0
        while done < len(view):
            stage = self._stage()
            part = min(len(view) - done, STAGE_BYTES - self.used)
            stage.write_mapped(view[done : done + part], self.used)
            self.copies.append((self.used, target, done, part))
            self.used += -(-part // MAP_ALIGNMENT) * MAP_ALIGNMENT
            done += part
            if self.used >= STAGE_BYTES:
                self._submit()

    def finish(self):
        """Submit what is staged; the stages are released once their copies have run."""
        self._submit()
        self.stages = []

    def _stage(self):
        if self.turn == len(self.stages):
            usage = wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC
            self.stages.append(self.device.create_buffer(size=STAGE_BYTES, usage=usage, mapped_at_creation=True, label="upload staging"))
        stage = self.stages[self.turn]
        if stage.map_state != "mapped":
            stage.map_sync(wgpu.MapMode.WRITE)  # worker thread (the load's): waits for the copies it last took
        return stage

    def _submit(self):
        if not self.copies:
            return
        stage = self.stages[self.turn]
        stage.unmap()
        encoder = self.device.create_command_encoder()
        for source_offset, target, target_offset, size in self.copies:
            encoder.copy_buffer_to_buffer(stage, source_offset, target, target_offset, size)
        self.device.queue.submit([encoder.finish()])
        self.copies, self.used, self.turn = [], 0, (self.turn + 1) % STAGES
