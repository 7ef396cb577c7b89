import json, struct, time
import numpy as np
import wgpu

variants = json.load(open(".pk/widen_variants.json"))
adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
lim = adapter.limits
device = adapter.request_device_sync(required_limits={"max-storage-buffer-binding-size": lim["max-storage-buffer-binding-size"], "max-buffer-size": lim["max-buffer-size"]})
print(adapter.info["device"])
U = wgpu.BufferUsage
import os
for N, K in (((256, 2048),) if os.environ.get("SMALL") else ((16384, 2048), (3072, 2048), (2048, 8192))):
    wpr, groups = K // 8, K // 32
    rng = np.random.default_rng(0)
    wq = device.create_buffer_with_data(data=rng.integers(0, 2**32, N * wpr, dtype=np.uint32), usage=U.STORAGE)
    ws = device.create_buffer_with_data(data=rng.random(N * groups, dtype=np.float32), usage=U.STORAGE)
    wide = device.create_buffer(size=N * K * 4, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
    p = device.create_buffer_with_data(data=struct.pack("<16I", 1, N, K, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, K, 0, 0), usage=U.UNIFORM)
    q = device.create_buffer_with_data(data=struct.pack("<8I", 1, N, K, wpr, groups, 32, wpr, 0), usage=U.UNIFORM)
    small = device.create_buffer(size=256, usage=U.MAP_READ | U.COPY_DST)
    ref = None
    for name, src in variants.items():
        pipe = device.create_compute_pipeline(layout="auto", compute={"module": device.create_shader_module(code=src), "entry_point": "main"})
        bg = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate((wq, ws, wide, p, q))])
        quads = N * K // 4
        if "2d" in name:
            gx = -(-(K // 4) // (128 if "128" in name else 64))
            if "x4" in name:
                gx = -(-(-(-(K // 4) // 4)) // 64)
            grid = (gx, N, 1)
        else:
            wg = 256 if "256" in name else 64
            per = 2 if "x2" in name else 1
            total = -(-quads // per // wg)
            gx = min(total, 65535)
            grid = (gx, -(-total // gx), 1)
        best = 1e9
        for run in range(4):
            enc = device.create_command_encoder()
            c = enc.begin_compute_pass()
            c.set_pipeline(pipe); c.set_bind_group(0, bg)
            for _ in range(40):
                c.dispatch_workgroups(*grid)
            c.end()
            enc.copy_buffer_to_buffer(wide, 0, small, 0, 256)
            t = time.perf_counter()
            device.queue.submit([enc.finish()])
            small.map_sync(wgpu.MapMode.READ); small.unmap()
            best = min(best, (time.perf_counter() - t) / 40)
        out = np.frombuffer(device.queue.read_buffer(wide), np.float32)
        same = "ref" if ref is None else ("same" if np.array_equal(out, ref) else "DIFFERENT")
        if ref is None:
            ref = out.copy()
        wide_fill = device.create_command_encoder(); wide_fill.clear_buffer(wide); device.queue.submit([wide_fill.finish()])
        print(f"{N}x{K} {name:14s} {best * 1e6:8.1f} us  {N * K * 4.5 / best / 1e12:5.2f} TB/s  {same}")
