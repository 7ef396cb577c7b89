"""The sha256 of a model's logits for a few prompts (and their first values): the same under two
versions of the loader means the weights reached the same bytes. usage: python logits_digest.py MODEL.pte"""
import hashlib
import sys

import anyio
import numpy as np

import async_runtime as ar


async def main(path):
    async with await ar.load(path) as model:
        for prompt in ([1, 17, 400], [9000, 5, 128000, 77, 3, 2], [42]):
            async with model.session() as s:
                (logits,) = await s.execute(np.array([prompt], np.int64), np.array([0], np.int64))
            print(len(prompt), hashlib.sha256(logits.tobytes()).hexdigest()[:16], logits.ravel()[:4], float(np.abs(logits).max()), flush=True)


anyio.run(main, sys.argv[1])
