"""`python -m async_runtime bench`: tokens/s, resize overhead, CPU time split and concurrency on
tiny Llama exports, with torch eager and ExecuTorch's own runtime (XNNPACK) as baselines in the
same run.

Models: a directory (`--models DIR`) or a `.pte` (positional; its directory is searched for the
siblings) holding, by these names (missing ones make their rows "n/a"):

    llama_vulkan.pte          ExecuTorch's LLM export, Vulkan delegate, dynamic sequence length
    llama_vulkan_static.pte   the same model exported with enable_dynamic_shape=false ([1, 1] tokens)
    llama_xnnpack.pte         the same weights lowered to XNNPACK (ExecuTorch's pybindings run it)
    program.pt2               the ExportedProgram before lowering (torch eager runs its module)

Without either, a tiny Llama is exported once into a cache directory (`--cache-dir`, default
$PTE_WGPU_BENCH_CACHE or ~/.cache/pte-wgpu/bench) with ExecuTorch's `export_llm` CLI, the same way
tests/llama.py does (ExecuTorch is imported only then, in subprocesses).

Every number is the median of N runs (N=5; `--short`: 1 run, tiny sizes). Scenarios:
decode (one session), prefill at 32/128/512/2048 tokens (capped to the model's maximum), resize
overhead (static export vs the dynamic export at the same [1, 1] shape vs cycling small shapes,
with resize-hook calls per execute from `model.statistics()`), the CPU time of one execute split
into prepare / resize / stage / encode / submit / readback wait / read outputs (the bench wraps the
runtime's methods while it measures), and aggregate decode tokens/s of 1..32 concurrent sessions
with `batch_submits` on and off, and the streaming-kernel bandwidth of the project's elementwise,
copy and GEMV kernels as a share of the device's copy bandwidth (streaming.py; `--short`:
tiny tensors). `--trace` adds GPU timestamp profiling (profile.py).
"""


import json
import os
import platform
import sys
import time
from pathlib import Path

import anyio

from .baselines import eager_baseline, xnnpack_baseline
from .measure import wgpu_scenarios
from .models import FULL, SHORT, find_models
from .report import markdown, plots, summarize

# --- command ----------------------------------------------------------------------------------
def add_arguments(p):
    p.add_argument("pte", nargs="?", help="a Llama .pte (Vulkan delegate, dynamic); siblings named as in FILES are used too")
    p.add_argument("--models", metavar="DIR", help="a directory with llama_vulkan.pte [, llama_vulkan_static.pte, llama_xnnpack.pte, program.pt2]")
    p.add_argument("--short", action="store_true", help="1 run and tiny sizes (a smoke test; numbers are not meaningful)")
    p.add_argument("--runs", type=int, help="runs per measurement (the median is reported); default 5, 1 with --short")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the markdown tables here too (they are always printed)")
    p.add_argument("--trace", metavar="FILE", help="profile with GPU timestamps: a Chrome/Perfetto trace here, a per-op table in the outputs")
    p.add_argument("--plots", metavar="DIR", help="PNG plots (needs matplotlib)")
    p.add_argument(
        "--cache-dir",
        default=os.environ.get("PTE_WGPU_BENCH_CACHE") or str(Path.home() / ".cache" / "pte-wgpu" / "bench"),
        help="where the default tiny Llama is exported (default $PTE_WGPU_BENCH_CACHE or ~/.cache/pte-wgpu/bench)",
    )
    p.add_argument(
        "--exports", default="vulkan,static,xnnpack",
        help="which default models to export when missing (comma list of vulkan,static,xnnpack; vulkan is always needed)",
    )
    p.add_argument("--no-baselines", action="store_true", help="skip torch eager and the ExecuTorch runtime")
    p.add_argument("--no-streaming", action="store_true", help="skip the streaming-kernel bandwidth scenario (streaming.py)")


def _versions():
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("wgpu", "torch", "executorch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "n/a"
    return out


def run(args):
    log = lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    p = dict(SHORT if args.short else FULL)
    if args.runs:
        p["runs"] = args.runs
    # before any adapter is requested in this process: resolves then come out in ns
    from ..profile import enable_timestamp_normalization

    units = enable_timestamp_normalization()
    if "vulkan" not in args.exports.split(","):
        args.exports = "vulkan," + args.exports
    models, export_seconds = find_models(args, p["llama"], log)
    if not models.get("vulkan") or not Path(models["vulkan"]).exists():
        raise SystemExit("bench: no Vulkan .pte to run")
    t0 = time.perf_counter()
    w = anyio.run(wgpu_scenarios, models, p, log, units if args.trace else None)
    if not args.no_streaming:
        from . import streaming as bs

        w["streaming"] = anyio.run(bs.measure, bs.SHORT if args.short else bs.FULL, p["runs"], units, log)
    baselines = {"eager": {"cpu": {"error": "skipped (--no-baselines)"}}, "xnnpack": {"error": "skipped (--no-baselines)"}}
    if not args.no_baselines:
        vocab = w["model"]["vocab"]
        baselines = {
            "eager": eager_baseline(models, p, w["prompts"], w["decode_tokens"], vocab, log),
            "xnnpack": xnnpack_baseline(models, p, w["prompts"], w["decode_tokens"], vocab, log),
        }
    versions = _versions()
    meta = dict(
        short=bool(args.short), runs=p["runs"], device=w["device"], device_features=w["device_features"],
        model=dict(w["model"], file=str(models["vulkan"]), config=p["llama"] if not (args.pte or args.models) else None),
        prompts=w["prompts"], decode_tokens=w["decode_tokens"], prompt0=p["prompt0"], sessions=list(p["sessions"]),
        host=f"{platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()})",
        bench_seconds=time.perf_counter() - t0, export_seconds=export_seconds, **versions,
    )
    summary = summarize({"meta": meta, "models": models, "wgpu": w, "baselines": baselines})
    md = markdown(summary)
    print(md)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(md)
    if args.trace:
        trace = w.get("profile", {}).get("trace") or {"traceEvents": [], "otherData": {"note": "no timestamp-query on this adapter"}}
        Path(args.trace).write_text(json.dumps(trace))
    if args.plots:
        for path in plots(summary, args.plots, log):
            log(f"wrote {path}")
    return 0
