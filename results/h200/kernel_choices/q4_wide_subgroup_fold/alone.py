"""Each decode row of a 16-row ragged pass against the same step alone: logits bitwise equal?"""
import sys

import anyio
import numpy as np

import async_runtime as ar


async def main(path, rows):
    async with await ar.load(path, max_batch=rows) as model:
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, 5000, 3 + i % 9) for i in range(rows)]

        async def prefill():
            sessions = []
            for p in prompts:  # one at a time: each prefill alone
                s = await model.open_session()
                await s.execute(p[None], np.array([0]))
                sessions.append(s)
            return sessions

        tokens = [np.array([[int(rng.integers(0, 5000))]]) for _ in range(rows)]
        sessions = await prefill()
        alone = [(await s.execute(t, np.array([len(p)])))[0] for s, t, p in zip(sessions, tokens, prompts)]
        for s in sessions:
            await s.aclose()
        sessions = await prefill()
        together = [None] * rows

        async def step(i):
            together[i] = (await sessions[i].execute(tokens[i], np.array([len(prompts[i])])))[0]

        before = model.statistics().submits
        async with anyio.create_task_group() as tg:
            for i in range(rows):
                tg.start_soon(step, i)
        same = [bool(np.array_equal(a, t)) for a, t in zip(alone, together)]
        diff = max(float(np.abs(a - t).max()) for a, t in zip(alone, together))
        print(f"{rows} rows: bitwise alone {sum(same)}/{rows}, max diff {diff:g}, submits {model.statistics().submits - before}")
        for s in sessions:
            await s.aclose()


for r in sys.argv[2].split(","):
    anyio.run(main, sys.argv[1], int(r))
