"""float16 activations around the quantized ops (kernels/quantize.py, int8_linear.py): f16 inputs
with f32 scales into quantize/dequantize/choose_qparams, and the weight-only int8 and 4-bit linears
that ExecuTorch's VulkanQuantizer makes of a `.half()` model, against torch eager on the same
program. Integer outputs exact; float outputs within one f16 rounding (atol = rtol = 1e-3: the
kernels compute in f32 and round once, the eager per-token ops in float64). The linears: eager
fp16 rounds the dequantized weight and the product its own way, atol = rtol = 2e-3 at K = 20."""

import numpy as np
import pytest
import torch

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

from .exporting import export_pte
from .test_more_ops import Q_SHAPES, LinearReluAdd, _delegate_ops, _vulkan_weight_only, export_quantized

pytestmark = pytest.mark.usefixtures("adapter")

QD = torch.ops.quantized_decomposed
I8 = torch.int8


class QuantizeHalf(torch.nn.Module):
    """x float16 [5, 7, K], q int8 [5, 7, K], per-token scales ts float32 [5, 7, 1] and zero
    points tz int64 [5, 7, 1]; per-channel scales and zero points as buffers."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scales", torch.tensor([0.011, 0.02, 0.0137, 0.05, 0.009, 0.031, 0.0071]))
        self.register_buffer("zps", torch.tensor([3, -7, 0, 12, -128, 127, 1], dtype=torch.int32))

    def forward(self, x, q, ts, tz):
        block = (1, 1, x.shape[-1])
        return (
            QD.quantize_per_channel.default(x, self.scales, self.zps, 1, -128, 127, I8),
            QD.dequantize_per_channel.default(q, self.scales, self.zps, 1, -128, 127, I8, out_dtype=torch.float16),
            QD.quantize_per_token.default(x, ts, tz, -128, 127, I8),
            QD.dequantize_per_token.default(q, ts, tz, -128, 127, I8, torch.float16),
            *QD.choose_qparams.tensor(x, -128, 127, 1e-7, I8),
            *QD.choose_qparams_per_token_asymmetric.default(x, I8),
            torch.ops.torchao.quantize_affine(x, block, ts, tz.to(torch.int32), I8, -128, 127),
            torch.ops.torchao.dequantize_affine(q, block, ts, tz.to(torch.int32), I8, -128, 127, output_dtype=torch.float16),
        )


K = torch.export.Dim("K", min=1, max=13)
SAMPLE = (
    (torch.randn(5, 7, 13) * 3).half(),
    torch.randint(-128, 128, (5, 7, 13), dtype=I8),
    torch.rand(5, 7, 1) / 10 + 0.01,
    torch.randint(-5, 6, (5, 7, 1)),
)
SHAPES = ({2: K}, {2: K}, None, None)


async def test_quantize_family_with_f16_activations(load_pte):
    pte, module = export_pte("f16gen_quantize", QuantizeHalf, SAMPLE, SHAPES)
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    assert model.graph.values[model.graph.inputs[0]].dtype == "float16"
    calls = dynamic_shape_calls(SAMPLE, SHAPES, n=4, seed=1)
    calls = [(x * 40, q, ts, tz) for x, q, ts, tz in calls]  # past the int8 range: clamping
    await assert_matches_eager(model, module, calls, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("bits, op", [(8, "aten._weight_int8pack_mm.default"), (4, "et_vk.linear_qcs4w.default")])
async def test_weight_only_quantized_linear_with_f16_activations(load_pte, bits, op):
    sample = (torch.randn(9, 20).half(),)
    pte, graph = export_quantized(f"w{bits}_fp16", _vulkan_weight_only(bits), sample, Q_SHAPES, lambda: LinearReluAdd().half())
    assert op in _delegate_ops(pte)
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    calls = [(np.asarray(x, np.float16),) for (x,) in dynamic_shape_calls(sample, Q_SHAPES, n=4, seed=6)]
    await assert_matches_eager(model, graph, calls, atol=2e-3, rtol=2e-3)
