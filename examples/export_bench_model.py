"""Export a SmolLM2-135M-shaped Llama whose weights tile one 1 MiB random block, for timing.

The real model's `.pte` is 623 MiB (fp32) and too large to carry to a GPU machine; these weights
make the same graph, the same shapes and the same byte counts, while the file compresses to about
1 MiB with xz: every tensor repeats one block, and one element per tensor is distinct so the named
data (keyed by SHA-256) is not deduplicated. Timings only; the text it would produce is noise.

    python examples/export_bench_model.py --out bench_models [--max-context 2048] [--qmode 4w] [--dtype fp16] [--static]

`--static` exports the same model without dynamic shapes (one token per call): the static twin
the bench's resize-overhead scenario compares the dynamic export against.
"""

import argparse
import json
import os

from async_runtime.llm.export import export_llm_args, run_llama_export
from async_runtime.llm.gguf_export import default_gguf_path, gguf_params

BLOCK_FLOATS = (1 << 20) // 4


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
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--qmode", choices=["4w"])
    p.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32", help="fp16: weights, activations and KV cache in float16")
    p.add_argument("--static", action="store_true", help="no dynamic shapes: [1, 1] tokens per call")
    args = p.parse_args(argv)
    import torch
    from gguf import GGUFReader

    params = gguf_params(GGUFReader(default_gguf_path()))
    params = {k: v for k, v in params.items() if k != "use_hf_rope"}
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    kind = args.qmode + ("" if args.dtype == "fp32" else f"_{args.dtype}") if args.qmode else args.dtype
    name = f"smollm2_synthetic_{kind}_ctx{args.max_context}" + ("_static" if args.static else "")
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
