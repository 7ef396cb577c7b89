import statistics, sys, time
import anyio, numpy as np
import async_runtime as ar

async def main(path, tag):
    async with await ar.load(path) as model:
        row = {}
        for n in (512, 2047):
            rates = []
            async with model.session() as s:
                for _ in range(4):
                    t = time.perf_counter()
                    await s.execute(np.arange(n)[None] % 1000, np.array([0]))
                    rates.append(n / (time.perf_counter() - t))
            row[n] = round(statistics.median(rates[1:]))
        print(tag, "prefill tokens/s", row, flush=True)

anyio.run(main, sys.argv[1], sys.argv[2])
