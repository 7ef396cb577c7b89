"""Ops end to end: elementwise, comparison and logic ops, transposes and copies, the
quantize/dequantize family, and int8 PT2E-quantized models, each exported with the
VulkanPartitioner and compared with torch eager on the same inputs. Prime and odd sizes; dynamic
dims run at several live sizes in random order, their minimum and maximum included."""

import functools
import hashlib
import importlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls
from async_runtime.vulkan_patterns import cache_vulkan_pattern_graphs
from pte_wgpu.kernels.quant import int8_gemm
from pte_wgpu.resize.values import Scalar, SymInt

from . import exporting
from .exporting import eager, export_pte, stored_pte, without_delegates
from .hooks import Graph, resize

pytestmark = pytest.mark.anyio
S = torch.export.Dim("S", min=1, max=11)


class Pointwise(torch.nn.Module):
    """The elementwise, comparison and logic ops the registry names, and the transposes."""

    def forward(self, x, y, m):
        pos = x.abs() + 0.5
        big = x > 0.3
        return (
            torch.minimum(x, y),
            torch.log10(pos),
            torch.nn.functional.hardshrink(x, 0.4),
            *(op(x, y).float() for op in (torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge)),
            *(op(x, 0.25).float() for op in (torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge)),
            torch.eq(torch.round(x), 0.0).float(),  # an Int-valued Scalar meets a float tensor
            torch.bitwise_and(big, m).float(),
            torch.bitwise_or(big, m).float(),
            torch.logical_and(big, m).float(),
            torch.logical_or(x, m).float(),
            x[0].t() * 2,
        )


POINTWISE_SAMPLE = (torch.randn(3, 11, 5), torch.randn(3, 11, 5), torch.rand(3, 11, 5) > 0.5)
POINTWISE_SHAPES = ({1: S}, {1: S}, {1: S})


async def test_pointwise_comparison_and_logic_ops_at_live_sizes(load_pte):
    pte, module = export_pte("more_pointwise", Pointwise, POINTWISE_SAMPLE, POINTWISE_SHAPES)
    calls = dynamic_shape_calls(POINTWISE_SAMPLE, POINTWISE_SHAPES, n=5, seed=2)
    calls.append((torch.full((3, 7, 5), 0.25), torch.full((3, 7, 5), 0.25), torch.ones(3, 7, 5, dtype=torch.bool)))
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-6, rtol=1e-6)


# -- quantize / dequantize -------------------------------------------------------------------------

QD = torch.ops.quantized_decomposed


class QuantizeOps(torch.nn.Module):
    """quantize per channel (axis 1) and per token of a float input, dequantize per channel (zero
    points given or None) and per token of an int8 input, choose_qparams per tensor and per token,
    torchao's quantize_affine / dequantize_affine per row, and embedding_4bit. A dequantize
    never meets its own quantize here: ExecuTorch's Vulkan preprocess folds such a pair away."""

    def __init__(self, affine=True):
        super().__init__()
        self.affine = affine  # torchao's affine ops too (they have no portable kernel)
        self.register_buffer("scales", torch.tensor([0.011, 0.02, 0.0137, 0.05, 0.009, 0.031, 0.0071]))
        self.register_buffer("zps", torch.tensor([3, -7, 0, 12, -128, 127, 1], dtype=torch.int32))
        self.register_buffer("table", torch.randint(0, 256, (6, 8), dtype=torch.uint8))  # 6 rows of 16 nibbles
        self.register_buffer("table_scales", torch.rand(6, 2) + 0.1)

    def forward(self, x, q, idx):
        i8 = torch.int8
        ts = (x.abs().amax(-1, keepdim=True) / 100 + 0.001).to(torch.float64)
        tz = torch.round(x[..., :1] * 10).to(torch.int64)
        row_scale = x.abs().amax(-1, keepdim=True) / 127 + 0.01
        row_zp = torch.round(x[..., :1]).to(torch.int32)
        block = (1, 1, x.shape[-1])
        return (
            QD.quantize_per_channel.default(x, self.scales, self.zps, 1, -128, 127, i8),
            QD.dequantize_per_channel.default(q, self.scales, self.zps, 1, -128, 127, i8),
            QD.dequantize_per_channel.default(q, self.scales, None, 1, -128, 127, i8),
            QD.quantize_per_token.default(x, ts, tz, -128, 127, i8),
            QD.dequantize_per_token.default(q, ts, tz, -128, 127, i8, torch.float32),
            *QD.choose_qparams.tensor(x, -128, 127, 1e-7, i8),
            *QD.choose_qparams_per_token_asymmetric.default(x, i8),
            *(torch.ops.torchao.quantize_affine(x, block, row_scale, row_zp, i8, -128, 127),
              torch.ops.torchao.dequantize_affine(q, block, row_scale, row_zp, i8, -128, 127))[: 2 if self.affine else 0],
            QD.embedding_4bit.dtype(self.table, self.table_scales, None, -8, 7, idx, dtype=torch.float32),
        )


QUANT_SAMPLE = (torch.randn(5, 7, 13) * 3, torch.randint(-128, 128, (5, 7, 13), dtype=torch.int8), torch.tensor([5, 0, 3]))
K = torch.export.Dim("K", min=1, max=13)
QUANT_SHAPES = ({2: K}, {2: K}, None)


class PortableUnary(torch.nn.Module):
    """Unary ops the Vulkan partitioner leaves outside its delegates (ExecuTorch's portable kernels'
    `.out` names), on a dynamic dim, among delegated ops."""

    def forward(self, x):
        unit = torch.tanh(x)  # in (-1, 1)
        return (
            torch.log(x.abs() + 0.25), torch.log2(x.abs() + 0.25), torch.erf(x), torch.expm1(x * 0.001), torch.expm1(x),
            torch.log1p(x * 0.001), torch.log1p(x.abs()), torch.tan(unit), torch.sinh(x), torch.cosh(x),
            torch.asin(unit), torch.asin(x), torch.acos(unit), torch.acos(x * 0.3), torch.atan(x), torch.atan(x * 40),
            torch.asinh(x), torch.acosh(x.abs() + 1.0), torch.atanh(unit * 0.9), torch.reciprocal(x),
            torch.floor(x * 3), torch.ceil(x * 3), torch.trunc(x * 3), torch.sign(x),
            torch.isnan(torch.log(x)).float(), torch.isinf(torch.reciprocal(x * 0)).float(),
        )


async def test_portable_unary_ops_at_live_sizes(load_pte):
    """Each runs outside the delegate (a KernelCall of its .out kernel) and matches torch eager,
    NaN where torch has NaN; expm1 and log1p of small values keep their digits."""
    sample = torch.randn(3, 11, 5)
    pte, module = export_pte("portable_unary", PortableUnary, [sample], dynamic_shapes=({1: S},))
    outside = {name for name in _kernel_calls(pte) if name.startswith("aten::")}
    assert {"aten::log.out", "aten::erf.out", "aten::floor.out", "aten::sign.out", "aten::isnan.out"} <= outside, outside
    calls = []
    for (x,) in dynamic_shape_calls((sample,), ({1: S},), n=4, seed=3):
        x = np.array(x, np.float32)
        x.flat[::7] = 0.0  # 1 / 0, log(0)
        calls.append((x,))
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-6, rtol=1e-5)


class BinaryMath(torch.nn.Module):
    """pow of two tensors, and of a tensor by the numbers torch computes another way (0.5: sqrt) and
    others; atan2 (which ExecuTorch leaves to its portable kernels)."""

    def forward(self, x, y):
        return torch.pow(x, y), x**2, x**3, x**0.5, x**-0.5, x**-1, x**-2, x**-1.5, x**1.7, torch.atan2(x, y)


async def test_pow_and_atan2_at_every_kind_of_argument_as_torch(load_pte):
    """Every pair of NaN, +-Inf, +-0, +-1, integral and fractional numbers of either sign as the two
    arguments: torch's NaNs, its signs of zeros and infinities, its values to 1e-5 (WGSL's pow is
    exp2(b * log2(a)), indeterminate for a negative or NaN base; its atan2 may be 4096 ULP off)."""
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, 1.5, -1.5, 0.25, 7.0], np.float32)
    x, y = np.meshgrid(special, special, indexing="ij")
    pte, module = export_pte("binary_math", BinaryMath, [torch.randn(17, 17), torch.randn(17, 17)])
    assert "aten::atan2.out" in _kernel_calls(pte)
    outs = await (await load_pte(pte)).execute(x, y)
    for k, (out, want) in enumerate(zip(outs, eager(module, x, y), strict=True)):
        np.testing.assert_array_equal(np.isnan(out), np.isnan(want), err_msg=f"output {k}")
        exact = (want == 0) | np.isinf(want)
        np.testing.assert_array_equal(np.signbit(out[exact]), np.signbit(want[exact]), err_msg=f"output {k}")
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=0, equal_nan=True, err_msg=f"output {k}")


class NoDelegate(torch.nn.Module):
    """Ops ExecuTorch's portable kernels run (elementwise, clamps by numbers, pooling, resampling,
    variances, topk, the padding modes' index arithmetic), with static views between them that its
    memory planning folds into their bases' bytes (pixel_shuffle's and flatten's): views of an
    input, of an op's result and as an output."""

    def forward(self, x, m, i):
        f = torch.nn.functional
        return (
            f.pixel_shuffle(x[:, :4], 2), f.pixel_unshuffle(x, 2), x.flatten(1) * 2, x.reshape(2, 8, 60),
            f.avg_pool2d(x, 3, stride=2, padding=1), f.interpolate(x, scale_factor=2, mode="nearest"),
            f.interpolate(x, size=(7, 9), mode="bilinear", align_corners=False), x.unfold(3, 2, 2),
            torch.bitwise_and(m, x > 0).float(), torch.bitwise_or(m, x > 0).float(), torch.bitwise_xor(m, x > 0).float(),
            torch.bitwise_and(i, 6), torch.bitwise_or(i, 9), torch.bitwise_xor(i, i.flip(0)),
            torch.logical_xor(m, x > 0.5).float(), x.masked_fill(m, -1.5), 2.5 - x, torch.remainder(x, 0.7), torch.fmod(x, -0.7),
            torch.floor_divide(x, 0.3), torch.remainder(i, 7), torch.fmod(i, -7), torch.floor_divide(i, 3), torch.remainder(i, i.flip(0) | 1),
            torch.fmod(i, i.flip(0) | 1), torch.fmod(x, x.flip(0) + 3.0),
            x.var(1), x.var((0, 2), unbiased=False, keepdim=True), torch.var(x, dim=-1, correction=2), torch.var(x),
            *torch.topk(x.flatten(1), 7), *torch.topk(x, 3, dim=1, largest=False), x.prod(1), x[:, :3].prod(),
            f.elu(x), f.elu(x, alpha=0.7), torch.ops.aten.elu(x, 0.5, 2.0, 1.5), torch.logit(torch.sigmoid(x)), torch.logit(x, eps=0.2),
            x.clamp(-0.5, 0.7), i.clamp(-3, 5), f.hardtanh(x, -0.3, 0.4), f.leaky_relu(x, 0.2), f.hardshrink(x, 0.3),
            f.pad(x, (2, 1, 1, 0), mode="replicate"), f.pad(x, (2, 1, 3, 2), mode="reflect"), torch.tril(x, 1), torch.roll(x, (2, -1), (1, 3)),
        )


async def test_a_program_without_delegates_and_its_folded_views(load_pte):
    """A program lowered with no partitioner: every op a portable kernel, each static view a tensor
    that shares its base's memory with no instruction between them. Equal to torch eager (on inputs
    of a fixed seed: logit(sigmoid(x)) magnifies the last bits of exp and log where |x| is large)."""
    g = torch.Generator().manual_seed(3)
    sample = (torch.randn(2, 8, 6, 10, generator=g), torch.rand(2, 8, 6, 10, generator=g) > 0.5,
              torch.randint(-40, 40, (7, 5), dtype=torch.int32, generator=g))
    module = NoDelegate()
    pte = without_delegates("no_delegate", module, sample)
    x, m, i = (t.numpy() for t in sample)
    outs = await (await load_pte(pte)).execute(x, m, i)
    for k, (out, want) in enumerate(zip(outs, eager(module, x, m, i), strict=True)):
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6, err_msg=f"output {k}")
    wanted = {"remainder.Tensor_out", "fmod.Tensor_out", "logical_xor.out", "avg_pool2d.out", "var.correction_out", "topk.values", "prod.int_out", "elu.out",
              "clamp.out", "hardtanh.out", "leaky_relu.out"}
    assert {f"aten::{name}" for name in wanted} <= _kernel_calls(pte), sorted(_kernel_calls(pte))


class Everyday(torch.nn.Module):
    """The everyday ops of models (softmax, reductions, cat, pad, embedding, gather, products, splits,
    comparisons, bitwise and logical ops, activations, creation, norms, views) by their portable
    kernels' names."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)

    def forward(self, x, y, i, m):
        f = torch.nn.functional
        return (
            torch.softmax(x, -1), torch.softmax(x, 1), torch.log_softmax(x, 0),
            torch.all(m, 1), torch.all(m), m.any(0), x.amax((0, 2)), x.amin(1, keepdim=True), x.argmin(1), x.argmax(-1),
            torch.cat([x, y], 1), torch.cat([x, y * 2], -1), f.pad(x, (1, 2, 0, 3), value=0.5),
            torch.div(x, 0.3, rounding_mode="floor"), torch.div(x, 0.3, rounding_mode="trunc"), x / 3.0,
            self.emb(i.abs()), torch.gather(x, 1, i[:4].abs().remainder(5).reshape(1, 4, 1).expand(3, 4, 7)),
            x.mean(), x.mean((0, 2)), x.sum(), x.sum(1), x[0] @ y[0].t(), torch.mm(x[0], y[1].t()),
            *torch.split(x, [2, 3], 1), *torch.split(x, 3, 2), x[:, :1].squeeze(1), x[:1].squeeze(), x[0].t(),
            x > y, x >= y, x < y, x <= y, x == y, x != y, x > 0.1, x >= 0.1, x < 0.1, x <= 0.1, x == 0.0, x != 0.0,
            torch.bitwise_and(m, x > 0), torch.bitwise_or(m, x > 0), torch.bitwise_xor(m, x > 0), torch.bitwise_not(m), ~i,
            i & 5, i | 5, i ^ 5, torch.logical_and(m, x > 0), torch.logical_not(m),
            f.hardswish(x), f.hardshrink(x, 0.3), torch.round(x * 3), torch.rsqrt(x.abs() + 0.1), torch.sqrt(x.abs()),
            f.silu(x), torch.sin(x), torch.cos(x), torch.tanh(x), torch.exp(x), torch.log10(x.abs() + 0.1), -x,
            torch.minimum(x, y), torch.maximum(x, y), x + 2.5, x - 1.5, torch.sub(x, y, alpha=2.0), torch.add(x, y, alpha=0.5),
            torch.zeros(3, 4) + x[:, :4, 0], torch.ones(3, 4) + x[:, :4, 1], torch.zeros_like(x) + 1, torch.ones_like(x) * 2,
            torch.arange(7) * 2, torch.arange(2, 9, 3), x.var(1), x.var(), x.std(0), x.clone() * 3, x.to(torch.float64).to(torch.float32) + 1,
            f.pixel_shuffle(x[None, :, :4, :4].reshape(1, 12, 2, 2), 2), f.pixel_unshuffle(x[None, :, :4, :4], 2),
            torch.where(m, x, y), x.masked_fill(m, 2.0), torch.clamp(x, -0.5), torch.abs(x), torch.sigmoid(x), f.gelu(x), f.gelu(x, approximate="tanh"),
            f.relu(x), f.leaky_relu(x), f.elu(x), x.flip(1), x.repeat(1, 2, 1), x.permute(2, 0, 1) + 0, x.expand(2, 3, 5, 7) + 0,
            torch.cumsum(x, 1), x.unsqueeze(0) + 0, x.view(15, 7) + 0, x[:, 1] + 0, x[:, 1:4:2] + 0, x.index_select(1, i[:3].abs() % 5),
            f.layer_norm(x, (7,)), f.group_norm(x[None], 3), torch.bmm(x, y.transpose(1, 2)), f.linear(x, y[0], y[1, :, 0]),
        )

async def test_everyday_ops_as_portable_kernels(load_pte):
    """A program lowered with no partitioner of the ops most models are made of, each output equal to
    torch eager's (integers exactly: ~ of an int flips its bits)."""
    torch.manual_seed(1)
    x, y = torch.randn(3, 5, 7), torch.randn(3, 5, 7)
    i, m = torch.tensor([3, -2, 0, 7, 10, 1, 4]), torch.rand(3, 5, 7) > 0.5
    module = Everyday().eval()
    pte = without_delegates("everyday", module, (x, y, i, m))
    wanted = {"_softmax.out", "_log_softmax.out", "any.dims_out", "amax.out", "argmin.out", "cat.out", "constant_pad_nd.out", "embedding.out",
              "gather.out", "mean.dtype_out", "mm.out", "bmm.out", "split_with_sizes_copy.out", "bitwise_not.out", "cumsum.out", "native_group_norm.out"}
    assert {f"aten::{name}" for name in wanted} <= _kernel_calls(pte), sorted(_kernel_calls(pte))
    args = [t.numpy() for t in (x, y, i, m)]
    outs = await (await load_pte(pte)).execute(*args)
    for k, (out, want) in enumerate(zip(outs, eager(module, *args), strict=True)):
        assert out.shape == want.shape, k
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=f"output {k}")


class LiveWithoutDelegates(torch.nn.Module):
    """Ops outside any delegate at a live dim: reductions, cat, pads, products, comparisons, norms,
    topk, tril, roll and the padding modes (SymInt arithmetic: sym_size, prim sub and mod), resampling,
    distances, index_put, and views of a live shape (memory planning's et_view)."""

    def forward(self, x, y, m):
        f = torch.nn.functional
        return (
            torch.softmax(x, -1), torch.softmax(x, 1), torch.all(m, 1), x.amax((0, 2)), x.amin(1, keepdim=True), x.argmin(1),
            torch.cat([x, y], 1), f.pad(x, (1, 2, 0, 3), value=0.5), torch.div(x, 0.3, rounding_mode="floor"),
            x.mean(), x.mean((0, 2)), x.sum(1), torch.bmm(x, y.transpose(1, 2)), x[:, :1].squeeze(1), x > y, x <= 0.1,
            torch.where(m, x, y), f.gelu(x), x.flip(1), x.repeat(1, 2, 1), x.permute(2, 0, 1) + 0, torch.cumsum(x, 1),
            f.layer_norm(x, (7,)), x.var(1), torch.topk(x, 2, dim=2)[0], x.max(1)[0], torch.tril(x), torch.roll(x, 1, 1),
            f.pad(x, (2, 1), mode="reflect"), f.pad(x, (2, 1), mode="replicate"), f.interpolate(x, scale_factor=2),
            torch.cdist(x, y), torch.clamp(x, y), x.index_put((torch.tensor([0, 2]),), y[:2, :1]),
            (x * 2).reshape(3, -1) + 1, (x - y).view(-1)[:5] * 3, (x + 1).flatten(0, 1).sum(1),
        )

async def test_a_program_without_delegates_at_live_sizes(load_pte):
    """ExecuTorch's prim ops (a live size, its arithmetic) run beside the portable kernels, whose
    hooks they drive: every output equal to torch eager at live sizes in random order, the least
    and the most included (before: such a program was refused at load)."""
    live = torch.export.Dim("live", min=2, max=11)
    sample, shapes = (torch.randn(3, 11, 7), torch.randn(3, 11, 7), torch.rand(3, 11, 7) > 0.5), ({1: live},) * 3
    module = LiveWithoutDelegates()
    pte = without_delegates("live_without_delegates", module, sample, dynamic_shapes=shapes)
    assert {"aten::sym_size.int", "executorch_prim::sub.Scalar", "executorch_prim::mod.Scalar", "executorch_prim::et_view.default"} <= _kernel_calls(pte)
    calls = dynamic_shape_calls(sample, shapes, n=6, seed=3)
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-5, rtol=1e-5)


class Distances(torch.nn.Module):
    """Ops ExecuTorch leaves to its portable kernels: clamp by tensors, a number to a tensor's
    power, powers of integers, diagonals, as_strided, circular padding (an empty tensor that copies
    and slice scatters fill) and p-norm distances."""

    def forward(self, x, y, i):
        f = torch.nn.functional
        return (
            torch.clamp(x, y, y + 0.5), torch.clamp(x, min=y[0]), torch.clamp(x, max=y[:, :1]), torch.clamp(x, y + 0.5, y),
            torch.pow(2.0, x), torch.pow(-1.5, i), torch.pow(i, i.flip(0).abs() % 5), i**3,
            torch.diagonal(x, 1), torch.diagonal(x, -2), torch.diagonal(x[None].expand(3, 7, 11), 0, 0, 2), torch.as_strided(x, (3, 4), (5, 2), 1),
            f.pad(x[None], (2, 1), mode="circular"),
            torch.cdist(x, y), torch.cdist(x[None, :, :5], y[:, None, :5].expand(7, 2, 5), p=1.0), torch.cdist(x[:3], y, p=float("inf")),
            torch.cdist(x, y, p=0.0), torch.cdist(x, y, p=1.5), f.pdist(x), f.pdist(y, p=3.0),
            *torch.var_mean(y, 1), *torch.var_mean(y, (0, 1), correction=0, keepdim=True),
        )


async def test_clamps_by_tensors_powers_diagonals_and_distances(load_pte):
    """Each runs outside any delegate as its portable kernel, equal to torch eager: NaN where a
    bound is, the upper bound where the lower passes it; integer powers exact (wrapping as torch's).
    var_mean stays one op where the lowering is told to keep it."""
    torch.manual_seed(5)
    x, y = torch.randn(7, 11), torch.randn(7, 11)
    x[0, 0], y[1, 1], x[2, 3] = float("nan"), float("nan"), 0.0
    x[3] = y[3]  # a distance of 0
    i = torch.randint(-9, 10, (13,), dtype=torch.int32)
    module = Distances()
    pte = without_delegates("portable_distances", module, (x, y, i), keep=[torch.ops.aten.var_mean.correction])
    wanted = {"var_mean.correction_out", "clamp.Tensor_out", "pow.Scalar_out", "pow.Tensor_Tensor_out", "diagonal_copy.out", "as_strided_copy.out",
              "copy.out", "_cdist_forward.out", "_pdist_forward.out"}
    assert {f"aten::{name}" for name in wanted} | {"dim_order_ops::_empty_dim_order.out"} <= _kernel_calls(pte), sorted(_kernel_calls(pte))
    args = [t.numpy() for t in (x, y, i)]
    outs = await (await load_pte(pte)).execute(*args)
    for k, (out, want) in enumerate(zip(outs, eager(module, *args), strict=True)):
        assert out.shape == want.shape, k
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5, equal_nan=True, err_msg=f"output {k}")


class LiveDistances(torch.nn.Module):
    def forward(self, x, y):
        return torch.cdist(x, y, p=1.0), torch.cdist(y, x), torch.diagonal(x, 2), torch.clamp(x, y[0], y[1]), torch.pow(0.5, x)


async def test_distances_and_diagonals_at_live_sizes(load_pte):
    """The same ops at live row counts in random order, the least and the most included (pdist's
    output size of a live count is a division ExecuTorch cannot emit)."""
    rows = torch.export.Dim("rows", min=2, max=13)
    sample, shapes = (torch.randn(13, 5), torch.randn(3, 5)), ({0: rows}, None)
    pte, module = export_pte("live_distances", LiveDistances, sample, shapes)
    assert {"aten::_cdist_forward.out", "aten::diagonal_copy.out", "aten::clamp.Tensor_out", "aten::pow.Scalar_out"} <= _kernel_calls(pte)
    calls = dynamic_shape_calls(sample, shapes, n=5, seed=4)
    assert {c[0].shape[0] for c in calls} >= {2, 13}
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-5, rtol=1e-5)


def _small_cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.GroupNorm(4, 16), torch.nn.GELU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, 10), torch.nn.LogSoftmax(-1),
    ).eval()


def _encoder_layer():
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0).eval()


@pytest.mark.parametrize("make_module, shape", [(_small_cnn, (2, 3, 17, 15)), (_encoder_layer, (2, 7, 32))], ids=["cnn", "encoder_layer"])
async def test_whole_models_without_delegates(load_pte, make_module, shape):
    """Models lowered with no partitioner, so every op is a portable kernel: a CNN (batch norm, max
    pooling with its indices, group norm, adaptive pooling, log-softmax) and a transformer encoder
    layer (layer norm, attention's products and softmax); an op of several outputs lists them, then
    the list of them, where the delegate's form has the list alone. Equal to torch eager."""
    module, x = make_module(), torch.randn(*shape)
    pte = without_delegates(f"no_delegate_{make_module.__name__}", module, (x,))
    from async_runtime.program.pte import read_program

    assert not read_program(pte).methods["forward"].delegates
    assert _kernel_calls(pte) & {"aten::native_layer_norm.out", "aten::max_pool2d_with_indices.out"}
    (out,) = await (await load_pte(pte)).execute(x.numpy())
    np.testing.assert_allclose(out, eager(module, x.numpy())[0], rtol=1e-5, atol=1e-5)


async def test_quantize_dequantize_and_choose_qparams(load_pte):
    pytest.importorskip("executorch.exir")  # registers the quantized_decomposed ops the eager module calls (its export may be stored)
    pte, module = export_pte("more_quantize", QuantizeOps, QUANT_SAMPLE, QUANT_SHAPES)
    calls = dynamic_shape_calls(QUANT_SAMPLE, QUANT_SHAPES, n=4, seed=1)
    calls = [(x * 40, q, i) for x, q, i in calls]  # past the int8 range: clamping
    calls[0][0].view(-1)[:4] = torch.tensor([0.5, 1.5, -0.5, 2.5]) * 0.011  # near halfway
    # Integer outputs exact; per-token's eager math is in double (its scales are), f32 here.
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-6, rtol=1e-6)


class QuantizedTables(torch.nn.Module):
    """Embedding tables of 8, 4 and 2 bits a value, as ExecuTorch's LLM export quantizes them
    (`embedding_quantize` "8,g", "4,g", "2,g": no zero points, scales f16 or f32), and an 8-bit
    one with zero points; 30 rows of 20 values (rows of 5 bytes at 2 bits, 10 at 4)."""

    def __init__(self):
        super().__init__()
        qd = torch.ops.quantized_decomposed
        self.qd = qd
        self.register_buffer("w8", torch.randint(-128, 128, (30, 20), dtype=torch.int8))
        self.register_buffer("s8", torch.rand(30, 4) * 0.02 + 0.001)
        self.register_buffer("z8", torch.randint(-5, 6, (30, 4)).float())
        self.register_buffer("s8_row", (torch.rand(30) * 0.02 + 0.001).half())
        self.register_buffer("w4", torch.randint(0, 256, (30, 10), dtype=torch.uint8))
        self.register_buffer("s4", torch.rand(30, 2) + 0.1)
        self.register_buffer("w2", torch.randint(0, 256, (30, 5), dtype=torch.uint8))
        self.register_buffer("s2", torch.rand(30, 5) + 0.1)

    def forward(self, idx):
        qd = torch.ops.quantized_decomposed
        return (
            qd.embedding_byte.dtype(self.w8, self.s8, None, -128, 127, idx, dtype=torch.float32),
            qd.embedding_byte.dtype(self.w8, self.s8, self.z8, -128, 127, idx, dtype=torch.float32),
            qd.embedding_byte.dtype(self.w8, self.s8_row, None, -128, 127, idx, dtype=torch.float16).float(),
            qd.embedding_4bit.dtype(self.w4, self.s4, None, -8, 7, idx, dtype=torch.float32),
            qd.embedding_2bit.dtype(self.w2, self.s2, None, -2, 1, idx, dtype=torch.float32),
        )


@pytest.mark.parametrize("delegated", [True, False], ids=["beside_a_delegate", "without_delegates"])
async def test_quantized_embedding_tables(load_pte, delegated):
    """Rows of each table at several counts of indices (a live dim), the first and last rows among
    them, equal to ExecuTorch's reference decompositions: the tables' portable kernels beside a
    delegate (which takes the 4-bit table) and in a program without one."""
    pytest.importorskip("executorch.exir")  # registers the quantized_decomposed ops the eager module calls
    torch.manual_seed(3)
    module = QuantizedTables()
    count = torch.export.Dim("count", min=1, max=13)
    sample, shapes = (torch.tensor([0, 29, 3, 17, 8, 1, 28, 14, 5, 22, 9, 11, 2]),), ({0: count},)
    if delegated:
        pte, module = export_pte("quantized_tables", QuantizedTables, sample, shapes, seed=3)
    else:
        pte = without_delegates("quantized_tables_portable", module, sample, dynamic_shapes=shapes)
    outside = ("byte", "2bit") if delegated else ("byte", "4bit", "2bit")  # the partitioner takes the 4-bit table
    assert {f"quantized_decomposed::embedding_{bits}.dtype_out" for bits in outside} <= _kernel_calls(pte)
    calls = dynamic_shape_calls(sample, shapes, n=5, seed=2)
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-5, rtol=1e-3)


async def test_quantize_ops_as_portable_kernels(load_pte):
    """The same ops by the names of ExecuTorch's quantized kernels (quantized_decomposed::*.out),
    lowered with no partitioner (torchao's affine ops have no such kernel): integers exact, floats
    to 1e-6, as the delegate's."""
    pytest.importorskip("executorch.exir")
    torch.manual_seed(0)
    module = QuantizeOps(affine=False).eval()
    pte = without_delegates("quantize_ops_portable", module, QUANT_SAMPLE)
    wanted = {"quantize_per_channel.out", "dequantize_per_channel.out", "quantize_per_token.out", "dequantize_per_token.out",
              "choose_qparams.Tensor_out", "choose_qparams_per_token_asymmetric.out", "embedding_4bit.dtype_out"}
    assert {f"quantized_decomposed::{name}" for name in wanted} <= _kernel_calls(pte), sorted(_kernel_calls(pte))
    x, q, i = QUANT_SAMPLE
    await assert_matches_eager(await load_pte(pte), module, [(x, q, i), (x * 40, q, i.flip(0))], atol=1e-6, rtol=1e-6)


# -- PT2E-quantized models -------------------------------------------------------------------------

_QUANTIZED = {}


class LinearReluAdd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(20, 12), torch.nn.Linear(12, 12)

    def forward(self, x):
        h = torch.relu(self.l1(x))
        return self.l2(h) + h


class LinearAddRelu(LinearReluAdd):
    """Add then relu: XNNPACK's quantizer gives the sum an output range from 0, so the relu is
    the requantizing clamp of q8ta_add and leaves the graph."""

    def forward(self, x):
        h = torch.relu(self.l1(x))
        return torch.relu(self.l2(h) + h)


def export_quantized(name, quantizer, sample, dynamic_shapes=None, make_module=LinearReluAdd, calibration=()):
    """(pte bytes, the converted eager program) of `make_module()` quantized by `quantizer()` with
    ExecuTorch's PT2E flow (as its Vulkan tests quantize_and_lower_module), calibrated on `sample`
    and the input tuples of `calibration`, once per session. Both are kept in the export store
    (tests/exporting.py) under `name` and a digest of the calibration inputs, which they depend on:
    the .pte, and the converted program as an exported program (`.pt2`), which a machine without
    torchao (the GPU's) reads back; with torchao the program is made again each session (seconds:
    the lowering is what takes long)."""
    if name in _QUANTIZED:
        return _QUANTIZED[name]
    digest = hashlib.sha1(b"".join(t.numpy().tobytes() for inputs in (sample, *calibration) for t in inputs)).hexdigest()[:12]
    key = f"{name}_{digest}"
    stored = Path(exporting.STORE) / f"{key}.pt2" if exporting.STORE else None
    if importlib.util.find_spec("torchao") is None:
        if stored is None or not stored.exists():
            pytest.skip(f"the converted program {key!r} is not in the store, and torchao is not installed to make it")
        importlib.import_module("torch.ao.quantization.fx._decomposed")  # the quantized_decomposed ops the program calls
        _QUANTIZED[name] = (stored_pte(key, None), torch.export.load(stored).module())
        return _QUANTIZED[name]
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    cache_vulkan_pattern_graphs()
    torch.manual_seed(0)
    module = make_module().eval()
    graph = torch.export.export(module, sample, dynamic_shapes=dynamic_shapes, strict=True).module()
    graph = prepare_pt2e(graph, quantizer())
    for inputs in (sample, *calibration):
        graph(*inputs)
    graph = convert_pt2e(graph)
    exported = functools.cache(lambda: torch.export.export(graph, sample, dynamic_shapes=dynamic_shapes))

    def lowering():
        spec = {"require_dynamic_shapes": dynamic_shapes is not None}
        program = to_edge_transform_and_lower(
            exported(), compile_config=EdgeCompileConfig(_skip_dim_order=False), partitioner=[VulkanPartitioner(spec)]
        )
        return bytes(program.to_executorch().buffer)

    _QUANTIZED[name] = (stored_pte(key, lowering), graph)
    if stored is not None and not stored.exists():
        torch.export.save(exported(), stored)
    return _QUANTIZED[name]


def _xnnpack_static():
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False))


def _vulkan_weight_only(bits):
    def make():
        from executorch.backends.vulkan.quantizer.vulkan_quantizer import VulkanQuantizer, get_symmetric_quantization_config

        return VulkanQuantizer().set_global(get_symmetric_quantization_config(is_dynamic=False, weight_bits=bits))

    return make


Q_SAMPLE = (torch.randn(9, 20, generator=torch.Generator().manual_seed(9)),)
Q_SHAPES = ({0: torch.export.Dim("M", min=1, max=9)},)


class ConvLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.linear = torch.nn.Conv2d(3, 8, 3), torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.linear(torch.relu(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("per_channel, dynamic", [(True, False), (False, False), (True, True)], ids=["per_channel", "per_tensor", "dynamic"])
async def test_pt2e_quantized_models_without_delegates(load_pte, per_channel, dynamic):
    """A convolution and a linear quantized by XNNPACK's quantizer (static per channel or per tensor,
    or dynamic), lowered with no partitioner: the quantize, dequantize and choose_qparams kernels
    between float ops, equal to the converted eager program."""
    pytest.importorskip("torchao")  # quantizes in the test
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 11)
    graph = torch.export.export(ConvLinear().eval(), (x,)).module()
    graph = prepare_pt2e(graph, XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=dynamic)))
    graph(x)
    graph = convert_pt2e(graph)
    pte = without_delegates(f"pt2e_conv_linear_{per_channel}_{dynamic}", graph, (x,))
    assert "quantized_decomposed::dequantize_per_tensor" + (".Tensor_out" if dynamic else ".out") in _kernel_calls(pte)
    model = await load_pte(pte)
    for call in (x, x * 3, torch.randn(2, 3, 9, 11)):
        (got,) = await model.execute(call.numpy())
        with torch.no_grad():
            np.testing.assert_allclose(got, graph(call).numpy(), rtol=1e-6, atol=1e-6)


def _kernel_calls(pte):
    """The ops a program runs outside its delegates."""
    from async_runtime.program.pte import read_program

    return {c.op for method in read_program(pte).methods.values() for c in method.instructions if hasattr(c, "op")}


def _delegate_ops(pte):
    from async_runtime.program.graph import link
    from async_runtime.program.pte import read_program

    return {name for method in read_program(pte).methods.values() for name, _ in link(method, check=False).calls}


@pytest.mark.parametrize(
    "rows, make_module, linear_op",
    [(9, LinearReluAdd, "et_vk.q8ta_linear.default"), (1, LinearAddRelu, "et_vk.q8ta_linear_gemv.default")],
)
async def test_int8_static_quantized_model_matches_the_eager_quantized_program(load_pte, rows, make_module, linear_op):
    """q8ta_linear (relu fused) or its one-row form, q8ta_add, quantize/dequantize_per_tensor. The
    int8 accumulation is exact; the reference sums dequantized floats, so an output may sit one
    quantization step away where it lands on a rounding boundary: atol is one output step, and
    nearly all outputs are exact."""
    torch.manual_seed(rows)  # the store finds the export by its calibration input, whatever ran before
    sample = (torch.randn(rows, 20),)
    pte, graph = export_quantized(f"q8_{rows}", _xnnpack_static, sample, make_module=make_module)  # q8ta: no resize
    assert {linear_op, "et_vk.q8ta_add.default"} <= _delegate_ops(pte)
    step = float(graph.graph.find_nodes(op="call_function", target=QD.dequantize_per_tensor.default)[-1].args[1])
    model = await load_pte(pte)
    x = torch.randn(rows, 20)
    await assert_matches_eager(model, graph, [(x,), (x * 4,)], atol=step * 1.001, rtol=0)
    (got,) = await model.execute(x * 4)
    with torch.no_grad():
        want = graph(x * 4).numpy()
    assert np.mean(np.abs(got - want) < step / 2) > 0.95


class WideLinears(torch.nn.Module):
    """100 -> 72 (weight rows of 25 words: a step and a part), then 72 -> 130 with relu."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(100, 72), torch.nn.Linear(72, 130)

    def forward(self, x):
        return torch.relu(self.l2(self.l1(x)))


def _wide_linears():
    torch.manual_seed(7)  # the calibration sample
    return export_quantized("q8_wide_linears", _xnnpack_static, (torch.randn(67, 100),), make_module=WideLinears)


async def test_tiled_int8_linears_are_bitwise_the_direct_ones(load_pte, monkeypatch):
    """The q8ta linears' tiled product (kernels/quant/int8_gemm.py) sums the integers the direct
    kernel sums: outputs bitwise the direct route's at 67 rows (two tiles of 64: one partly
    live). Against eager, 95% within one output step: where the first linear's output lands on
    the other side of a rounding boundary, the second's moves by steps (the direct route's too;
    tests above hold one linear to one step)."""
    pte, graph = _wide_linears()
    assert "et_vk.q8ta_linear.default" in _delegate_ops(pte)
    tiled = await load_pte(pte)
    monkeypatch.setattr(int8_gemm, "takes", lambda row: False)
    direct = await load_pte(pte)
    product = "subgroupMatrixLoad" if tiled.int8_matrices else "dot4I8Packed(x0"
    assert [sum(product in (d.shader or "") for d in m.graph.dispatches) for m in (tiled, direct)] == [2, 0]
    step = float(graph.graph.find_nodes(op="call_function", target=QD.dequantize_per_tensor.default)[-1].args[1])
    torch.manual_seed(8)
    x = torch.randn(67, 100)
    for call in (x, x * 4):  # * 4: past the calibrated range
        (got,), (want,) = await tiled.execute(call), await direct.execute(call)
        np.testing.assert_array_equal(got, want)
    (got,) = await tiled.execute(x)
    with torch.no_grad():
        steps = np.abs(got - graph(x).numpy()) / step
    assert np.mean(steps <= 1.001) >= 0.95


class Q8taElementwise(torch.nn.Module):
    """q8ta_relu and q8ta_add called directly on int8 inputs; eager runs their reference
    decompositions (dequantize, op, quantize)."""

    def forward(self, a, b):
        vk = torch.ops.et_vk
        return (
            vk.q8ta_relu.default(a, 0.031, -3, 0.017, -128),
            vk.q8ta_add.default(a, b, 0.031, -3, 0.02, 7, 0.045, 2, 1.0),
        )


async def test_q8ta_relu_and_add_are_exact(load_pte):
    pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")  # the et_vk ops of the eager module

    sample = tuple(torch.randint(-128, 128, (3, 5, 7), dtype=torch.int8) for _ in range(2))
    pte, module = export_pte("more_q8ta", Q8taElementwise, sample)
    await assert_matches_eager(await load_pte(pte), module, [sample], atol=0, rtol=0)


@pytest.mark.parametrize("bits, op", [(8, "aten._weight_int8pack_mm.default"), (4, "et_vk.linear_qcs4w.default")])
async def test_weight_only_quantized_linear(load_pte, bits, op):
    pte, graph = export_quantized(f"w{bits}", _vulkan_weight_only(bits), Q_SAMPLE, Q_SHAPES)
    assert op in _delegate_ops(pte)
    calls = dynamic_shape_calls(Q_SAMPLE, Q_SHAPES, n=4, seed=6)
    await assert_matches_eager(await load_pte(pte), graph, calls, atol=1e-5, rtol=1e-5)


# -- hooks alone: no device ------------------------------------------------------------------------


@pytest.mark.parametrize("name, expected", [("eq", [0, 1, 0]), ("lt", [1, 0, 0]), ("le", [1, 1, 0]), ("gt", [0, 0, 1]), ("ge", [0, 1, 1])])
def test_symint_comparisons(name, expected):
    g = Graph()
    a, b, out = g.add(SymInt()), g.add(Scalar(5)), g.add(SymInt())
    got = [resize(g, name, [a, b, out], {}, {a: value}).symints[out] for value in (4, 5, 6)]
    assert got == expected


def test_inspect_names_an_op_without_a_kernel(monkeypatch):
    import io

    from pte_wgpu import kernels
    from async_runtime.tools.cli import inspect

    pte, _ = export_pte("more_pointwise", Pointwise, POINTWISE_SAMPLE, POINTWISE_SHAPES)
    monkeypatch.delitem(kernels.OPS, "aten.log10.default")
    out = io.StringIO()
    inspect(pte, out)
    assert "aten.log10.default  UNSUPPORTED" in out.getvalue()
    assert "unsupported: aten.log10.default" in out.getvalue()
