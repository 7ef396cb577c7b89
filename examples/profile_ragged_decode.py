"""Per-op GPU time of a Llama export's ragged decode passes at 1 and 32 rows (or the row counts
given): each dispatch in a timestamped pass of its own (async_runtime/tools/profile.py), summed by
op, with its GB/s.

    python examples/profile_ragged_decode.py model.pte [1,32,64] [--prompt 8] [--whole-steps] [--by-dispatch] [--batch-variant]

Each session's prompt is `--prompt` tokens long (8 by default), so the decode passes attend to
about that many keys. `--whole-steps` times the passes as they run unprofiled instead (GPU time
from a pass's first dispatch to its last): per-dispatch passes inflate small dispatches and can
rank kernel variants wrongly. `--by-dispatch` lists each dispatch of the passes in graph order
(its median time over the passes, and a GEMM's tile) in place of the sums by op. `--batch-variant`
loads the model with `batch_invariant=False`.
"""
import re
import sys
import time
from collections import defaultdict

import anyio
import numpy as np

import async_runtime as ar
from async_runtime.tools.profile import Profiler, enable_timestamp_normalization

units = enable_timestamp_normalization()

def gemm_tile(shader):
    """"BM x BN, R x C an invocation" of a GEMM template's dispatch (kernels/matmul/gemm.py's Tile),
    "BM x BN on subgroup matrices" of its matrix tiles (kernels/matmul/f16_matrix.py), else ""."""
    matrix = re.search(r"two buffers of \[(\d+) rows\].*\n.*two buffers of \[(\d+) columns\]", shader or "")
    if matrix:
        return f"{matrix[1]} x {matrix[2]} on subgroup matrices"
    size = re.search(r"@workgroup_size\(16, (\d+)\)", shader or "")
    accs = re.findall(r"var c(\d+)_\d+_(\d+) = vec4", shader or "")
    if "var<workgroup> As" not in (shader or "") or not size or not accs:
        return ""
    rq, cq = (1 + max(int(a[i]) for a in accs) for i in (0, 1))
    return f"{4 * int(size[1]) * rq} x {64 * cq}, {4 * rq} x {4 * cq}"


def by_dispatch(prof, graph, steps):
    """Each dispatch's median time over `steps`, in graph order."""
    times = defaultdict(list)
    for step, _, did, _, begin, end in prof.records:
        if step in steps:
            times[did].append((end - begin) * prof._scale_us())
    for did in sorted(times):
        d = graph.dispatches[did]
        print(f"  {did:5d} {d.op:40s} {np.median(times[did]):8.1f} us  {gemm_tile(d.shader)}")


async def warm_up(sessions, pos, most, seconds=2.0):
    """Unprofiled decode steps for `seconds` (at most `most`, none if it is not positive), from
    position `pos`: a GPU idle before the call runs its first passes at low clocks (an H100 read
    345 MHz, and a first profile twice its time; half a second after a model's load left an H100's
    16-row passes 2.3x slow). The position the profiled steps go on from."""
    t0 = time.perf_counter()
    while most > 0 and time.perf_counter() - t0 < seconds:
        async with anyio.create_task_group() as tg:
            for s in sessions:
                tg.start_soon(s.execute, np.array([[5]]), np.array([pos]))
        pos, most = pos + 1, most - 1
    return pos


async def main(path, row_counts, prompt, whole_steps, dispatches, invariant):
    async with await ar.load(path, max_batch=max(row_counts), batch_invariant=invariant) as model:
        prof = Profiler(model, units, whole_steps=whole_steps)
        runner = model._batcher.runner
        for rows in row_counts:
            sessions = [await model.open_session() for _ in range(rows)]
            async with anyio.create_task_group() as tg:
                for s in sessions:
                    tg.start_soon(s.execute, np.arange(prompt)[None] % 64, np.array([0]))
            pos = await warm_up(sessions, prompt, min(512, ar.context_length(model) - prompt - 3))  # room for the 3 profiled steps
            runner.profiler = prof
            for k in range(3):
                prof.label_next_step(f"rows{rows}")
                async with anyio.create_task_group() as tg:
                    for s in sessions:
                        tg.start_soon(s.execute, np.array([[5]]), np.array([pos + k]))
            runner.profiler = None
            for s in sessions:
                await s.aclose()
        await prof.collect()
        for rows in row_counts:
            steps = prof.steps_labelled(f"rows{rows}")
            tab = prof.op_table(steps)
            tot = sum(r["total_us"] for r in tab) / len(steps)
            if whole_steps:
                print(f"== {rows} rows: {tot:.0f} us of GPU time a pass (real passes, {len(steps)} of them)")
                continue
            print(f"== {rows} rows: {tot:.0f} us of dispatch time a pass (sum of per-dispatch passes), {sum(r['count'] for r in tab)//len(steps)} dispatches")
            if dispatches:
                by_dispatch(prof, model.graph, steps)
                continue
            for r in tab[:12]:
                print(f"  {r['op']:40s} n={r['count']//len(steps):4d} {r['total_us']/len(steps):8.1f} us  mean {r['mean_us']:6.1f}  {100*r['share']:5.1f}%  {r['gb_per_s']:7.1f} GB/s")

args = sys.argv[1:]
prompt = int(args.pop(args.index("--prompt") + 1)) if "--prompt" in args else 8
whole, dispatches, variant = "--whole-steps" in args, "--by-dispatch" in args, "--batch-variant" in args
args = [a for a in args if a not in ("--prompt", "--whole-steps", "--by-dispatch", "--batch-variant")]
anyio.run(main, args[0], [int(r) for r in (args[1] if len(args) > 1 else "1,32").split(",")], prompt, whole, dispatches, not variant)
