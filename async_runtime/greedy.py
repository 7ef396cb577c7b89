"""Greedy decode bursts: several decode passes of the ragged batch with one readback, the host out
of the per-token loop.

A pass of single-token decode steps needs from the host only the next token of every sequence,
and greedy sampling can pick that on the GPU (kernels/attention/sampler.py): after each pass a small kernel
writes every sequence's argmax into the token table and advances its position, so the next pass
runs from the GPU's own tables. A burst of k passes waits for the GPU once and reads back k token
ids a sequence; the host encodes each pass while the GPU runs the one before, and the next burst
of the same sequences goes in before this one's readback (two staging buffers), so the GPU runs
on through it. The passes are the
very passes a host loop would run (same shapes, same tables, same kernels), so the ids are
bitwise those of picking `logits.argmax()` on the host.
"""

import struct

import numpy as np
import wgpu

from pte_wgpu.kernels.attention.sampler import GREEDY_SLICE, greedy_advance
from pte_wgpu.kernels.wgsl import is_float, type_aliases

from .encoding import prepare
from .pipelines import compile_pipeline, dispatch_once
from .session import UNIFORM_ALIGN as PARAMS_ALIGN  # one parameter block per pass of a burst
from .storage import STORAGE_USAGE

BURST_MAX = 32  # decode passes one burst runs at most


class GreedyBursts:
    """The GPU objects of bursts over one ragged runner: the sampler's pipeline, the ids buffer, its
    two stagings (a burst's readback while the next burst runs), and one bind group per pass index."""

    @staticmethod
    def fits(model, ragged):
        """A burst needs the logits of each sequence as one float row (a single output [..., seqs,
        vocab]) and no resize hook that reads the tables' contents (the GPU changes them)."""
        graph = model.graph
        if model._data_dependent or len(graph.outputs) != 1 or ragged.output_axes[0][0] != "seqs":
            return False
        logits, axis = graph.values[graph.outputs[0]], ragged.output_axes[0][1]
        return is_float(logits.dtype) and axis == len(logits.dims) - 2 and all(d == 1 for d in logits.dims[:axis])

    def __init__(self, model, ragged, runner):
        graph = model.graph
        logits = graph.values[graph.outputs[0]]
        self.vocab = logits.dims[-1]
        self.model, self.runner = model, runner
        tokens, row_pos, _, seq_last = graph.inputs
        device = model.device
        self.pipeline = compile_pipeline(device, type_aliases(graph.values, LT=graph.outputs[0]) + greedy_advance())
        self.slices = -(-self.vocab // GREEDY_SLICE)  # the sampler's workgroups a sequence
        size = BURST_MAX * ragged.max_seqs * 4
        self.ids = model._create_buffer(size, STORAGE_USAGE, "burst token ids")
        self.stagings = [model._create_buffer(size, wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST, "burst readback") for _ in range(2)]
        self.params = model._create_buffer(BURST_MAX * PARAMS_ALIGN, wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST, "burst params")
        parts = model._create_buffer(ragged.max_seqs * self.slices * 8, STORAGE_USAGE, "sampler slices")
        arrivals = model._create_buffer(ragged.max_seqs * 4, STORAGE_USAGE, "sampler arrivals")  # zeros
        buffers = [runner._buffer(graph.outputs[0]), runner._buffer(seq_last), runner._buffer(tokens),
                   runner._buffer(row_pos), self.ids, None, parts, arrivals]
        layout = self.pipeline.get_bind_group_layout(0)
        self.bind_groups = [
            device.create_bind_group(layout=layout, entries=[
                {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size} if b else {"buffer": self.params, "offset": k * PARAMS_ALIGN, "size": 16}}
                for i, b in enumerate(buffers)
            ])
            for k in range(BURST_MAX)
        ]
        self._warm_up()

    def _warm_up(self):
        """One dispatch over no sequence: a driver that compiles a pipeline at its first dispatch
        (lavapipe) does it now, at load, not in the first burst."""
        device = self.model.device
        device.queue.write_buffer(self.params, 0, struct.pack("<4I", 0, self.vocab, self.vocab, 0))
        dispatch_once(device, self.pipeline, self.bind_groups[0])

    def submit(self, seqs, passes, staging=0):
        """`passes` decode passes of the runner's current tables, each followed by the sampler over
        `seqs` sequences (in the pass's last compute pass), the last one by the ids' copy into
        `stagings[staging]`. Each pass is submitted as
        soon as it is encoded, so the GPU runs it while the host encodes the next (every encoded
        command buffer is submitted: wgpu-native on NVIDIA crashes on dropping one unsubmitted)."""
        device = self.model.device
        block = bytearray(passes * PARAMS_ALIGN)
        for k in range(passes):
            struct.pack_into("<4I", block, k * PARAMS_ALIGN, seqs, self.vocab, self.vocab, k)
        device.queue.write_buffer(self.params, 0, block)
        for k in range(passes):
            encoder = device.create_command_encoder()
            self.runner._encode_commands(encoder, tail=[(*prepare(self.pipeline, self.bind_groups[k]), (self.slices, seqs, 1))])
            if k == passes - 1:
                encoder.copy_buffer_to_buffer(self.ids, 0, self.stagings[staging], 0, passes * seqs * 4)
            device.queue.submit([encoder.finish()])

    def read(self, seqs, passes, staging=0):
        """The ids of the burst copied into `stagings[staging]`, [seqs, passes] (map it first)."""
        try:
            raw = self.stagings[staging].read_mapped(0, passes * seqs * 4, copy=False)
            return np.frombuffer(raw, np.int32).reshape(passes, seqs).T.astype(np.int64)
        finally:
            self.stagings[staging].unmap()
