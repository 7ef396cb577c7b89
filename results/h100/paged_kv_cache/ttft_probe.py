"""Where a cached request's time to first token goes: wall times of steps, and per-op GPU time of the 32-row step at 1024."""
import sys, time, statistics
import anyio, numpy as np
import async_runtime as ar
from async_runtime.tools.profile import Profiler, enable_timestamp_normalization
units = enable_timestamp_normalization()

async def timed(coro):
    t0 = time.perf_counter(); r = await coro; return time.perf_counter() - t0, r

async def main(path):
    rng = np.random.default_rng(0)
    async with await ar.load(path) as model:
        V = model.outputs[0].max_shape[-1]
        import os; SYS = int(os.environ.get("SYS", 1024)); system = rng.integers(0, V, SYS)
        runner = model._batcher.runner
        res = {k: [] for k in ("exec32_at0", "exec32_at1024_cached", "exec1_at1056", "gen1_cached", "exec1056_at0")}
        for i in range(8):
            user = rng.integers(0, V, 32)
            async with model.session() as s:
                t, _ = await timed(s.execute(user[None], np.array([0]))); res["exec32_at0"].append(t)
            async with model.session() as s:
                t, _ = await timed(s.execute(np.concatenate([system, user])[None], np.array([0]))); res["exec1056_at0" if i == 0 else "exec32_at1024_cached"].append(t)
                t, _ = await timed(s.execute(user[:1][None], np.array([SYS + 32]))); res["exec1_at1056"].append(t)
            async with model.session() as s:
                t0 = time.perf_counter()
                async for tok in ar.generate(s, np.concatenate([system, rng.integers(0, V, 32)]).tolist(), max_new_tokens=1):
                    res["gen1_cached"].append(time.perf_counter() - t0)
        for k, v in res.items():
            print(f"{k:24s} median {statistics.median(v)*1e3:7.2f} ms  all {[round(x*1e3,1) for x in v]}")
        for whole in (True, False):
            prof = Profiler(model, units, whole_steps=whole)
            async with model.session() as s:
                runner.profiler = prof
                prof.label_next_step("c")
                await s.execute(np.concatenate([system, rng.integers(0, V, 32)])[None], np.array([0]))
                prof.label_next_step("d")
                await s.execute(np.array([[5]]), np.array([SYS + 32]))
                runner.profiler = None
            await prof.collect()
            for lab in ("c", "d"):
                steps = prof.steps_labelled(lab); tab = prof.op_table(steps)
                print(f"== whole={whole} {lab}: {sum(r['total_us'] for r in tab)/len(steps):.0f} us, {sum(r['count'] for r in tab)//len(steps)} dispatches")
                if not whole:
                    for r in tab[:12]:
                        print(f"  {r['op']:40s} n={r['count']//len(steps):4d} {r['total_us']/len(steps):9.1f} us")
        print(model.statistics())
anyio.run(main, sys.argv[1])
