"""WGSL kernels and the op registry; importing this registers every op.

The registry (`registry.py`), the variant tables (`variants.py`), the WGSL building blocks
(`wgsl.py`) and load-time fusion (`fusion.py`) sit here; the kernels sit in one sub-package per
family, each op registered with `@op` beside its kernel:

- `tensor/`: elementwise, reductions, scans, shape and memory ops, indexing, creation, SymInts,
  embeddings;
- `matmul/`: the GEMM template, the row routes, float and 4-bit linears and their fused forms;
- `attention/`: attention with and without a KV-cache update, RoPE, KV-cache writes, the GPU
  sampler;
- `quant/`: quantize and dequantize, choose_qparams, 8-bit elementwise ops, per-channel quantized
  linears and int8 convolutions;
- `vision/`: convolutions (direct and implicit GEMM), pooling, batch and group norm, resampling,
  pixel shuffles.
"""

from . import attention, matmul, quant, tensor, vision  # noqa: F401  (registers the ops)
from .fusion import fuse, fuse_ragged
from .registry import OPS, Dispatch, OpBuilder, Params, build_node, op
from .variants import adapter_class

__all__ = ["OPS", "Dispatch", "OpBuilder", "Params", "adapter_class", "build_node", "fuse", "fuse_ragged", "op"]
