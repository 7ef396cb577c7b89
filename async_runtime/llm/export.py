"""ExecuTorch's LLM export (`export_llm`) of a Llama checkpoint, run in a subprocess that shows its
stages as it goes.

Export time only: the subprocess needs torch and executorch, this module imports neither. One
recipe for the GGUF exports (`gguf_export`, examples/export_smollm2.py), the bench's models and
the tests' Llama exports.
"""

import json
import os
import subprocess
import sys
import threading
import time

from .export_driver import PREPROCESS_STAGE, STAGE_MARK
from .export_driver import STAGES as DRIVER_STAGES

# Runs async_runtime.llm.export_driver from this copy of the package, whatever is installed.
DRIVER = "import sys; sys.path.insert(0, sys.argv[1]); from async_runtime.llm.export_driver import main; main(sys.argv[2:])"


DTYPES = ("fp32", "fp16")


def export_llm_args(params_path, ckpt_path, out_dir, pte_name, max_len, *, qmode=None, group_size=32,
                    backend="vulkan", dynamic=True, dtype="fp32", embedding_quantize=None):
    """The `export_llm` overrides: Llama 3 with the KV cache and sdpa_with_kv_cache; with
    `embedding_quantize` ("bits,group size": "8,1024", "4,32", "2,32") its token embedding in
    quantized rows (ExecuTorch leaves the 8- and 2-bit tables outside the delegate).

    dtype "fp16" is the Vulkan partitioner's `force_fp16` (`backend.vulkan.force_fp16=true`): the
    model stays fp32 (its eager program too), the delegates hold every float tensor, weight and KV
    cache in float16, the logits come out float32; with a qmode, the activations and the groups'
    scales are float16. `model.dtype_override=fp16` is no route in ExecuTorch 1.5.1: its export
    asserts fp32 for Vulkan, and past that assertion the Vulkan preprocess fails on the fp16 RoPE
    (FuseBatchNormPass: "Could not guard on data-dependent expression u77 < 0")."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {DTYPES}")
    args = [
        f"base.params={params_path}",
        f"base.checkpoint={ckpt_path}",
        "base.model_class=llama3",
        "model.use_kv_cache=true",
        "model.use_sdpa_with_kv_cache=true",
        f"model.enable_dynamic_shape={'true' if dynamic else 'false'}",
        f"backend.{backend}.enabled=true",
        f"export.max_seq_length={max_len}",
        f"export.max_context_length={max_len}",
        "model.dtype_override=fp32",
        f"export.output_dir={out_dir}",
        f"export.output_name={os.path.join(out_dir, pte_name)}",
    ]
    if dtype == "fp16":
        args.append(f"backend.{backend}.force_fp16=true")
    if qmode in ("4w", "8da4w"):
        args += [f"quantization.qmode={qmode}", f"quantization.group_size={group_size}"]
    elif qmode is not None:
        raise ValueError(f"qmode {qmode!r}: expected None, '4w' or '8da4w'")
    if embedding_quantize is not None:
        args.append(f"quantization.embedding_quantize='{embedding_quantize}'")
    return args


def export_command(overrides, pt2_path="-"):
    """The subprocess command line (async_runtime.llm.export_driver); `pt2_path` also keeps the
    ExportedProgram there."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [sys.executable, "-u", "-c", DRIVER, package_root, pt2_path or "-", *overrides]


def write_tiny_llama(out_dir, params, max_len, seed=0, init_std=0.02):
    """A random-weight Llama checkpoint for tests and the bench: every linear and embedding drawn
    from N(0, init_std) under `seed`, every norm weight 1. Writes `ckpt.pth` (parameters only) and
    `params.json` (the ModelArgs fields) into out_dir; returns (params_path, ckpt_path, state_dict).
    Imports torch and ExecuTorch's Llama definition: export time only."""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(seed)
    model = construct_transformer(ModelArgs(max_seq_len=max_len, max_context_len=max_len, **params))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.split(".")[-2]:
                p.fill_(1.0)
            else:
                p.normal_(0.0, init_std)
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    params_path, ckpt_path = os.path.join(out_dir, "params.json"), os.path.join(out_dir, "ckpt.pth")
    with open(params_path, "w") as f:
        json.dump(params, f)
    torch.save(state, ckpt_path)
    return params_path, ckpt_path, state


# (substring of an export_llm log line, share of the export done when it appears, stage); the
# driver's stage lines (async_runtime.llm.export_driver) mark the long, silent lowering. Shares
# from SmolLM2's fp32 export (2 cores): torch.export 21%, to edge 44%, partitioning 27%.
_STAGES = [
    ("Checkpoint dtype", 1, "checkpoint loaded"),
    *((STAGE_MARK + stage, percent, stage) for stage, percent in zip(
        (stage for _, stage in DRIVER_STAGES), (2, 22, 23, 67, 95, 98))),
    (STAGE_MARK + PREPROCESS_STAGE.split("{")[0], 94, None),  # the stage is the line itself
]


def _stage_of(line):
    """(percent, stage name) if this log line starts a stage, else None."""
    for marker, percent, name in _STAGES:
        if marker in line:
            return percent, name or line.strip()[len(STAGE_MARK):]
    return None


class _Progress:
    """The export's stage with a percentage and the elapsed time: on a terminal one bar redrawn
    every 0.2 s by a thread (with a spinner, so a silent stage still shows life), else one line
    per stage."""

    SPIN = "|/-\\"

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = self.stage_t0 = time.perf_counter()
        self.percent, self.stage = 0, "starting export_llm"
        self.lock = threading.Lock()
        self.finished = threading.Event()
        if self.tty:
            threading.Thread(target=self._redraw_until_finished, daemon=True).start()
        else:
            self._draw()

    def stage_started(self, percent, stage):
        with self.lock:
            self.percent, self.stage, self.stage_t0 = max(percent, self.percent), stage, time.perf_counter()
        if not self.tty:
            self._draw()

    def finish(self, percent, stage):
        self.finished.set()
        with self.lock:
            self.percent, self.stage = percent, stage
        self._draw(final=True)

    def _redraw_until_finished(self):
        while not self.finished.wait(0.2):
            self._draw()

    def _draw(self, final=False):
        with self.lock:
            now = time.perf_counter()
            bar = "#" * (self.percent // 4) + "." * (25 - self.percent // 4)
            spin = " " if final else self.SPIN[int((now - self.t0) * 5) % 4]
            line = f"[{bar}] {self.percent:3d}% {spin} {now - self.t0:6.1f}s  {self.stage} ({now - self.stage_t0:.0f}s)"
            if self.tty:
                self.stream.write(f"\r{line:<100}" + ("\n" if final else ""))
            else:
                self.stream.write(line + "\n")
            self.stream.flush()


def run_llama_export(overrides, *, cwd, pt2_path="", progress=True, timeout=3600, log_path=None):
    """Run `export_llm` with these overrides in a subprocess, showing its stages; returns seconds.

    pt2_path: also save the pre-lowering ExportedProgram there; log_path: keep the CLI's log there.
    Raises with the log tail on failure."""
    t0 = time.perf_counter()
    show = _Progress() if progress else None
    log = []
    proc = subprocess.Popen(export_command(overrides, pt2_path), cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
        for line in proc.stdout:
            log.append(line)
            started = _stage_of(line)
            if started and show:
                show.stage_started(*started)
            if time.perf_counter() - t0 > timeout:
                proc.kill()
                raise TimeoutError(f"export_llm took more than {timeout} s")
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if show:
            show.finish(100 if proc.returncode == 0 else show.percent,
                        "done" if proc.returncode == 0 else f"failed (rc={proc.returncode})")
    seconds = time.perf_counter() - t0
    if log_path:
        with open(log_path, "w") as f:
            f.writelines(log)
    if rc != 0:
        raise RuntimeError(f"export_llm failed (rc={rc}):\n{''.join(log)[-6000:]}")
    return seconds
