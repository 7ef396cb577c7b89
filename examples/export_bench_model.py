"""Export a Llama-family model of a real shape whose weights tile one 1 MiB random block, for timing.

Real models' `.pte` files (623 MiB for SmolLM2-135M in fp32, GBs past 1B) are too large to carry to
a GPU machine; these weights make the same graph, the same shapes and the same byte counts, while
the file compresses to a few MiB with xz: every tensor repeats one block, and one element per
tensor is distinct so the named data (keyed by SHA-256) is not deduplicated. Timings only; the
text it would produce is noise.

    python examples/export_bench_model.py --out bench_models [--shape smollm2|llama3_2_1b|llama3_1_8b|qwen2_5_0_5b|qwen3_0_6b|phi_4_mini|lfm2_350m|qwen3_5_0_8b]
        [--layers N] [--max-context 2048] [--qmode 4w|8da4w] [--dtype fp16] [--static]

`--shape` names the real model (SmolLM2-135M's from its GGUF; Llama 3.2 1B's and Llama 3.1 8B's
from Meta's params.json; Qwen2.5-0.5B's, Qwen3-0.6B's and Phi-4-mini's from their Hugging Face
configs; LFM2-350M's and Qwen3.5-0.8B's from ExecuTorch's); `--layers` keeps that many of its layers (an 8B in fp32
is 32 GB before quantization: too much memory to export whole on a small machine).

`--static` exports the same model without dynamic shapes (one token per call): the static twin
the bench's resize-overhead scenario compares the dynamic export against.
"""

import argparse
import json
import os

from async_runtime.llm.export import export_llm_args, run_llama_export
from async_runtime.llm.gguf_export import default_gguf_path, gguf_params

BLOCK_FLOATS = (1 << 20) // 4
LLAMA3 = dict(norm_eps=1e-5, rope_theta=500000.0, use_scaled_rope=True, vocab_size=128256, n_heads=32, n_kv_heads=8)
SHAPES = {  # Meta's params.json of each; SmolLM2's comes from its GGUF
    "llama3_2_1b": dict(LLAMA3, dim=2048, n_layers=16, ffn_dim_multiplier=1.5, multiple_of=256, rope_scale_factor=32),
    "llama3_1_8b": dict(LLAMA3, dim=4096, n_layers=32, ffn_dim_multiplier=1.3, multiple_of=1024, rope_scale_factor=8),
    # the other families' switches as tests/test_llm_families.py sets them, their sizes from the models' configs
    "qwen2_5_0_5b": dict(dim=896, n_layers=24, n_heads=14, n_kv_heads=2, hidden_dim=4864, vocab_size=151936, norm_eps=1e-6,
                         rope_theta=1000000.0, attention_qkv_bias=True, use_hf_rope=True),
    "qwen3_0_6b": dict(dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, hidden_dim=3072, vocab_size=151936,
                       norm_eps=1e-6, rope_theta=1000000.0, use_qk_norm=True, qk_norm_before_rope=True, use_hf_rope=True),
    "phi_4_mini": dict(dim=3072, n_layers=32, n_heads=24, n_kv_heads=8, hidden_dim=8192, vocab_size=200064, norm_eps=1e-5,
                       rope_theta=10000.0, partial_rotary_factor=0.75, use_hf_rope=True),
    # ExecuTorch's own params of LFM2-350M: short-convolution layers, attention at 2, 5, 8, 10, 12, 14
    "lfm2_350m": dict(dim=1024, n_layers=16, n_heads=16, n_kv_heads=8, hidden_dim=4608, ffn_dim_multiplier=1, vocab_size=65536,
                      norm_eps=1e-5, rope_theta=1000000.0, use_hf_rope=True, use_qk_norm=True, qk_norm_before_rope=True,
                      layer_types=["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)]),
    # ExecuTorch's own params of Qwen3.5-0.8B: three gated-delta (linear attention) layers, then one of gated attention
    "qwen3_5_0_8b": dict(dim=1024, n_layers=24, n_heads=8, n_kv_heads=2, head_dim=256, hidden_dim=3584, vocab_size=248320,
                         norm_eps=1e-6, rope_theta=10000000.0, use_hf_rope=True, partial_rotary_factor=0.25, use_qk_norm=True,
                         qk_norm_before_rope=True, use_q_gate=True, rms_norm_add_unit_offset=True, linear_conv_kernel_dim=4,
                         linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16,
                         layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(24)]),
}


def synthetic_state_dict(params, seed=0):
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    with torch.device("meta"):
        shapes = {k: v.shape for k, v in construct_transformer(ModelArgs(**params)).state_dict().items()}
    block = torch.randn(BLOCK_FLOATS, generator=torch.Generator().manual_seed(seed)) * 0.02
    state = {}
    for i, (name, shape) in enumerate(sorted(shapes.items())):
        n = int(torch.Size(shape).numel())
        flat = block.repeat(-(-n // BLOCK_FLOATS))[:n].clone()
        flat[0] = 1.0 + i * 1e-3  # one distinct value per tensor
        state[name] = flat.reshape(shape)
    return state


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shape", choices=["smollm2", *SHAPES], default="smollm2")
    p.add_argument("--layers", type=int, help="keep this many of the shape's layers")
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--qmode", choices=["4w", "8da4w"], help="8da4w: int8 dynamic activations, named dq8a4w in files")
    p.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32", help="fp16: weights, activations and KV cache in float16")
    p.add_argument("--static", action="store_true", help="no dynamic shapes: [1, 1] tokens per call")
    args = p.parse_args(argv)
    import torch
    from gguf import GGUFReader

    if args.shape == "smollm2":
        params = gguf_params(GGUFReader(default_gguf_path()))
        params = {k: v for k, v in params.items() if k != "use_hf_rope"}
    else:
        params = dict(SHAPES[args.shape])
    if args.layers:
        params["n_layers"] = args.layers
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    # ExecuTorch's Llama2Model treats a checkpoint path naming "8da4w" as a prequantized one
    qmode = {"8da4w": "dq8a4w"}.get(args.qmode, args.qmode)
    kind = qmode + ("" if args.dtype == "fp32" else f"_{args.dtype}") if qmode else args.dtype
    layers = f"_{args.layers}layers" if args.layers else ""
    name = f"{args.shape}_synthetic{layers}_{kind}_ctx{args.max_context}" + ("_static" if args.static else "")
    params_path, ckpt_path = os.path.join(out, f"{name}.json"), os.path.join(out, f"{name}.pth")
    with open(params_path, "w") as f:
        json.dump(params, f)
    torch.save(synthetic_state_dict(params), ckpt_path)
    overrides = export_llm_args(
        params_path, ckpt_path, out, f"{name}.pte", args.max_context, qmode=args.qmode, dynamic=not args.static,
        dtype=args.dtype,
    )
    seconds = run_llama_export(overrides, cwd=out)
    os.remove(ckpt_path)
    print(f"{os.path.join(out, name + '.pte')} in {seconds:.0f} s")


if __name__ == "__main__":
    main()
