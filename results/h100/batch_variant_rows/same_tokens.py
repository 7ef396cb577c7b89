"""N sessions decoding together, loaded batch-invariant and not: greedy tokens and logits compared,
each against the session alone (the invariant load, one session at a time).

    python same_tokens.py model.pte SESSIONS STEPS"""
import sys
import anyio
import numpy as np
import async_runtime as ar

path, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


async def run(model, prompts, together=True):
    toks, logits = [[] for _ in prompts], [[] for _ in prompts]

    async def one(i):
        async with model.session() as s:
            (out,) = await s.execute(prompts[i][None], np.array([0]))
            pos = len(prompts[i])
            for _ in range(steps):
                t = int(out.argmax())
                toks[i].append(t)
                logits[i].append(out.astype(np.float32).ravel())
                (out,) = await s.execute(np.array([[t]]), np.array([pos]))
                pos += 1

    if together:
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    else:
        for i in range(len(prompts)):
            await one(i)
    return toks, logits


async def main():
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 1000, int(rng.integers(3, 12))) for _ in range(n)]
    res = {}
    for invariant in (True, False):
        async with await ar.load(path, batch_invariant=invariant, max_batch=32) as m:
            res[invariant] = await run(m, prompts)
            if invariant:
                res["alone"] = await run(m, prompts, together=False)
    for name in (True, False):
        toks, logits = res[name]
        same = sum(a == b for t, u in zip(toks, res["alone"][0]) for a, b in zip(t, u))
        diff = max(float(np.abs(a - b).max()) for got, want in zip(logits, res["alone"][1]) for a, b in zip(got, want))
        scale = max(float(np.abs(b).max()) for r in res["alone"][1] for b in r)
        print(f"batch_invariant={name}: {same} of {n * steps} greedy tokens as alone; largest logit difference {diff:.4g} (largest logit {scale:.4g})")

anyio.run(main)
