"""Quantization: quantize, dequantize and choose_qparams, ops over packed 8-bit tensors, linears
over per-channel quantized weights (int8 and 4-bit) and int8 convolutions. May import the kernels'
top modules, `vision` (convolution shapes) and `matmul` (which 4-bit products quantize their
rows themselves, so that the op quantizing them runs no dispatch)."""

from . import int8_conv, int8_elementwise, per_channel_linear, quantize, quantized_rows  # noqa: F401
