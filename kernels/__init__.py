"""WGSL kernels and the op registry, one module per op family; importing this registers them all."""

from . import attention, cache, creation, elementwise, embedding, indexing, int8, int8_linear, linear, linear_fused, qkv_rope, quantize, quantized, quantized_fused, rearrange, reduce, rope, scan, sdpa, shape, symint  # noqa: F401
from . import conv, int8_conv, norm, pool, resample, spatial_copy  # noqa: F401  (the vision ops)
from .fusion import fuse, fuse_ragged
from .registry import OPS, Dispatch, OpBuilder, Params, build_node, op
from .variants import adapter_class

__all__ = ["OPS", "Dispatch", "OpBuilder", "Params", "adapter_class", "build_node", "fuse", "fuse_ragged", "op"]
