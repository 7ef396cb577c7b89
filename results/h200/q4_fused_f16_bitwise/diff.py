"""The fused 4-bit ops against the unfused graph (kernels/fusion.py's 4-bit rewrites off), f16 and f32 rows, on
this machine's GPU: per output, the largest difference against the largest value, and how many differ. GPU variants.

PTE_WGPU_EXPORT_DIR=... python3 diff.py   (the store's q4_fused_263[_f16].pte and q4_fused_normed[_f16].pte)"""
import os

import anyio
import numpy as np
from pte_wgpu.kernels import fusion

import async_runtime as ar

STORE = os.environ["PTE_WGPU_EXPORT_DIR"]


async def load(name, fused):
    q4 = fusion.Q4_LINEAR
    if not fused:
        fusion.Q4_LINEAR = "-"
    try:
        return await ar.load(open(f"{STORE}/{name}.pte", "rb").read())
    finally:
        fusion.Q4_LINEAR = q4


async def main():
    for name, k, rows in (("q4_fused_263", 64, (1, 5, 17, 40, 263)), ("q4_fused_normed", 2048, (1, 2, 17, 24))):
        for half in (False, True):
            file = name + ("_f16" if half else "")
            fused, plain = await load(file, True), await load(file, False)
            print(f"{file}: {fused.precision}, {len(fused.graph.calls)} ops fused, {len(plain.graph.calls)} unfused", flush=True)
            rng = np.random.default_rng(1)
            for m in rows:
                x = rng.standard_normal((m, k)).astype(np.float16 if half else np.float32)
                got, want = await fused.execute(x), await plain.execute(x)
                for i, (g, w) in enumerate(zip(got, want)):
                    g32, w32 = g.astype(np.float32), w.astype(np.float32)
                    d = np.abs(g32 - w32)
                    print(f"  {m:4d} rows, output {i}: max |diff| {d.max():.3g} of max |value| {np.abs(w32).max():.3g}, "
                          f"{int((d > 0).sum())} of {d.size} differ", flush=True)


anyio.run(main)
