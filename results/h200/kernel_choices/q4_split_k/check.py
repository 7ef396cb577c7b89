"""The logits of a prompt of 9 tokens and one decode step, saved to compare two builds."""
import sys

import anyio
import numpy as np

import async_runtime as ar


async def main(path, out):
    async with await ar.load(path, max_batch=4) as model:
        s = await model.open_session()
        p = np.random.default_rng(0).integers(0, 5000, 9)
        a = (await s.execute(p[None], np.array([0])))[0]
        b = (await s.execute(np.array([[123]]), np.array([9])))[0]
        np.savez(out, prompt=np.asarray(a, np.float64), step=np.asarray(b, np.float64))


anyio.run(main, sys.argv[1], sys.argv[2])
