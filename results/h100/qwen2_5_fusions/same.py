"""Logits of a prompt and decode steps with the family fusions on and off, in one process on the GPU:
Qwen2.5's biased q/k/v group (kernels/fusion.py's _fuse_groups), its rotate-half RoPE in that
group's kernel (_fuse_rope_into_groups), Qwen3's paired q/k norms (_pair_norms) and those with
the RoPE after them (_fuse_norms_into_rope). python3 same.py MODEL.pte [MODEL.pte ...]; prints whether every step's logits are equal."""

import sys

import anyio
import numpy as np
from pte_wgpu.kernels import fusion

import async_runtime as ar

OFF = {name: getattr(fusion, name) for name in ("_fuse_groups", "_fuse_rope_into_groups", "_pair_norms", "_fuse_norms_into_rope")}


async def logits(path, off):
    for name in off:
        setattr(fusion, name, lambda graph, *rest: 0)
    try:
        model = await ar.load(path)
    finally:
        for name, f in OFF.items():
            setattr(fusion, name, f)
    names = [n for n, _ in model.graph.calls]
    tokens = np.random.default_rng(5).integers(0, 1000, (1, 40))
    out = []
    async with model.session() as s:
        out.append(await s.execute(tokens[:, :33], np.array([0])))
        for pos in range(33, 40):
            out.append(await s.execute(tokens[:, pos : pos + 1], np.array([pos])))
    await model.aclose()
    return names, [o[0] for o in out]


async def main():
    for path in sys.argv[1:]:
        for off in ([name] for name in OFF):
            (fused_names, fused), (plain_names, plain) = await logits(path, ()), await logits(path, off)
            if fused_names == plain_names:
                continue  # nothing of this fusion in the model
            same = all(np.array_equal(a, b) for a, b in zip(fused, plain))
            worst = max(float(np.abs(a - b).max()) for a, b in zip(fused, plain))
            print(f"{path.split('/')[-1]} {off[0]} off: {len(plain_names)} calls against {len(fused_names)}; logits equal at every step: {same} (largest difference {worst:.3g})")


anyio.run(main)
