"""Tiny Llama `.pte` exports (ExecuTorch's own LLM export, Vulkan delegate) plus a torch reference.

    pte_path, ref = export_llama(tmp_path)                # fp32; qmode="4w" / "8da4w" for quantized, dtype="fp16"
    logits = ref.step(prompt_int64[1, S], input_pos=0)    # [1, vocab] float32, last-token logits
    logits = ref.step(np.array([[tok]]), input_pos=S)     # decode; ref keeps its own KV cache

How it works:

1. Weights: `llama_transformer.construct_transformer(ModelArgs(...))` under `torch.manual_seed(seed)`,
   every linear / embedding re-drawn from N(0, init_std=0.02), every norm weight set to 1; saved as
   `ckpt.pth` (parameters only) next to `params.json` holding the ModelArgs fields.
2. Export: a subprocess (sys.executable) runs the real CLI entry point
   `executorch.extension.llm.export.export_llm.main()` with exactly the CLI overrides
   (`base.model_class=llama3 model.use_kv_cache=true model.use_sdpa_with_kv_cache=true
   model.enable_dynamic_shape=true backend.vulkan.enabled=true model.dtype_override=fp32 ...`,
   plus `quantization.qmode=...`). The only addition: `LLMEdgeManager._export` is wrapped so the
   ExportedProgram it produces (after source transforms / torchao quantization, before
   partitioning) is also `torch.export.save`d to `program.pt2`. That is the very program that is
   then lowered to Vulkan, so the reference is like-for-like for quantized models too.
3. Reference: `torch.export.load("program.pt2").module()` run eagerly on CPU (the llama custom ops
   `sdpa_with_kv_cache` / `update_cache` come from ExecuTorch's AOT custom-op library). Its KV cache
   lives in the module's mutable buffers, so `step` calls must be in position order, as with the
   `.pte`. `reset()` zeroes the caches; every `export_llama` call returns a fresh copy.
4. Cache: `_CACHE` maps the config to (pte_path, program) for the pytest session; the first call's
   `tmpdir` holds the files (pytest keeps tmp dirs for the session).

Quantized exports (qmode="4w" / "8da4w") need vocab_size % 4 == 0 (e.g. 256): with 257 ExecuTorch's
own Vulkan lowering fails in FusePatternsPass on the output projection; export_llama refuses early.

Notes: the export's Llama2Model treats a checkpoint path containing "int8" or "8da4w" as
pre-quantized, so files go to a fresh temp dir whenever `tmpdir` contains either string.
One export takes ~55-125 s on a 2-core box (fp32 or quantized); `export_seconds` records it.
"""

import copy
import os
import subprocess
import tempfile
import time

import numpy as np
import torch

from async_runtime.llm.export import export_command, export_llm_args, write_tiny_llama

from .exporting import export_extras

_CACHE = {}
_PENDING = {}  # key -> _Export under way (start_export)
# The partitioner's check of an embedding's weight size, answering "too large" whatever the size.
EMBEDDING_OUTSIDE = (
    "from executorch.backends.vulkan import op_registry; from executorch.exir.dialects._ops import ops as exir_ops; "
    "op_registry.vulkan_supported_ops[exir_ops.edge.aten.embedding.default].are_node_inputs_supported_fn = lambda node: False\n"
)

class _Export:
    """One export_llm subprocess, started now and waited for when its result is first needed, so
    several exports (single-threaded Python, mostly) overlap each other and the tests."""

    def __init__(self, overrides, out_dir, pte_path, state, params, nice=0, prelude=""):
        self.out_dir, self.pte_path, self.state, self.params = out_dir, pte_path, state, params
        self.pt2_path = os.path.join(out_dir, "program.pt2")
        self.log_path = os.path.join(out_dir, "export.log")
        self.t0 = time.perf_counter()
        command = export_command(overrides, self.pt2_path)
        command[3] = prelude + command[3]  # python -u -c CODE: code run before the driver
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(command, cwd=out_dir, stdout=log, stderr=subprocess.STDOUT)
        if nice:
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, nice)

    def finish(self, timeout=1800):
        """The cache entry once the export is done; raises with the log tail on failure."""
        try:
            rc = self.proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - self.t0)))
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        seconds = time.perf_counter() - self.t0
        with open(self.log_path) as f:
            log = f.read()
        if rc != 0:
            raise RuntimeError(f"export_llm failed (rc={rc}):\n{log[-6000:]}")
        if not os.path.exists(self.pte_path):
            raise RuntimeError(f"export_llm wrote no {self.pte_path}")
        return dict(pte_path=self.pte_path, program=load_program(self.pt2_path), state=self.state,
                    params=self.params, export_seconds=seconds, export_log=log, out_dir=self.out_dir)


def load_program(pt2_path):
    """The saved pre-lowering ExportedProgram (registers the ops it needs first)."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  llama::sdpa_with_kv_cache etc.
    import torchao.quantization  # noqa: F401  torchao::dequantize_affine etc.

    return torch.export.load(pt2_path)


class LlamaReference:
    """Eager CPU logits of the exported program, one `step` at a time (KV cache inside)."""

    def __init__(self, program, state_dict, params):
        self.program = program
        self.module = program.module()
        self.state_dict = state_dict  # the checkpoint's fp32 weights
        self.params = params

    def reset(self):
        with torch.no_grad():
            for name, buf in self.module.named_buffers():
                if any(state in name for state in ("k_cache", "v_cache", "conv_state", "recurrent_state")):
                    buf.zero_()

    def step(self, tokens, input_pos):
        """tokens int64 [1, S] at positions input_pos..input_pos+S-1 -> last-token logits [1, vocab]."""
        tokens = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
        pos = torch.tensor([int(input_pos)], dtype=torch.int64)
        with torch.no_grad():
            out = self.module(tokens, {"input_pos": pos})
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out.detach().float().numpy().copy()

    def prefill(self, tokens):
        """Logits for the whole `tokens` [1, S] from position 0 (leaves the cache filled)."""
        return self.step(tokens, 0)

    def greedy(self, prompt, n_steps):
        """(generated ids, list of logits): prefill then n_steps greedy decode steps."""
        return self.greedy_from(prompt, 0, n_steps)

    def greedy_from(self, tokens, pos, n_steps):
        """greedy's, feeding `tokens` at position `pos` first (a sequence continued)."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        logits = [self.step(tokens, pos)]
        ids = []
        pos += tokens.shape[1]
        for _ in range(n_steps):
            ids.append(int(logits[-1].argmax()))
            logits.append(self.step(np.array([[ids[-1]]], dtype=np.int64), pos))
            pos += 1
        return ids, logits


def export_llama(tmpdir, **config):
    """(path of the Vulkan .pte, a fresh LlamaReference); exported once per session per config
    (the keyword arguments of `start_export`).

    The .pte takes tokens int64 [1, S] (1 <= S < max_len; S = 1 when not `dynamic`) and input_pos
    int64 [1]; returns [1, vocab].
    """
    key = start_export(tmpdir, **config)
    if key not in _CACHE:
        _CACHE[key] = _PENDING.pop(key).finish()
    entry = _CACHE[key]
    ref = LlamaReference(copy.deepcopy(entry["program"]), entry["state"], entry["params"])
    ref.export_seconds, ref.export_log = entry["export_seconds"], entry["export_log"]
    ref.out_dir = entry["out_dir"]
    return entry["pte_path"], ref


def start_export(
    tmpdir,
    *,
    dim=64,
    n_heads=4,
    n_kv_heads=2,
    n_layers=2,
    vocab_size=257,
    max_len=32,
    qmode=None,
    group_size=32,
    seed=0,
    multiple_of=32,
    norm_eps=1e-5,
    init_std=0.02,
    dynamic=True,
    dtype="fp32",
    nice=0,
    embedding_outside=False,
    embedding_quantize=None,
    model_args=(),
):
    """Start exporting this config in a subprocess unless it is done or under way; its cache key.
    `dtype` "fp16": float16 inside the delegates (`async_runtime.llm.export.export_llm_args`).
    `nice` > 0: the subprocess runs at that lower priority (an export the tests need late).
    `embedding_outside`: the Vulkan partitioner leaves the token embedding to ExecuTorch's portable
    kernel, as it does for an embedding past its buffer limit (128M elements: a Llama 3's).
    `embedding_quantize`: export_llm's ("8,32": the embedding in rows of int8 and scales).
    `model_args`: more ModelArgs fields as (name, value) pairs, a family's (q/k/v bias, q/k norm,
    partial rotary, scaled RoPE, ...)."""
    model_args = tuple(sorted(dict(model_args).items()))
    key = (dim, n_heads, n_kv_heads, n_layers, vocab_size, max_len, qmode, group_size, seed,
           multiple_of, norm_eps, init_std, dynamic, dtype, embedding_outside, embedding_quantize, model_args)
    if qmode is not None and vocab_size % 4:
        # ExecuTorch 1.5.1's Vulkan FusePatternsPass pads q4gsw scales to N % 4 == 0 and then fails
        # ("shape '[257, 2, 1]' is invalid for input of size 520") on the output projection.
        raise ValueError(f"qmode={qmode!r} needs vocab_size % 4 == 0 for the Vulkan export (got {vocab_size})")
    if key in _CACHE or key in _PENDING:
        return key
    params = dict(dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, n_layers=n_layers,
                  vocab_size=vocab_size, multiple_of=multiple_of, norm_eps=norm_eps, **dict(model_args))
    base = str(tmpdir)
    os.makedirs(base, exist_ok=True)
    if "int8" in base or "8da4w" in base:
        base = tempfile.mkdtemp(prefix="llama_")
    tag = f"d{dim}h{n_heads}kv{n_kv_heads}l{n_layers}v{vocab_size}m{max_len}s{seed}"
    label = "_".join(filter(None, ({"8da4w": "dq8a4w"}.get(qmode, qmode), dtype if dtype != "fp32" or not qmode else None)))
    label += ("" if dynamic else "_static") + ("_portable_embedding" if embedding_outside else "")  # no "8da4w" in paths (see above)
    label += f"_embedding{embedding_quantize.replace(',', 'g')}" if embedding_quantize else ""
    out_dir = tempfile.mkdtemp(prefix=f"llama_{label}_{tag}_", dir=base)
    with export_extras("a tiny Llama (ExecuTorch's transformer, export_llm and its eager program)"):
        params_path, ckpt_path, state = write_tiny_llama(out_dir, params, max_len, seed, init_std)
    pte_path = os.path.join(out_dir, f"llama_{label}.pte")
    overrides = export_llm_args(params_path, ckpt_path, out_dir, os.path.basename(pte_path), max_len,
                                qmode=qmode, group_size=group_size, dynamic=dynamic, dtype=dtype, embedding_quantize=embedding_quantize)
    _PENDING[key] = _Export(overrides, out_dir, pte_path, state, params, nice, EMBEDDING_OUTSIDE if embedding_outside else "")
    return key
