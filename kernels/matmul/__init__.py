"""Products: the register-tiled GEMM template, the row routes that choose GEMV, subgroup kernel or
GEMM, float and 4-bit linears, and the linears fusion merges (q/k/v groups, SwiGLU, the residual
add, a GELU after, RoPE in the q/k/v epilogue). May import the kernels' top modules, `tensor` and
`attention` (the RoPE epilogue)."""

from . import fused_linear, linear, q4_fused_linear, q4_linear, qkv_rope  # noqa: F401
