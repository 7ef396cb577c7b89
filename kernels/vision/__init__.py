"""Image ops: convolution (direct and implicit GEMM), pooling, batch and group norm, resampling and
pixel shuffles. May import the kernels' top modules, `tensor` (the strided copy) and `matmul`
(the GEMM template)."""

from . import conv, norm, pool, resample, spatial_copy  # noqa: F401
