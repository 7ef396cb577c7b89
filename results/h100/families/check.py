"""Load a family's real-shape export, generate 48 greedy tokens with the GPU picking them, and
check the first 12 against a host loop (logits read back, argmax) on another session."""
import sys, time
import anyio, numpy as np
import async_runtime as ar

async def main(path):
    t = time.perf_counter()
    async with await ar.load(path) as model:
        load = time.perf_counter() - t
        prompt = [int(x) for x in np.random.default_rng(0).integers(1, 1000, 37)]
        async with model.session() as s:
            g = ar.generate(s, prompt, max_new_tokens=48)
            gpu = [tok async for tok in g]
        host, pos = [], 0
        async with model.session() as s:
            ids = prompt
            for _ in range(12):
                (logits,) = await s.execute(np.array([ids], np.int64), np.array([pos], np.int64))
                pos += len(ids)
                host.append(int(np.asarray(logits).reshape(-1, logits.shape[-1])[-1].argmax()))
                ids = [host[-1]]
        print(path.split("/")[-1], model.device_info.name, model.precision, model.batching, repr(model.batching_note),
              "gpu_sampling", model.gpu_sampling, f"load {load:.1f} s", f"memory {model.memory() / 1e9:.2f} GB",
              f"{len(gpu)} tokens at {g.stats.generate_tokens_per_s:.0f} tok/s", "first 12 equal to the host loop:", gpu[:12] == host, gpu[:12], flush=True)

anyio.run(main, sys.argv[1])
