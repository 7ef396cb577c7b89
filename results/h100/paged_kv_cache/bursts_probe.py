"""64 streams of greedy bursts, 5 runs: wall rate, and per run the passes (submits) and readbacks."""
import sys, time, statistics
import anyio, numpy as np
import async_runtime as ar

async def main(path, n, steps, runs, plen=8):
    rng = np.random.default_rng(0)
    async with await ar.load(path, max_batch=64) as model:
        vocab = model.outputs[0].max_shape[-1]
        rates = []
        for r in range(runs):
            sessions = [await model.open_session() for _ in range(n)]
            async with anyio.create_task_group() as tg:
                for s in sessions:
                    tg.start_soon(s.execute, rng.integers(0, vocab, (1, plen)), np.array([0]))
            before = model.statistics(); t = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for s in sessions:
                    tg.start_soon(lambda s=s: s.greedy(np.array([[8]]), np.array([plen]), n=steps))
            dt = time.perf_counter() - t; after = model.statistics()
            rates.append(n * steps / dt)
            print(f"run {r}: {n * steps / dt:8.0f} tok/s, submits {after.submits - before.submits}, readbacks {after.readbacks - before.readbacks}, {dt*1e3:.0f} ms", flush=True)
            for s in sessions:
                await s.aclose()
        print(f"median {statistics.median(rates):.0f}")
anyio.run(main, sys.argv[1], *map(int, sys.argv[2:]))
