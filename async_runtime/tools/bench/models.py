"""The tiny Llama the bench exports (through ExecuTorch's export_llm) and where it finds models."""

import json
import subprocess
import sys
import time
from pathlib import Path


from ...llm.export import export_command, export_llm_args

FILES = {
    "vulkan": "llama_vulkan.pte",
    "static": "llama_vulkan_static.pte",
    "xnnpack": "llama_xnnpack.pte",
    "program": "program.pt2",
}
FULL = dict(
    runs=5, prompts=(32, 128, 512, 2048), decode_tokens=32, prompt0=8, sessions=(1, 2, 4, 8, 16, 32),
    resize_steps=32, llama=dict(dim=128, n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=256, max_len=2048),
)
SHORT = dict(
    runs=1, prompts=(8, 32), decode_tokens=4, prompt0=4, sessions=(1, 2, 4),
    resize_steps=4, llama=dict(dim=64, n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=256, max_len=64),
)


# ExecuTorch is imported only in subprocesses: the bench itself runs without it.
_WRITE_MODEL = (
    "import json, sys; from async_runtime.llm.export import write_tiny_llama; "
    "write_tiny_llama(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))"
)


def llama_tag(cfg):
    return "d{dim}h{n_heads}kv{n_kv_heads}l{n_layers}v{vocab_size}m{max_len}".format(**cfg)


def export_llama(out_dir, cfg, which=("vulkan", "static", "xnnpack"), seed=0, init_std=0.02, log=print):
    """Export the missing files of `which` into out_dir (in parallel subprocesses); returns the
    seconds each took. Raises RuntimeError with the log tail when one fails."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = dict(cfg)
    max_len = cfg.pop("max_len")
    params = dict(cfg, multiple_of=32, norm_eps=1e-5)
    if not (out_dir / "ckpt.pth").exists():
        subprocess.run(
            [sys.executable, "-c", _WRITE_MODEL, str(out_dir), json.dumps(params), str(max_len), str(seed), str(init_std)],
            check=True, capture_output=True, text=True,
        )
    jobs = {}
    plan = {"vulkan": ("vulkan", True, str(out_dir / FILES["program"])), "static": ("vulkan", False, "-"), "xnnpack": ("xnnpack", True, "-")}
    for key in which:
        if (out_dir / FILES[key]).exists():
            continue
        backend, dynamic, pt2 = plan[key]
        overrides = export_llm_args(f"{out_dir}/params.json", f"{out_dir}/ckpt.pth", str(out_dir), FILES[key], max_len,
                                    backend=backend, dynamic=dynamic)
        args = export_command(overrides, pt2)
        logf = open(out_dir / f"export_{key}.log", "w")
        log(f"exporting {FILES[key]} ({llama_tag(dict(cfg, max_len=max_len))}) with ExecuTorch's export_llm ...")
        jobs[key] = (subprocess.Popen(args, cwd=out_dir, stdout=logf, stderr=subprocess.STDOUT), logf, time.perf_counter())
    seconds = {}
    for key, (proc, logf, t0) in jobs.items():
        rc = proc.wait()
        logf.close()
        seconds[key] = time.perf_counter() - t0
        if rc != 0 or not (out_dir / FILES[key]).exists():
            tail = (out_dir / f"export_{key}.log").read_text()[-4000:]
            raise RuntimeError(f"export of {FILES[key]} failed (rc={rc}):\n{tail}")
    return seconds


def find_models(args, cfg, log):
    """{key: path or None} for the FILES keys, exporting a tiny Llama into the cache if needed."""
    if args.pte:
        base = Path(args.pte).parent
        found = {k: (base / f if (base / f).exists() else None) for k, f in FILES.items()}
        found["vulkan"] = Path(args.pte)
        return found, {}
    base = Path(args.models) if args.models else Path(args.cache_dir) / f"llama_{llama_tag(cfg)}"
    seconds = {}
    if not args.models:
        which = [w for w in args.exports.split(",") if w]
        missing = [w for w in which if not (base / FILES[w]).exists()]
        if missing:
            try:
                import executorch  # noqa: F401
            except ImportError:
                raise SystemExit(
                    f"no models in {base} and ExecuTorch is not installed: pass --models DIR or a .pte "
                    "(pip install 'pte-wgpu[export]' to export one)"
                ) from None
            seconds = export_llama(base, cfg, missing, log=log)
    return {k: (base / f if (base / f).exists() else None) for k, f in FILES.items()}, seconds
