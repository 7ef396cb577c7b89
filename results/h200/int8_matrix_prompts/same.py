"""Logits of one prompt with and without the int8 matrices, in one process."""
import asyncio, sys
import numpy as np
import async_runtime as ar
import async_runtime.model as am
pte = sys.argv[1]
async def main():
    keep = am.INT8_MATRIX
    outs = {}
    for label in ("gemm", "matrices"):
        am.INT8_MATRIX = keep if label == "matrices" else None
        model = await ar.load(pte, max_batch=32)
        async with model:
            n_matrix = sum(1 for d in model.graph.dispatches if d.shader and "subgroupMatrixLoad" in d.shader)
            print(label, "int8_matrices", model.int8_matrices, "matrix dispatches", n_matrix, flush=True)
            vocab = model.outputs[0].max_shape[-1]
            rng = np.random.default_rng(1)
            for n in (40, 512, 2047):
                async with model.session() as s:
                    (o,) = await s.execute(rng.integers(0, vocab, (1, n)), np.array([0]))
                    outs[label, n] = np.asarray(o, np.float64)
    for n in (40, 512, 2047):
        a, b = outs["gemm", n], outs["matrices", n]
        print(f"prompt {n}: shape {a.shape} max abs diff {np.abs(a - b).max():.3e} of max {np.abs(a).max():.3e}; argmax equal {(a.reshape(-1, a.shape[-1]).argmax(-1) == b.reshape(-1, b.shape[-1]).argmax(-1)).mean()}", flush=True)
asyncio.run(main())
