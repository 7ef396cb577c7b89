"""Per-dispatch GPU time of one execute of an int8 export (async_runtime/tools/profile.py: each
dispatch in a timestamped pass of its own), the q8ta ops' dispatches split into the tiled product
and the word kernel, and the slowest dispatches with their grids.

    python dispatch_times.py MODEL.pte [--shape 1,3,224,224] [--no-matrices]

On Dawn the timestamps are the driver's ticks (1 ns on NVIDIA); --no-matrices loads the export
without the int8 subgroup matrices (the dot4I8Packed products).
"""

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import anyio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import async_runtime as ar  # noqa: E402
import async_runtime.model as runtime_model  # noqa: E402
from async_runtime import backend  # noqa: E402
from async_runtime.tools.profile import Profiler, enable_timestamp_normalization  # noqa: E402

if backend.NAME != "dawn":
    enable_timestamp_normalization()


def kind(shader):
    if "subgroupMatrixLoad" in shader:
        return "product (int8 matrices)"
    if "dot4I8Packed(x0" in shader:
        return "product (dot4I8Packed)"
    return "word kernel" if "parts[" in shader else "other"


async def main(args):
    x = np.random.default_rng(0).standard_normal(args.shape).astype(np.float32)
    if args.no_matrices:
        runtime_model.INT8_MATRIX = None
    async with await ar.load(args.model) as model:
        await model.execute(x)
        session = await model.open_session()
        prof = Profiler(model)
        session.profiler = prof
        for _ in range(3):
            await session.execute(x)
        await prof.collect()
        grids = session.state.grids
        per = defaultdict(list)
        for step, _, did, op, b, e in prof.records:
            per[did].append((e - b) / 1e3)
        rows = []
        for did, times in per.items():
            d = model.graph.dispatches[did]
            rows.append((float(np.median(times)), d.op, kind(d.shader or ""), tuple(grids[did])))
        total = sum(r[0] for r in rows)
        by = defaultdict(float)
        for t, op, k, _ in rows:
            by[(op, k)] += t
        print(f"== {Path(args.model).name}: {total:.0f} us of dispatch time, {len(rows)} dispatches")
        for (op, k), t in sorted(by.items(), key=lambda kv: -kv[1])[:10]:
            print(f"  {op:<45} {k:<26} {t:8.1f} us {100 * t / total:5.1f}%")
        print("  slowest dispatches:")
        for t, op, k, grid in sorted(rows, reverse=True)[:12]:
            print(f"    {t:7.1f} us  {op:<40} {k:<26} grid {grid}")
        await session.aclose()


p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--shape", type=lambda v: tuple(int(d) for d in v.split(",")), default=(1, 3, 224, 224))
p.add_argument("--no-matrices", action="store_true")
anyio.run(main, p.parse_args())
