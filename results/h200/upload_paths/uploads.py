"""Ways of moving weights from host memory into device buffers, timed: queue.write_buffer of whole
tensors, of chunks, mapped_at_creation buffers, and a ring of reused MAP_WRITE staging buffers
copied with copy_buffer_to_buffer. usage: python uploads.py [MiB per tensor] [tensors]"""
import sys
import time

import numpy as np
import wgpu

U = wgpu.BufferUsage
MIB = 1 << 20
size_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
count = int(sys.argv[2]) if len(sys.argv) > 2 else 16
adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
lim = adapter.limits
dev = adapter.request_device_sync(required_limits={k: lim[k] for k in ("max-buffer-size", "max-storage-buffer-binding-size")})
print(adapter.info["device"], f"{count} tensors of {size_mib} MiB", flush=True)
rng = np.random.default_rng(0)
host = [rng.integers(0, 255, size_mib * MIB, dtype=np.uint8) for _ in range(count)]
targets = [dev.create_buffer(size=size_mib * MIB, usage=U.STORAGE | U.COPY_DST | U.COPY_SRC) for _ in range(count)]
total = count * size_mib * MIB


def finish():
    dev.queue.read_buffer(targets[-1], 0, 4)  # waits for the queue


def whole():
    for t, h in zip(targets, host):
        dev.queue.write_buffer(t, 0, h)
    finish()


def chunks(chunk_mib):
    def run():
        c = chunk_mib * MIB
        for t, h in zip(targets, host):
            for o in range(0, h.nbytes, c):
                dev.queue.write_buffer(t, o, h[o : o + c])
        finish()
    return run


def submit_every(chunk_mib):
    """write_buffer in chunks, a submit (and a wait) every 256 MiB: staging memory reused."""
    def run():
        c, since = chunk_mib * MIB, 0
        for t, h in zip(targets, host):
            for o in range(0, h.nbytes, c):
                dev.queue.write_buffer(t, o, h[o : o + c])
                since += c
                if since >= 256 * MIB:
                    dev.queue.submit([])
                    since = 0
        finish()
    return run


def mapped_creation():
    made = []
    for h in host:
        b = dev.create_buffer(size=h.nbytes, usage=U.STORAGE | U.COPY_DST | U.COPY_SRC, mapped_at_creation=True)
        b.write_mapped(h)
        b.unmap()
        made.append(b)
    dev.queue.submit([])
    dev.queue.read_buffer(made[-1], 0, 4)


def ring(stage_mib, n):
    stages = [dev.create_buffer(size=stage_mib * MIB, usage=U.MAP_WRITE | U.COPY_SRC) for _ in range(n)]

    def run():
        c, k = stage_mib * MIB, 0
        for s in stages:
            if s.map_state != "mapped":
                s.map_sync(wgpu.MapMode.WRITE)
        for t, h in zip(targets, host):
            for o in range(0, h.nbytes, c):
                s = stages[k % n]
                if s.map_state != "mapped":
                    s.map_sync(wgpu.MapMode.WRITE)  # waits for its last copy
                part = h[o : o + c]
                s.write_mapped(part, 0)
                s.unmap()
                enc = dev.create_command_encoder()
                enc.copy_buffer_to_buffer(s, 0, t, o, part.nbytes)
                dev.queue.submit([enc.finish()])
                k += 1
        finish()
    return run


cases = [("write_buffer, whole tensors", whole), ("write_buffer, 16 MiB chunks", chunks(16)), ("write_buffer, 4 MiB chunks", chunks(4)),
         ("write_buffer 16 MiB, submit every 256 MiB", submit_every(16)), ("mapped_at_creation", mapped_creation)]
cases += [(f"ring of {n} x {m} MiB MAP_WRITE", ring(m, n)) for m, n in ((16, 4), (64, 4), (32, 8))]
for rnd in range(2):
    for name, fn in cases:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        print(f"round {rnd}: {name:45s} {dt * 1e3:8.1f} ms  {total / dt / 1e9:6.2f} GB/s", flush=True)
got = np.frombuffer(dev.queue.read_buffer(targets[3]), np.uint8)
assert (got == host[3]).all(), "ring upload differs"
print("contents checked")
