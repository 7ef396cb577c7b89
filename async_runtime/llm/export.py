"""ExecuTorch's LLM export (`export_llm`) of a Llama checkpoint, run in a subprocess.

Export time only: the subprocess needs torch and executorch, this module imports neither. One
recipe for examples/export_smollm2.py, the bench's tiny models and the tests' Llama exports.
"""

import json
import os
import sys

# Runs async_runtime.llm.export_driver from this copy of the package, whatever is installed.
DRIVER = "import sys; sys.path.insert(0, sys.argv[1]); from async_runtime.llm.export_driver import main; main(sys.argv[2:])"


DTYPES = ("fp32", "fp16")


def export_llm_args(params_path, ckpt_path, out_dir, pte_name, max_len, *, qmode=None, group_size=32,
                    backend="vulkan", dynamic=True, dtype="fp32"):
    """The `export_llm` overrides: Llama 3 with the KV cache and sdpa_with_kv_cache.

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
