"""Vision timings side by side in one run: pte-wgpu on MobileNet V2, ResNet-50 and ViT-B/16 exports
against torch eager (CUDA when available) on the same modules with the same weights.

    python examples/bench_vision.py export --out vision_models [--short] [--models mobilenet_v2,...]
    tar -C vision_models -cf - . | xz -9 > vision_models.tar.xz      # a few MB: carry this
    python examples/bench_vision.py run vision_models [--runs 20] [--json vision.json] [--profile]
    python examples/bench_vision.py export --int8 --out int8_models --models mobilenet_v2,resnet50

`export` needs ExecuTorch (the VulkanPartitioner); `run` needs only pte-wgpu and torch: the modules
come from tests/vision_models.py and tests/zoo_models.py, and their weights from `tiled_weights`
(a seed and a rule, written to manifest.json), so nothing but the `.pte` files travels. Every
weight tiles one small random block, and batch norms are identities, so folding them into the
convolutions scales every weight alike and the tiling survives into the `.pte`: xz finds the
repeats. Timings only; the predictions are noise.

Batch 1 and batch 8 are separate static exports: ExecuTorch delegates a convolution only at batch
1, so the batch-8 CNNs run their convolutions as portable ops (on the GPU here too). Latency is the
median of `--runs` calls after `--warmup`, from a numpy input to a numpy output, for torch too
(input upload, forward, output read back). The check compares the first output of pte-wgpu with
torch's (TF32 off) on one input. `export --int8` writes the CNNs quantized by ExecuTorch's static
int8 flow instead (XNNPACKQuantizer, per-channel weights, calibrated on the sample; batch 1): its
convolutions lower to q8ta ops, timed against torch eager fp32 on the float module (their outputs
differ by the quantization: `matches` is False, the error is reported). With `--profile`, one more execute of each model runs under the
GPU timestamp profiler (async_runtime/tools/profile.py) and its top ops by GPU time are printed
and written to the JSON (per-dispatch passes: use the shares, not the sum, as the step's time).
"""

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import anyio
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BLOCK_FLOATS = 1 << 14  # 64 KiB of random floats, tiled into every weight
ATOL, RTOL = 1e-3, 1e-3


def build(name, image, classes=1000):
    """The module for `name`: the same definitions the zoo tests use."""
    from tests.vision_models import MobileNetV2, ResNet50
    from tests.zoo_models import vit_b16

    makers = {"mobilenet_v2": lambda: MobileNetV2(classes), "resnet50": lambda: ResNet50(classes),
              "vit_b16": lambda: vit_b16(image, classes)}  # fmt: skip
    return makers[name]().eval()


MODELS = ("mobilenet_v2", "resnet50", "vit_b16")


def tiled_weights(module, seed=0):
    """Sets every parameter of `module` from one random block of BLOCK_FLOATS floats, tiled, with
    one distinct first element per tensor so no two constants are deduplicated; batch norms become
    identities. Weights are scaled by 1/sqrt(fan-in) rounded to a power of two: a handful of scaled
    blocks in all, so the bytes repeat across tensors, not only within one (1-D weights:
    1 + block/10, biases: block/10)."""
    import torch
    from torch import nn

    block = torch.randn(BLOCK_FLOATS, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(module.named_parameters())):
            flat = block.repeat(-(-p.numel() // BLOCK_FLOATS))[: p.numel()].clone()
            if p.dim() > 1:
                flat *= 2.0 ** -round(math.log2(p.numel() // p.shape[0]) / 2)
            else:
                flat = flat / 10 + (1.0 if name.endswith("weight") else 0.0)
            flat[0] = 0.5 + i * 1e-3
            p.copy_(flat.reshape(p.shape))
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.fill_(1.0), m.bias.zero_(), m.running_mean.zero_(), m.running_var.fill_(1.0)
    return module


def fold_batch_norms(module):
    """Each batch norm folded into the convolution before it (conv_bn's Sequential), as ExecuTorch's
    Vulkan lowering does at batch 1. At batch 8 the partitioner delegates neither, and pte-wgpu has
    no portable kernel for aten::_native_batch_norm_legit_no_training yet."""
    from torch import nn
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    for seq in [m for m in module.modules() if isinstance(m, nn.Sequential)]:
        for i in range(len(seq) - 1):
            if isinstance(seq[i], nn.Conv2d) and isinstance(seq[i + 1], nn.BatchNorm2d):
                seq[i], seq[i + 1] = fuse_conv_bn_eval(seq[i], seq[i + 1]), nn.Identity()
    return module


def export(args):
    import torch

    from tests.exporting import export_pte
    from tests.test_more_ops import _xnnpack_static, export_quantized

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for name in args.models:
        for batch in (1,) if args.int8 else (1, 8):
            file = f"{name}{'_int8' if args.int8 else ''}_b{batch}.pte"
            sample = (torch.randn(batch, 3, args.image, args.image),)
            t = time.perf_counter()
            make = lambda: fold_batch_norms(tiled_weights(build(name, args.image, args.classes), args.seed))  # noqa: E731
            pte, _ = export_quantized(file.removesuffix(".pte"), _xnnpack_static, sample, make_module=make) if args.int8 else export_pte(file, make, sample)
            (out / file).write_bytes(pte)
            entries.append(dict(model=name, batch=batch, image=args.image, classes=args.classes, file=file, int8=args.int8))
            print(f"{file}: {len(pte) / 2**20:.1f} MiB in {time.perf_counter() - t:.0f} s", flush=True)
    manifest = dict(seed=args.seed, block_floats=BLOCK_FLOATS, entries=entries)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


TOP_OPS = 8


async def time_wgpu(path, x, runs, warmup, profile=False):
    """(median seconds of an execute, the first output, the adapter's name, the profile's top ops
    or None)."""
    import async_runtime as ar
    from async_runtime.tools.profile import Profiler

    async with await ar.load(path) as model:
        for _ in range(warmup):
            await model.execute(x)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            (out, *_) = await model.execute(x)
            times.append(time.perf_counter() - t)
        ops = None
        profiler = Profiler(model)
        if profile and profiler.supported:
            session = await model.open_session()
            session.profiler = profiler
            await session.execute(x)
            await profiler.collect()
            await session.aclose()
            keep = ("op", "count", "total_us", "share")
            ops = [{k: r[k] for k in keep} for r in profiler.op_table()[:TOP_OPS]]
        return statistics.median(times), out, model.device_info.name, ops


def time_torch(module, x, runs, warmup, device):
    """(median seconds from a numpy input to a numpy output, that output)."""
    import torch

    module = module.to(device)

    def call():
        with torch.no_grad():
            return module(torch.from_numpy(x).to(device)).cpu().numpy()

    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def run(args):
    import torch

    from async_runtime.tools.profile import enable_timestamp_normalization

    if args.profile:
        enable_timestamp_normalization()  # before the first adapter
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = Path(args.folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    rows, meta = [], dict(torch_device=torch.cuda.get_device_name() if device == "cuda" else "cpu", runs=args.runs)
    for e in manifest["entries"]:
        if args.models and e["model"] not in args.models:
            continue
        x = np.random.default_rng(0).standard_normal((e["batch"], 3, e["image"], e["image"])).astype(np.float32)
        module = tiled_weights(build(e["model"], e["image"], e["classes"]), manifest["seed"])
        ours, got, meta["wgpu_device"], ops = anyio.run(time_wgpu, str(folder / e["file"]), x, args.runs, args.warmup, args.profile)
        theirs, want = time_torch(module, x, args.runs, args.warmup, device)
        rows.append(dict(model=e["model"], batch=e["batch"], image=e["image"],
                         wgpu_ms=ours * 1e3, wgpu_images_s=e["batch"] / ours,
                         torch_ms=theirs * 1e3, torch_images_s=e["batch"] / theirs,
                         max_abs_err=float(np.abs(got - want).max()), max_abs_torch=float(np.abs(want).max()),
                         matches=not e.get("int8") and bool(np.allclose(got, want, atol=ATOL, rtol=RTOL))))  # fmt: skip
        print(markdown_row(rows[-1]), flush=True)
        if ops:
            rows[-1]["top_ops"] = ops
            for r in ops:
                print(f"    {r['op']:<40} {r['count']:>4} dispatches {r['total_us'] / 1e3:9.2f} ms {r['share']:6.1%}", flush=True)
    return dict(meta=meta, rows=rows)


COLUMNS = ("model", "batch", "image", "wgpu_ms", "wgpu_images_s", "torch_ms", "torch_images_s", "max_abs_err", "matches")


def markdown_row(row):
    cells = [f"{row[c]:.3g}" if isinstance(row[c], float) else str(row[c]) for c in COLUMNS]
    return "| " + " | ".join(cells) + " |"


def markdown(results):
    head = f"pte-wgpu on {results['meta']['wgpu_device']}, torch eager on {results['meta']['torch_device']}\n\n"
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return head + "\n".join(lines + [markdown_row(r) for r in results["rows"]])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    e = sub.add_parser("export", help="write the .pte files and manifest.json (needs ExecuTorch)")
    e.add_argument("--out", required=True)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--int8", action="store_true", help="the CNNs quantized by ExecuTorch's static int8 flow, batch 1")
    r = sub.add_parser("run", help="time pte-wgpu and torch on an export folder")
    r.add_argument("folder")
    r.add_argument("--runs", type=int, default=20)
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--json")
    r.add_argument("--profile", action="store_true", help="also print each model's top ops by GPU time")
    for s in (e, r):
        s.add_argument("--models", type=lambda v: v.split(","), default=None, help=f"a subset of {','.join(MODELS)}")
        s.add_argument("--short", action="store_true", help="tiny sizes (export: 32 px, 10 classes; run: 2 runs)")
    args = p.parse_args(argv)
    if args.mode == "export":
        args.models = args.models or list(MODELS)
        args.image, args.classes = (32, 10) if args.short else (224, 1000)
        export(args)
        return
    if args.short:
        args.runs, args.warmup = 2, 1
    results = run(args)
    print(markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
