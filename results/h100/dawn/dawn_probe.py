"""What the runtime meets on Dawn (wgpudawn): adapters from the main thread and a worker thread under a running loop,
then ar.load + a prompt, with the obvious gaps patched (Dawn's 'subgroups' name; no trusted shader module)."""
import os, sys, threading, traceback
DAWN = os.environ.get("DAWN", "1") == "1"
if DAWN:
    os.environ["PTE_WGPU_BACKEND"] = "dawn"
if DAWN:
    import wgpudawn
    from wgpudawn.backends.dawn import extras
    if os.environ.get("UNSAFE"):
        extras.set_instance_extras(backends=["Vulkan"], enable_toggles=["allow_unsafe_apis"])
    wgpudawn.install_as_wgpu()
import wgpu
import anyio, numpy as np
print("wgpu is", wgpu.__file__, flush=True)
a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
print("main:", a and a.summary, sorted(a.features) if a else None, flush=True)
def in_thread():
    try:
        b = wgpu.gpu.request_adapter_sync(power_preference="high-performance"); print("plain thread:", b and b.summary, flush=True)
    except Exception as e: print("plain thread error:", repr(e), flush=True)
th = threading.Thread(target=in_thread); th.start(); th.join()
async def loop_thread():
    try:
        b = await anyio.to_thread.run_sync(lambda: wgpu.gpu.request_adapter_sync(power_preference="high-performance"))
        print("worker under a loop:", b and b.summary, flush=True)
    except Exception as e: print("worker under a loop error:", repr(e), flush=True)
anyio.run(loop_thread)
import async_runtime as ar
from async_runtime import device as dev, pipelines
print("device.wgpu is probe wgpu:", dev.wgpu is wgpu, dev.wgpu.gpu is wgpu.gpu, type(dev.wgpu.gpu), flush=True)
for label, call in (("find_adapter main", lambda: dev.find_adapter()),):
    try: print(label, call().summary, flush=True)
    except Exception as e: print(label, "error", repr(e), flush=True)
async def via_thread():
    for i in range(3):
        try: print("find_adapter worker", i, (await anyio.to_thread.run_sync(dev.find_adapter)).summary, flush=True)
        except Exception as e: print("find_adapter worker", i, "error", repr(e), flush=True)
    try:
        _, d, info = await dev.open_device(); print("open_device", info, flush=True)
    except Exception as e: traceback.print_exc()
anyio.run(via_thread)
async def main(path):
    try:
        async with await ar.load(path) as m:
            print(m.device_info, m.batching, m.kernels if hasattr(m, "kernels") else "", flush=True)
            rng = np.random.default_rng(0)
            async with m.session() as s:
                (l,) = await s.execute(rng.integers(0, 1000, (1, 40)), np.array([0]))
                (l2,) = await s.execute(np.array([[7]]), np.array([40]))
            np.save(f"/tmp/logits_{'dawn' if DAWN else 'native'}.npy", np.concatenate([l.reshape(-1), l2.reshape(-1)]))
            print("logits ok", l.reshape(-1)[:4], flush=True)
            toks = []
            async with m.session() as s:
                async for t in ar.generate(s, list(range(20)), max_new_tokens=32): toks.append(t)
            print("generate ok", toks[:8], flush=True)
    except Exception:
        traceback.print_exc()
anyio.run(main, sys.argv[1])
