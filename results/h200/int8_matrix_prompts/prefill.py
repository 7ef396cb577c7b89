"""Prompt speed of an LLM export: median tokens/s of one execute of N tokens at position 0, then
one-stream decode steps. python3 prefill.py PTE [--no-matrices] [--no-f16-matrices] [--sizes 128,512,2047]
[--runs 5] --no-matrices: the int8 subgroup matrices off (the GEMM takes the prompts, or the f16 matrices where
the device has them); --no-f16-matrices: the f16 ones off; MIN_TILES=n: the int8 route's minimum tile count."""
import argparse, asyncio, os, sys, time
import numpy as np
p = argparse.ArgumentParser()
p.add_argument("pte"); p.add_argument("--no-matrices", action="store_true"); p.add_argument("--no-f16-matrices", action="store_true")
p.add_argument("--sizes", default="128,512,2047"); p.add_argument("--runs", type=int, default=5)
p.add_argument("--decode", type=int, default=64)
a = p.parse_args()
import async_runtime as ar
import async_runtime.model as am
if a.no_matrices:
    am.INT8_MATRIX = None
if a.no_f16_matrices:
    am.F16_MATRIX = None
if os.environ.get("MIN_TILES"):
    import pte_wgpu.kernels.matmul.int8_matrix as im
    im.MIN_TILES = int(os.environ["MIN_TILES"])
async def main():
    t = time.perf_counter()
    model = await ar.load(a.pte, max_batch=32)
    async with model:
        vocab = model.outputs[0].max_shape[-1]
        print(f"backend {model.device_info.backend} int8_matrices {model.int8_matrices} f16_matrices {model.f16_matrices} matrices {model.device_info.subgroup_matrices} load {time.perf_counter()-t:.1f}s batching {model.batching}", flush=True)
        rng = np.random.default_rng(0)
        res = {}
        async with model.session() as s:
            for n in [int(x) for x in a.sizes.split(",")]:
                rates = []
                for _ in range(a.runs + 1):
                    t = time.perf_counter()
                    out = await s.execute(rng.integers(0, vocab, (1, n)), np.array([0]))
                    rates.append(n / (time.perf_counter() - t))
                res[n] = float(np.median(rates[1:]))
                print(f"prefill {n}: {res[n]:.0f} tok/s", flush=True)
            await s.execute(rng.integers(0, vocab, (1, 8)), np.array([0]))
            t = time.perf_counter()
            for q in range(8, 8 + a.decode):
                await s.execute(np.array([[q % vocab]]), np.array([q]))
            print(f"decode 1: {a.decode / (time.perf_counter() - t):.0f} tok/s", flush=True)
asyncio.run(main())
