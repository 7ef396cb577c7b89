"""What the standalone GEMM benches share (imported from their folders' scripts): the device with the
adapter's binding limits, buffers, bind groups, timing a pipeline sequence dispatched over and over in
one pass (wall time over the submit, the best of three rounds after one warm-up dispatch), and a
4-bit weight of group 32 with its float64 reference product."""
import struct
import time

import numpy as np
import wgpu

from async_runtime.pipelines import compile_pipeline  # noqa: F401 (the benches' too)
from pte_wgpu.kernels.matmul.q4_linear import LIN_FORMAT, LIN_STRUCT

adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
_lim = adapter.limits
dev = adapter.request_device_sync(required_features=[], required_limits={
    name: _lim[name] for name in ("max-storage-buffer-binding-size", "max-buffer-size", "max-compute-workgroup-storage-size")})
print(adapter.info["device"], flush=True)
U = wgpu.BufferUsage


def buf(a, usage=U.STORAGE):
    return dev.create_buffer_with_data(data=np.ascontiguousarray(a).tobytes(), usage=usage | U.COPY_SRC)


def bind(p, bufs):
    return dev.create_bind_group(layout=p.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(bufs)])


def timed(pipes, bgs, grids, reps, out):
    """Microseconds a pass of `pipes` (bind groups `bgs`, grids `grids`) takes; `out` read back to wait."""
    times = []
    for t in range(4):
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        for _ in range(reps if t else 1):
            for p, bg, grid in zip(pipes, bgs, grids):
                cp.set_pipeline(p)
                cp.set_bind_group(0, bg)
                cp.dispatch_workgroups(*grid)
        cp.end()
        t0 = time.perf_counter()
        dev.queue.submit([enc.finish()])
        dev.queue.read_buffer(out, size=4)
        times.append((time.perf_counter() - t0) / (reps if t else 1))
    return min(times[1:]) * 1e6


def q4_operands(x, N, K, rng, gs=32):
    """(buffers of a random [N, K] 4-bit weight of group `gs` and its scales, by quads of weight rows
    [N / 4, groups, 4] as the kernels read them, the uniform's WGSL (binding after out, p and the
    scratch), its buffer, x @ W.T in float64)."""
    M, wpr, groups = x.shape[0], K // 8, K // gs
    wq = rng.integers(0, 2**32, size=(N, wpr), dtype=np.uint32)
    ws = (rng.random((N // 4, groups, 4), dtype=np.float32) * 0.02).astype(np.float32)
    nib = ((wq[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15).astype(np.float32).reshape(N, K) - 8
    scale = ws.transpose(0, 2, 1).reshape(N, groups)
    ref = x.astype(np.float64) @ (nib * np.repeat(scale, gs, axis=1)).T.astype(np.float64)
    uniform = f"{LIN_STRUCT};\n@group(0) @binding(6) var<uniform> q: Q;\n"
    qb = buf(np.frombuffer(struct.pack(LIN_FORMAT, M, N, K, wpr, groups, gs, wpr), np.uint8), U.UNIFORM)
    return [buf(wq), buf(ws)], uniform, qb, ref
