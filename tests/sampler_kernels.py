"""The sampler kernels (kernels/attention/sampler.py) alone over given logits, one sequence a row,
bound and dispatched as async_runtime/bursts.py does after a pass: for tests that need many rows
of chosen logits (distributions over thousands of seeds) rather than a model's."""

import struct

import numpy as np
import wgpu

from async_runtime.backend import MERGE_APART
from async_runtime.bursts import BINDINGS, kernel_sequence, sampler_grids, scratch_bytes
from async_runtime.device import find_adapter
from async_runtime.pipelines import wgsl_for_device
from pte_wgpu.kernels.attention.sampler import BURST_MAX, draw_kernel, pick_kernel, sampler_slices, select_kernel

USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


def sampler_device(f16=False):
    adapter = find_adapter()
    if f16 and "shader-f16" not in adapter.features:
        return None
    return adapter.request_device_sync(required_features=["shader-f16"] if f16 else [])


def run_sampler(device, logits, rows, positions, counts=None, bias=None, passes=1, merge_apart=MERGE_APART):
    """The ids the kernels pick for `logits` [seqs, vocab] (float32 or float16) under `rows` (a
    `Sampling.row` each), row b's token at `positions[b]` (the fed token's), `passes` times over
    the same logits (as a burst's passes, each advancing the positions): ids [seqs, passes], the
    token table and positions after, and the slots' token counts."""
    seqs, vocab = logits.shape
    slices = sampler_slices(vocab)
    slots = max(1, len(counts) if counts is not None else 1)
    counts = np.zeros((slots, vocab), np.uint32) if counts is None else counts
    bias = np.zeros((slots, vocab), np.float32) if bias is None else bias
    alias = "alias LT = f16;\n" if logits.dtype == np.float16 else "alias LT = f32;\n"
    f16 = "enable f16;\n" if logits.dtype == np.float16 else ""
    texts = {"pick": f16 + alias + pick_kernel(merge_apart), "select": select_kernel(merge_apart), "draw": draw_kernel(merge_apart)}
    data = {name: bytes(n) for name, n in scratch_bytes(seqs, vocab).items()}
    assert len(b"".join(rows)) == len(data["rows"])
    data.update(
        rows=b"".join(rows), counts=counts.tobytes(), bias=bias.tobytes(), logits=logits.tobytes() + bytes(-logits.nbytes % 4),
        seq_last=np.arange(seqs, dtype=np.int32).tobytes(), tokens=bytes(seqs * 4), row_pos=np.asarray(positions, np.int32).tobytes(),
    )
    buffers = {name: device.create_buffer_with_data(data=raw, usage=USAGE) for name, raw in data.items()}
    buffers["params"] = device.create_buffer_with_data(data=struct.pack("<4I", seqs, vocab, vocab, slices),
                                                       usage=wgpu.BufferUsage.UNIFORM)
    sequence = kernel_sequence(rows)
    kernels = {}
    for name in set(sequence):
        module = device.create_shader_module(code=wgsl_for_device(texts[name]))
        pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        entries = [{"binding": i, "resource": {"buffer": buffers[b]}} for i, b in enumerate(BINDINGS[name]) if b is not None]
        kernels[name] = (pipeline, device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries))
    for _ in range(passes):
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        for pipeline, group in map(kernels.get, sequence):
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            for grid in sampler_grids(slices, seqs, merge_apart):
                compute.dispatch_workgroups(*grid)
        compute.end()
        device.queue.submit([encoder.finish()])

    def read(name, dtype):
        return np.frombuffer(device.queue.read_buffer(buffers[name]), dtype)

    ids = read("ids", np.int32).reshape(seqs, BURST_MAX)[:, :passes]
    assert not read("arrivals", np.uint32).any()  # every kernel set its arrival counts back to 0
    return ids, read("tokens", np.int32), read("row_pos", np.int32), read("counts", np.uint32).reshape(slots, vocab)
