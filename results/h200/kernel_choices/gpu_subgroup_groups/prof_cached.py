"""Per-op GPU time of a 32-row pass at position 1024 (a cached system prompt's follow-up)."""
import sys, time, statistics
import anyio
import numpy as np
import async_runtime as ar
from async_runtime.tools.profile import Profiler, enable_timestamp_normalization

units = enable_timestamp_normalization()

async def main(path, system=1024, user=32):
    async with await ar.load(path) as model:
        prof = Profiler(model, units)
        runner = model._batcher.runner if model._batcher is not None else None
        async with model.session() as s:
            await s.execute((np.arange(system)[None] % 1000), np.array([0]))
            q = np.arange(user)[None] % 1000 + 7
            walls = []
            for i in range(6):
                t0 = time.perf_counter(); await s.execute(q, np.array([system])); walls.append(time.perf_counter() - t0)
            print(f"wall of a {user}-row execute at {system}: median {statistics.median(walls[1:])*1e3:.2f} ms")
            target = runner or s
            target.profiler = prof
            prof.label_next_step("c")
            await s.execute(q, np.array([system]))
            target.profiler = None
        await prof.collect()
        steps = prof.steps_labelled("c")
        tab = prof.op_table(steps)
        total = sum(r["total_us"] for r in tab) / len(steps)
        print(f"== {total:.0f} us dispatch time, {sum(r['count'] for r in tab) // len(steps)} dispatches")
        for r in tab[:12]:
            print(f"  {r['op']:40s} n={r['count'] // len(steps):4d} {r['total_us'] / len(steps):9.1f} us  {100 * r['share']:5.1f}%")

anyio.run(main, sys.argv[1])
