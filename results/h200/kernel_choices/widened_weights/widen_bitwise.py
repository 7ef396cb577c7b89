"""A prompt's logits with the weights widened to f32 first and with the dequantizing GEMM: bitwise?"""
import sys

import anyio
import numpy as np
from pte_wgpu.kernels.matmul import gemm

import async_runtime as ar


async def logits(path, lengths):
    out = {}
    async with await ar.load(path) as model:
        for n in lengths:
            async with model.session() as s:
                prompt = (np.arange(n)[None] * 7919) % 32000
                (out[n],) = await s.execute(prompt, np.array([0]))
    return out


async def main(path, lengths):
    widened = await logits(path, lengths)
    gemm.WIDEN_MIN_ROWS = 1 << 30
    plain = await logits(path, lengths)
    for n in lengths:
        a, b = np.asarray(widened[n]), np.asarray(plain[n])
        print(n, "rows: bitwise" if np.array_equal(a, b) else f"rows: DIFFER max {np.abs(a - b).max()}", a.shape, float(np.abs(a).max()))


anyio.run(main, sys.argv[1], [int(x) for x in sys.argv[2].split(",")])
