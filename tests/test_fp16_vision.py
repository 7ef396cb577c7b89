"""float16 on f16 storage for the vision families: convolutions (kernels/vision/conv.py, the direct kernels
and the implicit GEMM), pools (pool.py) and resampling (resample.py, with spatial_copy.py's
shuffles), `.half()` exported with the VulkanPartitioner and compared with torch eager fp16 on the
same weights and inputs; then a MobileNet-like block at dynamic heights and widths.

Tolerances: pools are exact. A convolution sums in f32 and rounds once; torch's CPU fp16
convolution rounds its own way, so the two differ by an f16 rounding or two of the output (2**-10
relative, 1e-3 absolute near 0): atol = rtol = 2e-3. Resampling is compared with torch eager in
fp32 on the same f16 inputs instead: torch's CPU fp16 grid_sample computes its source coordinates
in fp16 (6e-3 off at 0.33), while the kernels compute them in f32 and round the result once, so
they are within an f16 rounding of fp32 eager: atol = rtol = 1e-3. The block chains four rounded
convolutions, a residual add and a pool: within 1 f16 ulp of eager fp16 on lavapipe, atol = rtol =
5e-3 allowed."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

from .exporting import export_pte
from .test_vision_ops import (
    GEMM_DYNAMIC, GEMM_SAMPLE, Convolutions, GemmConvolutions, Pools, Resampling, _grid_priors_op, _live_convolution_kernels,
    rand,
)  # fmt: skip

pytestmark = pytest.mark.usefixtures("adapter", "half_adapter")


class PoolsNoMean(Pools):
    """test_vision_ops' pools without the adaptive one, whose mean is kernels/tensor/reduce.py's."""

    def forward(self, x):
        return super().forward(x)[:-1]


# case -> (module, inputs, tolerance, whether the eager reference is fp32 on the same f16 inputs)
CASES = {
    "convolution": (Convolutions, lambda: (rand(1, 6, 11, 13), rand(1, 6, 17, seed=1)), 2e-3, False),
    "pool": (PoolsNoMean, lambda: (rand(1, 5, 13, 11),), 0, False),
    "resample": (Resampling, lambda: (rand(1, 4, 5, 7), rand(1, 3, 6, 9), rand(1, 3, 5, 2) * 0.7), 1e-3, True),
}


def _half(sample):
    return tuple(a.astype(np.float16) for a in sample)


@pytest.mark.parametrize("case", CASES)
async def test_vision_ops_on_f16_storage_match_eager_fp16(case, load_pte):
    make, inputs, tol, fp32_reference = CASES[case]
    _grid_priors_op(case)
    sample = _half(inputs())
    pte, module = export_pte(f"f16gen_vision_{case}", lambda: make().half(), [torch.from_numpy(a) for a in sample])
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    other = _half(a + 0.5 * rand(*a.shape, seed=7) for a in inputs())
    if fp32_reference:
        module = _on_fp32(module.float())
    await assert_matches_eager(model, module, [sample, other], atol=tol, rtol=tol)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the kernels are the same on trio
async def test_implicit_gemm_convolutions_on_f16_storage(load_pte):
    """test_vision_ops' implicit-GEMM convolutions `.half()` (at least 32 output channels; the
    narrow one on the direct kernel) read and write f16, at sizes 17, 37 and a random one: within
    atol = rtol = 2e-3 of eager fp16, as the convolutions above."""
    sample = tuple(a.half() for a in GEMM_SAMPLE)
    pte, module = export_pte("f16gen_vision_conv_routes", lambda: GemmConvolutions().half(), sample,
                             dynamic_shapes=GEMM_DYNAMIC)  # fmt: skip
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    calls = dynamic_shape_calls(sample, GEMM_DYNAMIC, n=3, seed=3)
    await assert_matches_eager(model, module, calls, atol=2e-3, rtol=2e-3)
    session = await model.open_session()
    await session.execute(*(c.numpy() for c in calls[1]))
    gemms, _, directs = _live_convolution_kernels(model, session)
    assert (gemms, directs) == (10, 1)
    await session.aclose()


def _on_fp32(module):
    """`module` run on its float16 inputs widened to float32."""
    return lambda *xs: module(*(x.float() for x in xs))


class MobileBlock(nn.Module):
    """MobileNet V2's inverted residual (expand 1x1, depthwise 3x3, project 1x1, each conv-bn, ReLU6
    between) after a strided stem, then a max pool and a nearest upsample."""

    def __init__(self):
        super().__init__()

        def conv_bn(cin, cout, k, stride=1, groups=1):
            return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]

        self.stem = nn.Sequential(*conv_bn(3, 8, 3, stride=2), nn.ReLU6())
        self.expand = nn.Sequential(*conv_bn(8, 24, 1), nn.ReLU6())
        self.depthwise = nn.Sequential(*conv_bn(24, 24, 3, groups=24), nn.ReLU6())
        self.project = nn.Sequential(*conv_bn(24, 8, 1))
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = self.stem(x)
        y = y + self.project(self.depthwise(self.expand(y)))
        return F.interpolate(F.max_pool2d(y, 2), scale_factor=2, mode="nearest")


# multiples of 4: the stride-2 stem, the pool and the upsample give back the stem's size
H, W = 4 * torch.export.Dim("h", min=2, max=9), 4 * torch.export.Dim("w", min=2, max=7)
BLOCK_SAMPLE, BLOCK_DYNAMIC = (torch.randn(1, 3, 36, 28).half(),), ({2: H, 3: W},)


def _block():
    return export_pte("f16gen_mobile_block", lambda: MobileBlock().half(), BLOCK_SAMPLE, dynamic_shapes=BLOCK_DYNAMIC,
                      require_dynamic_shapes=False)  # fmt: skip


async def test_mobilenet_block_f16_at_dynamic_sizes(load_pte):
    pte, module = _block()
    model = await load_pte(pte)
    assert model.precision == "f16", model.precision_note
    calls = dynamic_shape_calls(BLOCK_SAMPLE, BLOCK_DYNAMIC, n=5, seed=6)  # min, max, then random
    await assert_matches_eager(model, module, calls, atol=5e-3, rtol=5e-3)


async def test_mobilenet_block_widened_to_f32(load_pte):
    pte, module = _block()
    model = await load_pte(pte, precision="f32")
    assert model.precision == "f32"
    calls = dynamic_shape_calls(BLOCK_SAMPLE, BLOCK_DYNAMIC, n=3, seed=6)
    await assert_matches_eager(model, module, calls, atol=5e-3, rtol=5e-3)
