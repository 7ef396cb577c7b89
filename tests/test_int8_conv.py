"""The int8 convolutions and pixel shuffle (`et_vk.q8ta_*`), and attention
without a KV-cache update (`et_vk.sdpa`, `llama::custom_sdpa`).

The convolutions come from ExecuTorch's own flow: a module quantized by the XNNPACKQuantizer
(static int8 activations, per-channel weights), converted, and lowered with the VulkanPartitioner,
which fuses dequantize -> conv [-> relu] -> quantize into one q8ta op. The flow quantizes no pixel
shuffle (the float op runs between a dequantize and a quantize), so q8ta_pixel_shuffle is called
directly, as is et_vk.sdpa, which no pass of the partitioner emits. custom_sdpa without an
update_cache cannot be lowered as is (the partitioner's causal_sdpa fusion asserts on it), so that
test lowers it with the fusion turned off.
"""

import functools
from unittest import mock

import numpy as np
import pytest
import torch

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls
from pte_wgpu.kernels import fusion
from pte_wgpu.kernels.quant import int8_conv, int8_gemm
from pte_wgpu.kernels.quant.quantize import REQUANTIZED_CLAMP

from .exporting import export_pte
from .hooks import Graph, resize
from .test_more_ops import _delegate_ops, _xnnpack_static, export_quantized

pytestmark = pytest.mark.anyio


def _output_steps(graph):
    """The quantization step of each output of a converted program (its last dequantize's scale)."""
    (output,) = graph.graph.find_nodes(op="output")
    return [float(node.args[1]) for node in output.args[0]]


async def _assert_within_one_step(model, graph, x):
    """Every output within one quantization step of the eager quantized program, and at least
    95% of them exact: the int8 sums are exact, the reference sums dequantized floats, so an
    output can land on the other side of a rounding boundary."""
    got = await model.execute(x)
    with torch.no_grad():
        want = graph(x)
    want = want if isinstance(want, tuple) else (want,)
    for g, w, step in zip(got, want, _output_steps(graph), strict=True):
        w = w.numpy()
        assert g.shape == w.shape
        assert np.max(np.abs(g - w)) <= step * 1.001
        assert np.mean(np.abs(g - w) < step / 2) >= 0.95


class Conv(torch.nn.Module):
    """A grouped convolution with a (3, 2) kernel, stride, padding and dilation."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(6, 8, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)

    def forward(self, x):
        return self.conv(x)


class Depthwise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)

    def forward(self, x):
        return torch.relu(self.conv(x))


class Pointwise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(5, 7, 1)

    def forward(self, x):
        return torch.relu(self.conv(x))


class Transposed(torch.nn.Module):
    """5 output channels: the partitioner pads the weight rows and scales to a multiple of 4."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.ConvTranspose2d(6, 5, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return self.conv(x)


INT8_CONVS = [
    (Conv, 6, "et_vk.q8ta_conv2d.default"),
    (Depthwise, 8, "et_vk.q8ta_conv2d_dw.default"),
    (Pointwise, 5, "et_vk.q8ta_conv2d_pw.default"),
    (Transposed, 6, "et_vk.q8ta_conv2d_transposed.default"),
]


def _int8_conv(make_module, cin, op):
    torch.manual_seed(cin)  # the calibration sample: the same in tests/prebuild.py's process
    sample = (torch.randn(2, cin, 7, 11),)
    return export_quantized(f"q8conv_{op}", _xnnpack_static, sample, make_module=make_module)


@pytest.mark.parametrize("make_module, cin, op", INT8_CONVS)
async def test_each_int8_convolution_matches_the_eager_quantized_program(load_pte, make_module, cin, op):
    pte, graph = _int8_conv(make_module, cin, op)
    assert op in _delegate_ops(pte)
    model = await load_pte(pte)
    torch.manual_seed(3)
    for x in (torch.randn(2, cin, 7, 11), torch.randn(2, cin, 7, 11) * 3):  # * 3: past the calibrated range
        await _assert_within_one_step(model, graph, x)


class TiledConvs(torch.nn.Module):
    """Convolutions of one group, the tiled route's (kernels/quant/int8_gemm.py): 3 -> 70 channels
    3x3 (K = 27: the weight rows' last word partly padding; two row tiles), then 70 -> 40 at (3, 5)
    with dilation (2, 1) (K = 1,050 over few tiles: split), then a pointwise 40 -> 67."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 70, 3, stride=2, padding=1)
        self.b = torch.nn.Conv2d(70, 40, (3, 5), padding=(2, 1), dilation=(2, 1))
        self.c = torch.nn.Conv2d(40, 67, 1)

    def forward(self, x):
        h = self.b(torch.relu(self.a(x)))
        return h, torch.relu(self.c(h))


def _tiled_convs():
    torch.manual_seed(5)
    return export_quantized("q8_tiled_convs", _xnnpack_static, (torch.randn(2, 3, 23, 29),), make_module=TiledConvs)


async def test_tiled_int8_convolutions_are_bitwise_the_direct_ones(load_pte, monkeypatch):
    """The tiled route sums the same integers as the direct kernel (zero points, padding, K splits,
    partial words), on int8 subgroup matrices where the device has them, and finishes each output
    with its arithmetic (in the product for the first and third convolutions: one K split, planes
    of whole words; in the word kernel for the second), so its outputs are bitwise the direct
    route's; and within one step of eager."""
    pte, graph = _tiled_convs()
    assert {"et_vk.q8ta_conv2d.default", "et_vk.q8ta_conv2d_pw.default"} <= _delegate_ops(pte)
    tiled = await load_pte(pte)
    monkeypatch.setattr(int8_conv, "tiled", lambda *args: False)
    direct = await load_pte(pte)
    product = "subgroupMatrixLoad" if tiled.int8_matrices else "dot4I8Packed(x0"  # the products' way (int8_gemm.py)
    products = lambda model: sum(product in (d.shader or "") for d in model.graph.dispatches)  # noqa: E731
    assert (products(tiled), products(direct)) == (3, 0)
    assert int8_gemm.split(40, 12 * 13, 1050, 2)[0] > 1  # the second convolution's K splits
    torch.manual_seed(6)
    for x in (torch.randn(2, 3, 23, 29), torch.randn(2, 3, 23, 29) * 3):
        for got, want in zip(await tiled.execute(x), await direct.execute(x), strict=True):
            np.testing.assert_array_equal(got, want)
        await _assert_within_one_step(tiled, graph, x)


class ConvRelu6(torch.nn.Module):
    """MobileNet's block: convolution, ReLU6 (left in float by the static int8 flow), convolution."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(5, 12, 3, padding=1), torch.nn.Conv2d(12, 7, 1)

    def forward(self, x):
        return self.b(torch.nn.functional.relu6(self.a(x)))


def _conv_relu6():
    torch.manual_seed(9)
    return export_quantized("q8_conv_relu6", _xnnpack_static, (torch.randn(1, 5, 9, 13),), make_module=ConvRelu6)


async def test_requantized_clamp_is_bitwise_the_three_ops(load_pte, monkeypatch):
    """dequantize -> hardtanh -> quantize runs as one pte_wgpu.requantized_clamp (kernels/fusion.py):
    the outputs bitwise those of the three ops, and within one step of eager."""
    pte, graph = _conv_relu6()
    fused = await load_pte(pte)
    monkeypatch.setattr(fusion, "_fuse_requantized_clamps", lambda graph: 0)
    apart = await load_pte(pte)
    ops = [{d.op for d in m.graph.dispatches} for m in (fused, apart)]
    assert REQUANTIZED_CLAMP in ops[0] and "aten.hardtanh.default" not in ops[0]
    assert REQUANTIZED_CLAMP not in ops[1] and "aten.hardtanh.default" in ops[1]
    torch.manual_seed(10)
    for x in (torch.randn(1, 5, 9, 13), torch.randn(1, 5, 9, 13) * 3):
        for got, want in zip(await fused.execute(x), await apart.execute(x), strict=True):
            np.testing.assert_array_equal(got, want)
    await _assert_within_one_step(fused, graph, torch.randn(1, 5, 9, 13))


class SmallCNN(torch.nn.Module):
    """conv + relu, depthwise + relu, two pointwise branches added, a transposed conv, pixel shuffle."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.pw, self.pw2 = torch.nn.Conv2d(8, 12, 1), torch.nn.Conv2d(8, 12, 1)
        self.up = torch.nn.ConvTranspose2d(12, 8, 2, stride=2)
        self.shuffle = torch.nn.PixelShuffle(2)

    def forward(self, x):
        h = torch.relu(self.dw(torch.relu(self.conv(x))))
        p = self.pw(h) + self.pw2(h)
        return self.shuffle(self.up(p)), p


def _int8_cnn():
    torch.manual_seed(0)
    return export_quantized("q8_cnn", _xnnpack_static, (torch.randn(1, 3, 7, 9),), make_module=SmallCNN)


PREBUILD = [functools.partial(_int8_conv, *case) for case in INT8_CONVS] + [_int8_cnn, _tiled_convs, _conv_relu6]  # tests/prebuild.py


async def test_small_int8_cnn_end_to_end(load_pte):
    pte, graph = _int8_cnn()
    ops = _delegate_ops(pte)
    convs = {f"et_vk.q8ta_conv2d{kind}.default" for kind in ("", "_dw", "_pw", "_transposed")}
    assert convs | {"et_vk.q8ta_add.default", "aten.pixel_shuffle.default"} <= ops
    await _assert_within_one_step(await load_pte(pte), graph, torch.randn(1, 3, 7, 9))


class Q8taPixelShuffle(torch.nn.Module):
    """Called directly; eager runs the op's reference (dequantize, pixel_shuffle, quantize)."""

    def forward(self, x):
        vk = torch.ops.et_vk
        return (
            vk.q8ta_pixel_shuffle.default(x, 0.031, -3, 1 / 0.045, 2, 3),  # requantized
            vk.q8ta_pixel_shuffle.default(x, 0.02, 5, 1 / 0.02, 5, 3),  # bytes moved as they are
        )


async def test_q8ta_pixel_shuffle_is_exact(load_pte):
    pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")  # the et_vk ops of the eager module

    sample = (torch.randint(-128, 128, (2, 18, 5, 7), dtype=torch.int8),)
    shapes = ({2: torch.export.Dim("H", min=1, max=5), 3: torch.export.Dim("W", min=1, max=7)},)
    pte, module = export_pte("q8ta_pixel_shuffle", Q8taPixelShuffle, sample, shapes)
    assert "et_vk.q8ta_pixel_shuffle.default" in _delegate_ops(pte)
    calls = dynamic_shape_calls(sample, shapes, n=4, seed=7)
    assert any(call[0].shape != sample[0].shape for call in calls)
    await assert_matches_eager(await load_pte(pte), module, calls, atol=0, rtol=0)


# -- attention without a KV-cache update ----------------------------------------------------------


class VkSdpa(torch.nn.Module):
    """et_vk.sdpa with an additive mask and the default scale, and with one kv head shared by the
    three query heads and an explicit scale."""

    def forward(self, q, k, v, mask, k1, v1):
        vk = torch.ops.et_vk
        return vk.sdpa.default(q, k, v, mask, None), vk.sdpa.default(q, k1, v1, None, 0.3)


S = torch.export.Dim("S", min=1, max=7)
VK_SDPA_SAMPLE = (
    torch.randn(2, 3, 7, 12),
    torch.randn(2, 3, 11, 12),
    torch.randn(2, 3, 11, 12),
    torch.randn(7, 11),
    torch.randn(2, 1, 11, 12),
    torch.randn(2, 1, 11, 12),
)
VK_SDPA_SHAPES = ({2: S}, None, None, {0: S}, None, None)


async def test_et_vk_sdpa_matches_eager_at_live_query_lengths(load_pte):
    pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")  # the et_vk ops of the eager module

    pte, module = export_pte("vk_sdpa", VkSdpa, VK_SDPA_SAMPLE, VK_SDPA_SHAPES)
    assert "et_vk.sdpa.default" in _delegate_ops(pte)
    calls = dynamic_shape_calls(VK_SDPA_SAMPLE, VK_SDPA_SHAPES, n=3, seed=4)
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-5, rtol=1e-4)


class CustomSdpa(torch.nn.Module):
    """custom_sdpa over caches of 13 positions from position 3, causal and not, 4 query heads on
    2 kv heads."""

    def forward(self, q, k_cache, v_cache):
        llama = torch.ops.llama
        return (
            llama.custom_sdpa.default(q, k_cache, v_cache, 3, None, 0.0, True, None),
            llama.custom_sdpa.default(q, k_cache, v_cache, 3, None, 0.0, False, 0.25),
        )


CUSTOM_SAMPLE = (torch.randn(1, 5, 4, 8), torch.randn(1, 13, 2, 8), torch.randn(1, 13, 2, 8))
CUSTOM_SHAPES = ({1: torch.export.Dim("Q", min=1, max=10)}, None, None)


async def test_custom_sdpa_matches_eager_at_live_query_lengths(load_pte):
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")  # the llama ops of the eager module
    from executorch.backends.vulkan.patterns import fusable_patterns

    with mock.patch.dict(fusable_patterns):
        del fusable_patterns["causal_sdpa"]  # it expects an update_cache beside every custom_sdpa
        pte, module = export_pte("custom_sdpa", CustomSdpa, CUSTOM_SAMPLE, CUSTOM_SHAPES)
    assert "llama.custom_sdpa.default" in _delegate_ops(pte)
    calls = dynamic_shape_calls(CUSTOM_SAMPLE, CUSTOM_SHAPES, n=3, seed=5)
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-5, rtol=1e-4)


def _q8ta_conv_graph(transposed):
    """A q8ta_conv2d(_transposed) call by hand: 6 -> 8 channels, kernel 3, stride 2, padding 1,
    two groups, at a maximum input of [2, 6, 9, 11]; (graph, x, out)."""
    from pte_wgpu.resize.values import Scalar, Tensor, ValueList

    g = Graph()
    pair = lambda v: g.add(ValueList((g.add(Scalar(v)), g.add(Scalar(v)))))  # noqa: E731
    x = g.add(Tensor("int8", (2, 6, 9, 11)))
    oh, ow = (18, 22) if transposed else (5, 6)
    out = g.add(Tensor("int8", (2, 8, oh, ow)))
    head = [x, g.add(Scalar(0.1)), g.add(Scalar(0)), g.add(Tensor("int8", (8, 28))), g.add(Tensor("int32", (8,)))]
    head += [g.add(Tensor("float32", (8,))), g.add(Scalar(0.2)), g.add(Scalar(0)), g.add(Scalar(None))]
    geometry = [pair(3), pair(2), pair(1)] + ([pair(1)] if transposed else []) + [pair(1)]
    return g, head + geometry + [g.add(Scalar(2)), g.add(Scalar("none")), out], x, out


@pytest.mark.parametrize(
    "transposed, live_in, live_out",
    [(False, (1, 6, 4, 7), (1, 8, 2, 4)), (True, (1, 6, 4, 7), (1, 8, 8, 14))],
)
def test_q8ta_conv_hooks_follow_the_live_input(transposed, live_in, live_out):
    """The partitioner lowers no dynamic q8ta convolution (ExecuTorch cannot resize them); the
    hooks still follow a smaller live input (no device)."""
    name = "et_vk.q8ta_conv2d_transposed.default" if transposed else "et_vk.q8ta_conv2d.default"
    g, args, x, out = _q8ta_conv_graph(transposed)
    state = resize(g, name, args, {x: live_in})
    assert state.dims[out] == live_out
    assert state.grids == [(-(-np.prod(live_out) // 4 // 64), 1, 1)]
    with pytest.raises(ValueError, match=name):
        resize(g, name, args, {x: (1, 5, 4, 7)})  # 5 channels for a weight of 6


class Q8taConvRelu(torch.nn.Module):
    """q8ta_conv2d_pw and q8ta_conv2d_dw called directly with relu and output zero points inside
    the int8 range: from the flow, a relu's output range starts at 0, so the requantizing clamp
    alone would hide a missing relu. Weights as the partitioner stores them: pointwise [Cout, Cin]
    with rows padded to 8, depthwise [kh, kw, C]; scales and bias padded to a multiple of 4."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w_pw", torch.randint(-127, 128, (7, 8), dtype=torch.int8))
        self.register_buffer("s_pw", torch.rand(8) * 0.01 + 0.002)
        self.register_buffer("b_pw", torch.randn(8))
        self.register_buffer("w_dw", torch.randint(-127, 128, (3, 3, 8), dtype=torch.int8))
        self.register_buffer("s_dw", torch.rand(8) * 0.01 + 0.002)
        self.register_buffer("sums", torch.zeros(8, dtype=torch.int32))  # unused by both

    def forward(self, x5, x8):
        vk = torch.ops.et_vk
        pw = vk.q8ta_conv2d_pw.default(
            x5, 0.05, -3, self.w_pw, self.sums, self.s_pw, 0.04, 9, self.b_pw, [1, 1], [1, 1], [0, 0], [1, 1], 1, "relu"
        )
        dw = vk.q8ta_conv2d_dw.default(
            x8, 0.03, 4, self.w_dw, self.sums, self.s_dw, 0.05, -11, None, [3, 3], [2, 1], [1, 1], [1, 2], 8, "relu"
        )
        return pw, dw


async def test_q8ta_convolutions_apply_relu_before_requantizing(load_pte):
    pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")  # the et_vk ops of the eager module

    sample = (torch.randint(-128, 128, (1, 5, 7, 9), dtype=torch.int8), torch.randint(-128, 128, (2, 8, 11, 7), dtype=torch.int8))
    pte, module = export_pte("q8ta_conv_relu", Q8taConvRelu, sample)
    assert {"et_vk.q8ta_conv2d_pw.default", "et_vk.q8ta_conv2d_dw.default"} <= _delegate_ops(pte)
    got = await (await load_pte(pte)).execute(*sample)
    with torch.no_grad():
        want = module(*sample)
    for g, w, zp in zip(got, want, (9, -11), strict=True):
        w = w.numpy().astype(np.int32)
        assert g.shape == w.shape and g.min() == zp  # the relu's zero, not the int8 minimum
        assert np.max(np.abs(g.astype(np.int32) - w)) <= 1
        assert np.mean(g == w) >= 0.95


def test_q8ta_pixel_shuffle_rejects_channels_the_factor_does_not_divide():
    from pte_wgpu.resize.values import Scalar, Tensor

    g = Graph()
    x = g.add(Tensor("int8", (1, 10, 3, 5)))  # 10 channels: no multiple of the factor 3 squared
    args = [x] + [g.add(Scalar(v)) for v in (0.1, 0, 10.0, 0, 3)] + [g.add(Tensor("int8", (1, 1, 9, 15)))]
    with pytest.raises(ValueError, match="q8ta_pixel_shuffle"):
        resize(g, "et_vk.q8ta_pixel_shuffle.default", args, {})
