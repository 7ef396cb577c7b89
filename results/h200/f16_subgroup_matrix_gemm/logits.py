"""The last logits of a prompt of 300 tokens (its products on the f16 matrices on Dawn) and of one decode step after it,
saved as logits_<backend>.npy in $OUT; with --compare, the two backends' files against each other.

PTE_WGPU_BACKEND=dawn python3 logits.py model.pte; python3 logits.py --compare"""
import os
import sys

import numpy as np

OUT = os.environ.get("OUT", ".")

if sys.argv[1] == "--compare":
    a, b = (np.load(f"{OUT}/logits_{name}.npy") for name in ("wgpu-native", "dawn"))
    for i, what in enumerate(("prompt of 300", "decode step")):
        print(f"{what}: max |dawn - wgpu-native| {np.abs(a[i] - b[i]).max():.4g} of max |logit| {np.abs(a[i]).max():.4g};",
              f"argmax {a[i].argmax()} / {b[i].argmax()}; top-5 shared {len(set(np.argsort(a[i])[-5:]) & set(np.argsort(b[i])[-5:]))}")
    sys.exit()

import anyio  # noqa: E402

import async_runtime as ar  # noqa: E402


async def main(path):
    async with await ar.load(path) as model:
        print(model.device_info.name, model.precision, "f16 matrices", model.f16_matrices, flush=True)
        async with model.session() as s:
            (prompt,) = await s.execute(np.random.default_rng(0).integers(0, 1000, (1, 300)), np.array([0]))
            (step,) = await s.execute(np.array([[7]]), np.array([300]))
        logits = np.stack([np.asarray(prompt, np.float32).reshape(-1, prompt.shape[-1])[-1], np.asarray(step, np.float32).reshape(-1)])
        np.save(f"{OUT}/logits_{os.environ.get('PTE_WGPU_BACKEND', 'wgpu-native')}.npy", logits)


anyio.run(main, sys.argv[1])
