"""How this GPU rounds f32 to f16 in a kernel, against numpy's round-to-nearest-even: an f16 store
(out16[i] = f16(x)), a conversion and back in registers (f32(f16(x))), pack2x16float, and back to f32 from it
through unpack2x16float.

python3 rounding.py   ($PTE_WGPU_BACKEND picks the backend, as the runtime does)"""
import numpy as np

import async_runtime  # noqa: F401 (the backend)
import wgpu

SRC = """enable f16;
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> stored: array<f16>;
@group(0) @binding(2) var<storage, read_write> back: array<f32>;
@group(0) @binding(3) var<storage, read_write> packed: array<u32>;
@group(0) @binding(4) var<storage, read_write> unpacked: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&x)) { return; }
    stored[i] = f16(x[i]);
    back[i] = f32(f16(x[i])) + 0.0 * x[i];
    packed[i] = pack2x16float(vec2<f32>(x[i], 0.0));
    unpacked[i] = unpack2x16float(pack2x16float(vec2<f32>(x[i], 0.0))).x + 0.0 * x[i];
}
"""
n = 1 << 16
x = (np.random.default_rng(0).standard_normal(n) * 4).astype(np.float32)
adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
device = adapter.request_device_sync(required_features=["shader-f16"])
print(adapter.summary)
buffers = [device.create_buffer_with_data(data=x, usage=wgpu.BufferUsage.STORAGE)]
for size in (2 * n, 4 * n, 4 * n, 4 * n):
    buffers.append(device.create_buffer(size=size, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC))
pipeline = device.create_compute_pipeline(layout="auto", compute={"module": device.create_shader_module(code=SRC), "entry_point": "main"})
group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                 entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(buffers)])
encoder = device.create_command_encoder()
compute = encoder.begin_compute_pass()
compute.set_pipeline(pipeline)
compute.set_bind_group(0, group)
compute.dispatch_workgroups(n // 64)
compute.end()
device.queue.submit([encoder.finish()])
stored = np.frombuffer(device.queue.read_buffer(buffers[1]), np.float16)
back = np.frombuffer(device.queue.read_buffer(buffers[2]), np.float32)
packed = np.frombuffer(device.queue.read_buffer(buffers[3]), np.uint32)
packed = (packed & 0xFFFF).astype(np.uint16).view(np.float16)
unpacked = np.frombuffer(device.queue.read_buffer(buffers[4]), np.float32)
rte = x.astype(np.float16)
toward_zero = np.where(np.abs(rte.astype(np.float32)) > np.abs(x), np.nextafter(rte, np.float16(0)), rte)
for name, got in (("f16 store", stored.astype(np.float32)), ("f32(f16(x))", back), ("pack2x16float", packed.astype(np.float32)),
                  ("unpack2x16float(pack2x16float(x))", unpacked)):
    print(f"{name}: {int((got != rte.astype(np.float32)).sum())} of {n} differ from round-to-nearest-even, "
          f"{int((got != toward_zero.astype(np.float32)).sum())} from round-toward-zero, {int((got == x).sum())} keep the f32 value")
