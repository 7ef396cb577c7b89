"""Large language models on top of the runtime: generation, tokenizers, the export recipe, serving.

`generate` drives a KV-cache decoder's steps (sampling, stop tokens, streaming), `tokenizer` reads a
GGUF's or `tokenizer.json`'s vocabulary and chat template, `export` runs ExecuTorch's `export_llm` in
a subprocess (export time only), and `server` is the OpenAI-compatible HTTP server. It may import
the runtime core (`async_runtime`'s own modules) and `program`; nothing in the core imports it,
except the public API re-exporting `generate`.
"""
