"""Which 4-bit rewrite makes q4_fused_263_f16 differ from its unfused graph on this GPU: the graph with every
rewrite, without the residual one, without the groups, against the unfused graph (GPU variants).

PTE_WGPU_EXPORT_DIR=... python3 which.py"""
import os

import anyio
import numpy as np
from pte_wgpu.kernels import fusion

import async_runtime as ar

STORE = os.environ["PTE_WGPU_EXPORT_DIR"]
NONE = lambda graph: 0  # noqa: E731


async def load(name, **off):
    saved = {k: getattr(fusion, k) for k in off}
    for k, v in off.items():
        setattr(fusion, k, v)
    try:
        return await ar.load(open(f"{STORE}/{name}.pte", "rb").read())
    finally:
        for k, v in saved.items():
            setattr(fusion, k, v)


async def main():
    name = "q4_fused_263_f16"
    plain = await load(name, Q4_LINEAR="-")
    variants = {"all": {}, "no residual": {"_fuse_residual": NONE}, "no groups": {"_fuse_groups": NONE},
                "neither": {"_fuse_residual": NONE, "_fuse_groups": NONE}}
    for what, off in variants.items():
        model = await load(name, **off)
        print(what, [n.split(".")[-1] for n, _ in model.graph.calls if "q4" in n or "add" in n], flush=True)
        rng = np.random.default_rng(1)
        for m in (1, 17, 263):
            x = rng.standard_normal((m, 64)).astype(np.float16)
            got, want = await model.execute(x), await plain.execute(x)
            print(f"  {m:4d} rows:", ", ".join(f"{int((g != w).sum())}/{g.size}" for g, w in zip(got, want)), flush=True)


anyio.run(main)
