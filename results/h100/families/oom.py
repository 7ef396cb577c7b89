"""Fill the GPU with 4 GiB buffers from another device of the same adapter until one fails, then
ar.load a model: it must fail with MemoryBudgetError, and load again once the buffers are gone."""
import sys
import anyio, wgpu
import async_runtime as ar

async def main(path):
    a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    d = a.request_device_sync(required_limits=dict(a.limits))
    size, kept = a.limits["max-buffer-size"], []
    try:
        for _ in range(64):
            b = d.create_buffer(size=size, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST)
            d.queue.write_buffer(b, size - 4, b"\0\0\0\0")
            kept.append(b)
    except wgpu.GPUError as e:
        print("filled with", len(kept), "buffers; then", type(e).__name__, str(e).splitlines()[-1].strip())
    try:
        async with await ar.load(path):
            print("LOADED: the fill left room")
    except ar.MemoryBudgetError as e:
        print("MemoryBudgetError:", str(e)[:300])
    for b in kept:
        b.destroy()
    d.destroy()
    del kept, d
    import gc; gc.collect()
    async with await ar.load(path) as model:
        async with model.session() as s:
            print("after freeing: loads and generates", [t async for t in ar.generate(s, [1, 2, 3], max_new_tokens=4)])

anyio.run(main, sys.argv[1])
