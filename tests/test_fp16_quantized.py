"""float16 activations around the quantized ops (kernels/quant/quantize.py, per_channel_linear.py): f16 inputs
with f32 scales into quantize/dequantize/choose_qparams; the weight-only int8 and 4-bit linears
that ExecuTorch's VulkanQuantizer makes of a `.half()` model; and a statically quantized
(XNNPACKQuantizer) `.half()` linear, whose q8ta_linear takes an f16 bias between f16 quantize and
dequantize. Each against torch eager on the same program. (ExecuTorch 1.5.1 cannot lower a
`.half()` statically quantized convolution: its q8ta_conv2d meta refuses the f16 bias, so the q8ta
convolutions stay f32-only.)

Tolerances: integer outputs exact; float outputs within one f16 rounding (atol = rtol = 1e-3: the
kernels compute in f32 and round once, the eager per-token ops in float64). The weight-only
linears: eager fp16 rounds the dequantized weight and the product its own way, atol = rtol = 2e-3
at K = 20. The static one: one output quantization step (the int8 sums are exact, the reference
sums dequantized floats) plus an f16 rounding of the output, and 90% of outputs exact."""

import numpy as np
import pytest
import torch

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

from .exporting import export_pte
from .test_int8_conv import _output_steps
from .test_more_ops import Q_SHAPES, LinearReluAdd, _delegate_ops, _vulkan_weight_only, _xnnpack_static, export_quantized

pytestmark = pytest.mark.usefixtures("adapter", "half_adapter")

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
    pytest.importorskip("torchao")  # torch.ops.torchao in the eager module
    pte, module = export_pte("f16gen_quantize", QuantizeHalf, SAMPLE, SHAPES)
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    assert model.graph.values[model.graph.inputs[0]].dtype == "float16"
    calls = dynamic_shape_calls(SAMPLE, SHAPES, n=4, seed=1)
    calls = [(x * 40, q, ts, tz) for x, q, ts, tz in calls]  # past the int8 range: clamping
    await assert_matches_eager(model, module, calls, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("bits, op", [(8, "aten._weight_int8pack_mm.default"), (4, "et_vk.linear_qcs4w.default")])
async def test_weight_only_quantized_linear_with_f16_activations(load_pte, bits, op):
    torch.manual_seed(bits)  # the store finds the export by its calibration input, whatever ran before
    sample = (torch.randn(9, 20).half(),)
    pte, graph = export_quantized(f"w{bits}_fp16", _vulkan_weight_only(bits), sample, Q_SHAPES, lambda: LinearReluAdd().half())
    assert op in _delegate_ops(pte)
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    calls = [(np.asarray(x, np.float16),) for (x,) in dynamic_shape_calls(sample, Q_SHAPES, n=4, seed=6)]
    await assert_matches_eager(model, graph, calls, atol=2e-3, rtol=2e-3)



class LinearRelu(torch.nn.Module):
    """One linear + relu: statically quantized, a q8ta_linear with relu whose output is dequantized."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(20, 12)

    def forward(self, x):
        return torch.relu(self.l1(x))


@pytest.mark.parametrize("rows, op", [(9, "et_vk.q8ta_linear.default"), (1, "et_vk.q8ta_linear_gemv.default")])
async def test_static_int8_half_linear_with_an_f16_bias(load_pte, rows, op):
    torch.manual_seed(rows)  # as above
    sample = (torch.randn(rows, 20).half(),)
    pte, graph = export_quantized(f"f16gen_q8_linear_{rows}", _xnnpack_static, sample, make_module=lambda: LinearRelu().half())
    assert op in _delegate_ops(pte)
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    (step,) = _output_steps(graph)
    torch.manual_seed(3)
    diffs = []
    for scale in (1, 1, 3, 3):  # 3: past the calibrated range
        x = torch.randn(rows, 20).half() * scale
        (got,) = await model.execute(x.numpy())
        with torch.no_grad():
            want = graph(x).float().numpy()
        assert got.dtype == np.float16 and got.shape == want.shape
        diff = np.abs(got.astype(np.float32) - want)
        assert np.all(diff <= step * 1.001 + 2**-10 * np.abs(want)), float(diff.max())
        diffs.append(diff.ravel())
    # eager fp16 sums the dequantized products in fp16 before requantizing: a few more boundaries
    assert np.mean(np.concatenate(diffs) < step / 2) >= 0.9
