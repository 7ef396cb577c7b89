"""Per-op GPU time of a Llama export's prompt passes (prefill) at the prompt lengths given: each
dispatch in a timestamped pass of its own (async_runtime/tools/profile.py), summed by op, with
its GB/s, after one unprofiled prompt of the same length (of other tokens: no cached prefix).

    python examples/profile_prefill.py model.pte [512,2047]
"""

import sys

import anyio
import numpy as np

import async_runtime as ar
from async_runtime.tools.profile import Profiler, enable_timestamp_normalization

units = enable_timestamp_normalization()


async def main(path, lengths):
    async with await ar.load(path) as model:
        prof = Profiler(model, units)
        runner = model._batcher.runner if model._batcher is not None else None
        for n in lengths:
            async with model.session() as s:
                # tokens of this length's own: a prompt sharing whole blocks of keys with an earlier
                # one would find them cached and run only its tail
                prompt = np.random.default_rng(n).integers(0, 1000, (1, n))
                await s.execute(prompt, np.array([0]))  # first use of this length: not timed
                target = runner or s
                target.profiler = prof
                prof.label_next_step(f"prompt of {n} tokens")
                # another prompt: the same one again would find its blocks of keys cached and run only its tail
                await s.execute((prompt + 1) % 1000, np.array([0]))
                target.profiler = None
        await prof.collect()
        for n in lengths:
            steps = prof.steps_labelled(f"prompt of {n} tokens")
            tab = prof.op_table(steps)
            total = sum(r["total_us"] for r in tab) / len(steps)
            count = sum(r["count"] for r in tab) // len(steps)
            print(f"== prompt of {n} ({model.precision}, f16 matrices {model.f16_matrices}): {total:.0f} us of dispatch time (sum of per-dispatch passes), {count} dispatches")
            for r in tab[:14]:
                print(f"  {r['op']:40s} n={r['count'] // len(steps):4d} {r['total_us'] / len(steps):9.1f} us  {100 * r['share']:5.1f}%  {r['gb_per_s']:7.1f} GB/s")


anyio.run(main, sys.argv[1], list(dict.fromkeys(int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "512,2047").split(","))))
