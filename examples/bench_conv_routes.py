"""The convolution routes side by side in one process: one `.pte` loaded twice, once with every
route of kernels/vision/conv.py (the implicit GEMM where it applies) and once with the direct kernels
only, run alternately on the same input; then one profiled execute of each (GPU timestamps), the
top ops and every convolution's time on both routes.

    python examples/bench_conv_routes.py vision_models/resnet50_b1.pte --runs 5 [--json out.json]

Needs only pte-wgpu (no torch): the input is random, of the file's maximum shapes. Profiled
executes time each dispatch in its own pass: compare the convolutions' ratios, not the sums.
"""

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import anyio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_runtime.tools.profile import Profiler, enable_timestamp_normalization  # noqa: E402

CONVOLUTIONS = ("aten.convolution.default", "et_vk.conv_with_clamp.default", "aten::convolution.out")
ROUTES = ("all", "direct")
TOP_OPS = 8


async def load(path, routes):
    """The model, built with every convolution route ("all") or the direct kernels only."""
    import async_runtime as ar
    from pte_wgpu.kernels.vision import conv

    table = conv.CONV_VARIANTS
    if routes == "direct":
        conv.CONV_VARIANTS = tuple(v for v in table if v.name == "direct")
    try:
        return await ar.load(path)
    finally:
        conv.CONV_VARIANTS = table


def _output_of(dispatch):
    """The output binding of a convolution's dispatch: the one just before its first uniform."""
    from pte_wgpu.kernels.registry import Params

    first = next(i for i, v in enumerate(dispatch.bindings) if isinstance(v, Params))
    return dispatch.bindings[first - 1]


async def profile(model, inputs):
    """(the op table, {convolution output id: µs}, the live dims) of one profiled execute."""
    profiler = Profiler(model)
    if not profiler.supported:
        return None, {}, {}
    session = await model.open_session()
    session.profiler = profiler
    await session.execute(*inputs)
    await profiler.collect()
    per_conv = defaultdict(float)
    for _, _, did, op, begin, end in profiler.records:
        if op in CONVOLUTIONS:
            per_conv[_output_of(model.graph.dispatches[did])] += (end - begin) * 1e-3
    dims = list(session.state.dims)
    await session.aclose()
    return profiler.op_table(), per_conv, dims


async def main(args):
    models = {r: await load(args.pte, r) for r in ROUTES}
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(i.max_shape).astype(np.float32) for i in models["all"].inputs]
    times, outs = {r: [] for r in ROUTES}, {}
    for i in range(args.warmup + args.runs):
        for r, model in models.items():
            t = time.perf_counter()
            outs[r] = await model.execute(*inputs)
            if i >= args.warmup:
                times[r].append(time.perf_counter() - t)
    ms = {r: statistics.median(t) * 1e3 for r, t in times.items()}
    diff = max(float(np.abs(a - b).max()) for a, b in zip(outs["all"], outs["direct"]))
    print(f"{Path(args.pte).name} on {models['all'].device_info.name}: median of {args.runs}")
    print(f"  all routes {ms['all']:.2f} ms, direct only {ms['direct']:.2f} ms: {ms['direct'] / ms['all']:.2f}x; max |diff| {diff:.2e}")
    result = dict(file=Path(args.pte).name, device=models["all"].device_info.name, runs=args.runs, ms=ms, max_abs_diff=diff)
    profiles = {r: await profile(m, inputs) for r, m in models.items()}
    if profiles["all"][0] is not None:
        for r, (table, _, _) in profiles.items():
            print(f"  top ops, {r}:")
            for row in table[:TOP_OPS]:
                print(f"    {row['op']:<38} {row['count']:>4} {row['total_us'] / 1e3:10.2f} ms {row['share']:6.1%}")
        (_, per_all, dims), (_, per_direct, _) = profiles["all"], profiles["direct"]
        print("  each convolution (output dims): all routes ms, direct ms, direct / all")
        rows = []
        for out in sorted(per_all, key=lambda o: -per_direct[o]):
            a, d = per_all[out] / 1e3, per_direct[out] / 1e3
            rows.append(dict(out=list(dims[out]), all_ms=a, direct_ms=d))
            print(f"    {str(tuple(dims[out])):<24} {a:9.3f} {d:9.3f} {d / max(a, 1e-9):6.2f}x")
        result.update(top_ops={r: p[0][:TOP_OPS] for r, p in profiles.items()}, convolutions=rows)
    for m in models.values():
        await m.aclose()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pte")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--json")
    args = p.parse_args()
    enable_timestamp_normalization()  # before the first adapter
    anyio.run(main, args)
