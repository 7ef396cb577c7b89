"""The int8 convolutions' routes on one export, in one process: the direct kernels, the tiled
product (dot4I8Packed) and, on Dawn where the adapter offers int8 subgroup matrices, the tiled
product on the matrices. Each model's outputs are compared bitwise with the direct route's on the
same input, and each is timed (median of --runs executes, numpy in to numpy out); with --torch,
torch eager fp32 on the float module of the export (examples/bench_vision.py's manifest) too.

    python routes.py MODEL.pte [--runs 20] [--torch MANIFEST_DIR]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import anyio
import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import async_runtime as ar  # noqa: E402
import async_runtime.model as runtime_model  # noqa: E402
from pte_wgpu.kernels.quant import int8_conv  # noqa: E402


async def timed(path, x, runs, patches):
    """(median seconds, outputs, whether the product ran on matrices) with the module attributes
    `patches` ((module, name) -> value) in place while loading."""
    saved = {key: getattr(*key) for key in patches}
    for (module, name), value in patches.items():
        setattr(module, name, value)
    try:
        model = await ar.load(path)
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)
    async with model:
        outs = await model.execute(x)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            await model.execute(x)
            times.append(time.perf_counter() - t)
        matrices = any("subgroupMatrixLoad" in (d.shader or "") for d in model.graph.dispatches)
        return statistics.median(times), outs, matrices, model.device_info.name


async def main(args):
    x = np.random.default_rng(0).standard_normal(args.shape).astype(np.float32)
    routes = {
        "direct": {(int8_conv, "tiled"): lambda *a: False},
        "tiled, dot4I8Packed": {(runtime_model, "INT8_MATRIX"): None},
        "tiled": {},
    }
    results = {}
    for name, patches in routes.items():
        results[name] = await timed(args.model, x, args.runs, patches)
    device = results["direct"][3]
    print(f"== {Path(args.model).name} on {device}, input {args.shape}")
    base = results["direct"]
    for name, (seconds, outs, matrices, _) in results.items():
        same = all(np.array_equal(a, b) for a, b in zip(outs, base[1], strict=True))
        label = name + (" (int8 matrices)" if matrices else "")
        print(f"  {label:<34} {seconds * 1e3:8.2f} ms  {base[0] / seconds:5.2f}x direct  bitwise the direct route's: {same}")
    if args.torch:
        sys.argv = [sys.argv[0]]
        sys.path.insert(0, str(ROOT / "examples"))
        import json

        import torch

        import bench_vision

        entry = next(e for e in json.loads((Path(args.torch) / "manifest.json").read_text())["entries"] if e["file"] == Path(args.model).name)
        module = bench_vision.tiled_weights(bench_vision.build(entry["model"], entry["image"], entry["classes"]))
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        device = "cuda" if torch.cuda.is_available() else "cpu"
        seconds, _ = bench_vision.time_torch(module, x, args.runs, 3, device)
        print(f"  torch eager fp32 ({device})             {seconds * 1e3:8.2f} ms; tiled {seconds / results['tiled'][0]:.2f}x torch")


p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--runs", type=int, default=20)
p.add_argument("--shape", type=lambda v: tuple(int(d) for d in v.split(",")), default=(1, 3, 224, 224))
p.add_argument("--torch")
anyio.run(main, p.parse_args())
