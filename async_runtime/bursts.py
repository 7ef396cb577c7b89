"""Decode bursts: several decode passes of the ragged batch with one readback, the host out of the
per-token loop.

A pass of single-token decode steps needs from the host only the next token of every sequence,
and the GPU can pick it (kernels/attention/sampler.py), greedy or sampled, each sequence with its
own settings: after each pass the sampler kernels write every sequence's choice into the token
table and advance its position, so the next pass runs from the GPU's own tables. A burst of k
passes waits for the GPU once and reads back k token ids a sequence; the host encodes each pass
while the GPU runs the one before, and the next burst of the same sequences goes in before this
one's readback (two staging buffers), so the GPU runs on through it. The passes are the very
passes a host loop would run (same shapes, same tables, same kernels), so greedy ids are bitwise
those of picking `logits.argmax()` on the host. A pass that is not a burst (a prompt's last chunk)
runs the same kernels after its graph for the sequences that pick (`tail`).
"""

import struct

import numpy as np
import wgpu

from pte_wgpu.kernels.attention.sampler import (
    BURST_MAX, ROW_WORDS, STATE_WORDS, draw_kernel, pick_kernel, sampler_slices, select_kernel,
)
from pte_wgpu.kernels.wgsl import is_float, type_aliases

from . import backend
from .encoding import prepare
from .pipelines import compile_pipeline, dispatch_once
from .ragged import ROW_POS, SEQ_LAST, TOKENS
from .storage import STORAGE_USAGE

NO_PICK = bytes(4 * ROW_WORDS)  # the row of a sequence that picks nothing in a pass


def scratch_bytes(seqs, vocab):
    """The sampler kernels' buffers for `seqs` sequences of `vocab` logits, name -> bytes (all
    zeros at the start; `ids` also sizes the readback)."""
    slices = sampler_slices(vocab)
    return {
        "rows": seqs * ROW_WORDS * 4, "state": seqs * STATE_WORDS * 4, "arrivals": seqs * 4,
        "z": seqs * vocab * 4, "ids": seqs * BURST_MAX * 4, "picked": seqs * 4, "parts": seqs * slices * 8,
        "histograms": seqs * slices * 256 * 16, "slice_mass": seqs * slices * 8,  # vec3<u32>: 16 bytes each
    }


def sampler_grids(slices, seqs, merge_apart):
    """The dispatches of one sampler kernel: a workgroup a slice of each sequence; with
    `merge_apart` (backend.py), then one a sequence, which merges the slices' results."""
    return [(slices, seqs, 1)] + ([(1, seqs, 1)] if merge_apart and slices > 1 else [])


def kernel_sequence(rows):
    """The sampler kernels after a pass whose sequences have these `Row`s, in order: `pick`; if
    any row samples, the cut rounds the most demanding row needs, then `draw`."""
    settings = [struct.unpack_from(f"<f{ROW_WORDS - 1}I", row) for row in rows]  # temperature, .., rounds
    if not any(r[0] > 0 for r in settings):
        return ["pick"]
    return ["pick"] + ["select"] * max(r[-1] for r in settings) + ["draw"]


class Bursts:
    """The GPU objects of token choice over one ragged runner: the sampler's pipelines and scratch
    buffers, each slot's token counts and logit bias, the ids buffer and its two stagings (a
    burst's readback while the next burst runs)."""

    @staticmethod
    def fits(model, ragged):
        """A burst needs the logits of each sequence as one float row (a single output [..., seqs,
        vocab]) and no resize hook that reads the tables' contents (the GPU changes them)."""
        graph = model.graph
        if model._data_dependent or len(graph.outputs) != 1 or ragged.output_axes[0][0] != "seqs":
            return False
        logits, axis = graph.values[graph.outputs[0]], ragged.output_axes[0][1]
        return is_float(logits.dtype) and axis == len(logits.dims) - 2 and all(d == 1 for d in logits.dims[:axis])

    def __init__(self, model, ragged, runner, slots):
        graph = model.graph
        self.vocab = graph.values[graph.outputs[0]].dims[-1]
        self.model, self.runner = model, runner
        device, seqs = model.device, ragged.max_seqs
        self.slices = sampler_slices(self.vocab)
        aliases = type_aliases(graph.values, LT=graph.outputs[0])
        self.merge_apart = backend.MERGE_APART
        self.pipelines = {"pick": compile_pipeline(device, aliases + pick_kernel(self.merge_apart)),
                          "select": compile_pipeline(device, select_kernel(self.merge_apart)),
                          "draw": compile_pipeline(device, draw_kernel(self.merge_apart))}
        scratch = scratch_bytes(seqs, self.vocab)
        self.stagings = [model._create_buffer(scratch["ids"], wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST, "burst readback") for _ in range(2)]
        self.buffers = {name: model._create_buffer(n, STORAGE_USAGE, f"sampler {name}") for name, n in scratch.items()}
        self.buffers["params"] = model._create_buffer(16, wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST, "sampler params")
        inputs = graph.inputs
        self.tables = {"logits": graph.outputs[0], "seq_last": inputs[SEQ_LAST], "tokens": inputs[TOKENS], "row_pos": inputs[ROW_POS]}
        self.slots = 0
        self.grow(slots)
        self.seqs = None  # the sequence count the params hold
        self._warm_up()

    def grow(self, slots):
        """Room for `slots` sessions' token counts and logit bias (their contents kept)."""
        encoder = self.model.device.create_command_encoder()
        for name in ("counts", "bias"):
            new = self.model._create_buffer(slots * self.vocab * 4, STORAGE_USAGE, f"sampler {name}")
            if self.slots:
                encoder.copy_buffer_to_buffer(self.buffers[name], 0, new, 0, self.slots * self.vocab * 4)
            self.buffers[name] = new
        self.model.device.queue.submit([encoder.finish()])
        self.slots = slots
        self._bind()

    def _bind(self):
        """One bind group a kernel, over the buffers its shader names."""
        buffers = {**self.buffers, **{name: self.runner._buffer(vid) for name, vid in self.tables.items()}}
        self.groups, self.kernels = {}, {}
        for name, pipeline in self.pipelines.items():
            entries = [{"binding": i, "resource": {"buffer": buffers[b], "offset": 0, "size": buffers[b].size}}
                       for i, b in enumerate(BINDINGS[name]) if b is not None]
            group = self.model.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
            self.groups[name], self.kernels[name] = group, prepare(pipeline, group)

    def _warm_up(self):
        """One dispatch of each kernel over no sequence: a driver that compiles a pipeline at its
        first dispatch (lavapipe) does it now, at load, not in the first burst."""
        self._params(0)
        for name, pipeline in self.pipelines.items():
            dispatch_once(self.model.device, pipeline, self.groups[name])

    def _params(self, seqs):
        if seqs != self.seqs:
            self.model.device.queue.write_buffer(self.buffers["params"], 0, struct.pack("<4I", seqs, self.vocab, self.vocab, self.slices))
            self.seqs = seqs

    def start(self, slot, sampling, history):
        """A generation starts on `slot`: its token counts and logit bias rows (only a sampling
        with penalties or bias reads them)."""
        if sampling.adjusts:
            counts, bias = sampling.slot_rows(self.vocab, history)
            queue = self.model.device.queue
            queue.write_buffer(self.buffers["counts"], slot * self.vocab * 4, counts)
            queue.write_buffer(self.buffers["bias"], slot * self.vocab * 4, bias)

    def tail(self, rows):
        """The sampler's dispatches after a pass whose sequences have these `Row`s (bytes, NO_PICK
        for a sequence that picks nothing): its settings and counters written, the dispatches
        returned. Sampled rows add the cut rounds they need and the draw."""
        seqs = len(rows)
        self._params(seqs)
        queue = self.model.device.queue
        queue.write_buffer(self.buffers["rows"], 0, b"".join(rows))
        queue.write_buffer(self.buffers["picked"], 0, bytes(4 * seqs))
        return [(*self.kernels[name], grid) for name in kernel_sequence(rows) for grid in sampler_grids(self.slices, seqs, self.merge_apart)]

    def submit(self, rows, passes, staging=0):
        """`passes` decode passes of the runner's current tables, each followed by the sampler over
        the sequences of `rows` (in the pass's last compute pass), the last one by the ids' copy into
        `stagings[staging]`. Each pass is submitted as soon as it is encoded, so the GPU runs it
        while the host encodes the next (every encoded command buffer is submitted: wgpu-native on
        NVIDIA crashes on dropping one unsubmitted). Returns the sampler's dispatches a pass."""
        device = self.model.device
        tail = self.tail(rows)
        for k in range(passes):
            encoder = device.create_command_encoder()
            self.runner._encode_commands(encoder, tail=tail)
            if k == passes - 1:
                self.copy_ids(encoder, len(rows), staging)
            device.queue.submit([encoder.finish()])
        return len(tail)

    def copy_ids(self, encoder, seqs, staging=0):
        encoder.copy_buffer_to_buffer(self.buffers["ids"], 0, self.stagings[staging], 0, seqs * BURST_MAX * 4)

    def read(self, seqs, passes, staging=0):
        """The ids copied into `stagings[staging]`, [seqs, passes] (map it first)."""
        try:
            raw = self.stagings[staging].read_mapped(0, seqs * BURST_MAX * 4, copy=True)  # no view outlives the unmap
            return np.frombuffer(raw, np.int32).reshape(seqs, BURST_MAX)[:, :passes].astype(np.int64)
        finally:
            self.stagings[staging].unmap()


FINISHING = ["seq_last", "tokens", "row_pos", "ids", "picked", "counts"]
SHARED = ["params", "rows", "state", "arrivals", "z"]
BINDINGS = {  # each kernel's buffers, by binding number (kernels/attention/sampler.py)
    "pick": SHARED + FINISHING + ["logits", "bias", "parts"],
    "select": SHARED + [None] * len(FINISHING) + ["histograms"],
    "draw": SHARED + FINISHING + ["slice_mass"],
}
