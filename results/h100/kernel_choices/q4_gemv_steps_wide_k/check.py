"""On the GPU: the 4-bit cases against eager (tolerance) and each row of a pass against the row alone (bitwise)."""
import sys
import anyio
import numpy as np
import async_runtime as ar

async def main(d):
    for name in ("q4_k2080", "q4_k2112_g96", "normed"):
        z = np.load(f"{d}/{name}.npz")
        async with await ar.load(f"{d}/{name}.pte") as model:
            worst = 0.0
            for m in (1, 5, 16, 17):
                x = z[f"x{m}"]
                got = await model.execute(x)
                for i, g in enumerate(got):
                    w = z[f"y{m}_{i}"]
                    err = float(np.max(np.abs(g - w)) / (np.max(np.abs(w)) + 1e-9))
                    worst = max(worst, err)
            x = z["x16"]
            alone = [await model.execute(x[i:i + 1]) for i in range(16)]
            whole = await model.execute(x)
            same = all(np.array_equal(whole[o][i], alone[i][o][0]) for i in range(16) for o in range(len(whole)))
            shuffles = sum("subgroupShuffleXor" in (dd.shader or "") for dd in model.graph.dispatches)
            print(f"{name}: worst rel err vs eager {worst:.2e}; 16 rows bitwise alone: {same}; rows-kernel dispatches built: {shuffles}; subgroups {model.subgroups}")

anyio.run(main, sys.argv[1])
