"""Standalone timing of the delta rule's shaders (16 heads, Dk = Dv = 128, T rows, one sequence),
compiled as the runtime compiles them (async_runtime.pipelines), by GPU timestamps; `flush` copies
256 MiB before each dispatch. The ragged shader's variants differ from it in one thing each.

    python3 bench.py unbatched|ragged|ragged_uniform_bounds|ragged_constant_heads|ragged_read_only_state [T] [flush]
"""
import struct
import sys

import numpy as np
import wgpu

from async_runtime.pipelines import compile_pipeline
from pte_wgpu.kernels.attention import gated_delta as gd
from pte_wgpu.kernels.wgsl import flat_grid

H, DK, DV = 16, 128, 128
variant = sys.argv[1]
T = int(sys.argv[2]) if len(sys.argv) > 2 else 512
flush = "flush" in sys.argv
ragged = gd.rule_shader(gd.ragged_shader(False), DK, DV, False, "pool", "pool")
BOUNDS = """    var first = 0u;
    if (b > 0u) { first = u32(seq_last[b - 1u] + 1); }
    let end = u32(seq_last[b] + 1);"""
assert BOUNDS in ragged
src = {
    "unbatched": gd.rule_shader(gd.SHADER, DK, DV, False, "s0", "s1"),
    "ragged": ragged,
    "ragged_uniform_bounds": ragged.replace(BOUNDS, "    if (seq_last[b] < -100) { return; }\n    let first = 0u;\n    let end = p.rows;"),
    "ragged_constant_heads": ragged.replace("p.heads", f"{H}u"),
    "ragged_read_only_state": ragged.replace("var<uniform> p: P;", "var<uniform> p: P;\n@group(0) @binding(10) var<storage, read> pool_in: array<f32>;")
    .replace("s[a] = pool[in_at", "s[a] = pool_in[in_at"),
}[variant]

adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
dev = adapter.request_device_sync(required_features=["timestamp-query"], required_limits={"max_storage_buffers_per_shader_stage": 10})
rng = np.random.default_rng(0)


def buf(a):
    return dev.create_buffer_with_data(data=np.ascontiguousarray(a, np.float32), usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)


q, k = (buf(rng.standard_normal((H, T, DK)) * 0.1) for _ in range(2))
v = buf(rng.standard_normal((H, T, DV)))
decay = buf(rng.uniform(0.9, 1.0, (H, T)))
beta = buf(rng.uniform(0, 1, (H, T)))
s0, s1 = buf(np.zeros((H, DK, DV))), buf(np.zeros((H, DK, DV)))
o = buf(np.zeros((H, T, DV)))
seq_last = dev.create_buffer_with_data(data=np.array([T - 1], np.int32), usage=wgpu.BufferUsage.STORAGE)
seq_slots = dev.create_buffer_with_data(data=np.array([0], np.int32), usage=wgpu.BufferUsage.STORAGE)
n = H * DV
if variant == "unbatched":
    params, bufs = struct.pack("<4I", n, T, 0, 0), [q, k, v, decay, beta, s0, o, s1]
else:
    params, bufs = struct.pack("<4I", n, T, H, 0), [q, k, v, decay, beta, seq_last, seq_slots, o, s1]
u = dev.create_buffer_with_data(data=params, usage=wgpu.BufferUsage.UNIFORM)
pipe = compile_pipeline(dev, src)
extra = [s0] if variant == "ragged_read_only_state" else []
bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(bufs + [u] + extra)])
grid = flat_grid(n)
big_a, big_b = (dev.create_buffer(size=256 << 20, usage=wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST) for _ in range(2))
qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2)
qbuf = dev.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)


def run(reps):
    times = []
    for _ in range(reps):
        enc = dev.create_command_encoder()
        if flush:
            enc.copy_buffer_to_buffer(big_a, 0, big_b, 0, 256 << 20)
        p = enc.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1})
        p.set_pipeline(pipe)
        p.set_bind_group(0, bg)
        p.dispatch_workgroups(*grid)
        p.end()
        enc.resolve_query_set(qs, 0, 2, qbuf, 0)
        dev.queue.submit([enc.finish()])
        t0, t1 = np.frombuffer(dev.queue.read_buffer(qbuf), np.uint64)
        times.append(int(t1 - t0))
    return times


run(30)
out = np.frombuffer(dev.queue.read_buffer(o), np.float32)
print(f"{variant:24s} flush={flush} T={T} {np.median(run(40)) / 1e3:8.1f} us/dispatch  checksum {float(np.abs(out).sum()):.4f}")
