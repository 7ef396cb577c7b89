"""Vision ops (kernels/vision/conv.py, pool.py, norm.py, resample.py, spatial_copy.py) end to end: export
with the VulkanPartitioner, run on WebGPU, compare with torch eager in fp32. Prime and odd sizes;
dynamic heights and widths run at several live sizes in random order, including min and max.

Tolerances (fp32): single ops atol = rtol = 1e-5 (pools 1e-6: max and avg match exactly, the
adaptive pool's mean does not); the small CNN 1e-4; MobileNet V2 and ResNet-18 (random weights and
batch-norm statistics) atol 1e-4, rtol 1e-3: the GPU sums a convolution's products in another
order than torch does. float16 programs: rtol 2e-3, atol 4e-3 against eager in f32 on the same f16
values (f16's rounding of the outputs)."""

import dataclasses
import functools
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import async_runtime as ar
from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

from .exporting import export_extras, export_pte
from .vision_models import MobileNetV2, ResNet18, randomize_batch_norms

pytestmark = pytest.mark.usefixtures("adapter")


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


class Convolutions(nn.Module):
    """Every shape class: general, grouped + dilated, depthwise, pointwise, strided 1x1, transposed
    (output padding; grouped + dilated without bias), 1-D, and with a clamp (ReLU, ReLU6)."""

    def __init__(self):
        super().__init__()
        self.general = nn.Conv2d(6, 12, 3, stride=2, padding=1)  # blocks of 4 channels
        self.grouped = nn.Conv2d(6, 4, (3, 5), dilation=(2, 1), padding=(2, 0), groups=2, bias=False)
        self.depthwise = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.pointwise = nn.Conv2d(6, 8, 1, bias=False)
        self.strided_1x1 = nn.Conv2d(6, 5, 1, stride=2)  # 5 channels: no blocks
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


class OutsideDelegates(nn.Module):
    """Convolutions the partitioner leaves to ExecuTorch's portable kernels (aten::convolution.out):
    a 2-D one over a batch of 3 and a transposed 1-D one. The norms beside them are delegated."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.transposed_1d = nn.ConvTranspose1d(4, 6, 3, stride=2, output_padding=1)
        self.bn = nn.BatchNorm1d(4)
        self.gn = nn.GroupNorm(2, 4)
        randomize_batch_norms(self, seed=3)

    def forward(self, x, z):
        return self.conv(x), self.transposed_1d(z), self.bn(z), self.gn(x)


class ClampsOutsideDelegates(nn.Module):
    """Convolutions over a batch of 3 (left to the portable kernels) whose results only a ReLU, a
    ReLU6 or a clamp reads (delegated): kernels/fusion.py runs each clamp in its convolution's
    epilogue, on the implicit GEMM (33 output channels) and the direct kernels. A fourth
    convolution's result is returned beside its ReLU, so that ReLU stays apart. A residual block's
    end, relu(conv(x) + r), becomes pte_wgpu.conv_residual (the add and the ReLU in the implicit
    GEMM's epilogue: 33 channels, 1x1) or, for a convolution the GEMM does not always take (4
    channels), pte_wgpu.add_relu; conv(x) + r alone, pte_wgpu.conv_residual without a clamp; and a
    3x3 convolution over 96 channels into 40, whose few tiles split K (the split-K reduce adds)."""

    def __init__(self):
        super().__init__()
        self.gemm = nn.Conv2d(4, 33, 3, padding=1)
        self.grouped = nn.Conv2d(4, 6, 3, stride=2, groups=2)
        self.pointwise = nn.Conv2d(4, 5, 1)
        self.read_twice = nn.Conv2d(4, 7, 3)
        self.residual = nn.Conv2d(4, 4, 3, padding=1)
        self.wide = nn.Conv2d(4, 33, 1)
        self.shortcut = nn.Conv2d(4, 33, 3, padding=1, bias=False)
        self.no_clamp = nn.Conv2d(4, 33, 3, padding=1)
        self.lift = nn.Conv2d(4, 96, 1)
        self.deep = nn.Conv2d(96, 40, 3, padding=1)
        self.deep_shortcut = nn.Conv2d(4, 40, 1, bias=False)

    def forward(self, x):
        y = self.read_twice(x)
        clamped = F.relu(self.gemm(x)), F.relu6(self.grouped(x)), torch.clamp(self.pointwise(x), -0.3, 0.4)
        s = self.shortcut(x)
        residuals = F.relu(self.residual(x) + x), F.relu(self.wide(x) + s), s * 2 + self.no_clamp(x)
        residuals += (F.relu(self.deep(self.lift(x)) + self.deep_shortcut(x)),)
        return *clamped, F.relu(y), y, *residuals


class ConvBatchNormBatch8(nn.Module):
    """A conv-bn over a batch of 8 (input [8, 4, 3, 3]): both left to the portable kernels. The
    partitioner takes no convolution over a batch, nor this batch norm: its channels-packed texture
    would be 8 * 1028 / 4 = 2056 layers deep, past the default limit of 2048."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 1028, 1)
        self.bn = nn.BatchNorm2d(1028)
        randomize_batch_norms(self, seed=4)

    def forward(self, x):
        return self.bn(self.conv(x))


def _grid_priors_op(case):
    """torch.ops.et_vk (ExecuTorch's), which the resampling case's eager module calls: imported for
    that case alone, so the others run from an export store where ExecuTorch is not installed."""
    if case == "resample":
        with export_extras("the resampling case's eager module (torch.ops.et_vk.grid_priors)"):
            from executorch.backends.vulkan import custom_ops_lib  # noqa: F401


# case -> (module, inputs, tolerance, the ops left outside the delegate)
CASES = {
    "convolution": (Convolutions, lambda: (rand(1, 6, 11, 13), rand(1, 6, 17, seed=1)), 1e-5, set()),
    "pool": (Pools, lambda: (rand(1, 5, 13, 11),), 1e-6, set()),  # max and avg exact; the mean is reduce.py's
    "resample": (
        Resampling,
        lambda: (rand(1, 4, 5, 7), rand(1, 3, 6, 9), rand(1, 3, 5, 2) * 0.7),
        1e-5,
        {"aten::grid_sampler_2d.out"},  # all but the one configuration ET-VK implements
    ),
    "norm": (Norms, lambda: (rand(1, 6, 7, 5),), 1e-5, set()),
    "outside": (OutsideDelegates, lambda: (rand(3, 4, 7, 9), rand(2, 4, 11, seed=2)), 1e-5, {"aten::convolution.out"}),
    "outside_clamps": (ClampsOutsideDelegates, lambda: (rand(3, 4, 9, 11),), 1e-5, {"aten::convolution.out"}),
    "outside_bn": (
        ConvBatchNormBatch8,
        lambda: (rand(8, 4, 3, 3),),
        1e-5,
        {"aten::convolution.out", "aten::_native_batch_norm_legit_no_training.out"},
    ),
}


def _case_export(case):
    make, inputs = CASES[case][:2]
    _grid_priors_op(case)
    return export_pte(f"vision_{case}", make, [torch.from_numpy(a) for a in inputs()])


@pytest.mark.parametrize("case", CASES)
async def test_vision_op_variants_match_eager(case, load_pte):
    _, inputs, tol, outside = CASES[case]
    sample = inputs()
    pte, module = _case_export(case)
    model = await load_pte(pte)
    assert set(model.graph.kernel_ops) == outside
    other = tuple(a + 0.5 * rand(*a.shape, seed=7) for a in sample)  # the same shapes, other values
    await assert_matches_eager(model, module, [sample, other], atol=tol, rtol=tol)


async def test_a_convolutions_clamp_runs_in_its_epilogue(load_pte):
    """The three clamps that only read a convolution's result are gone, their convolutions clamped;
    the ReLU of the result read twice stays; the residuals' adds (and ReLUs) go into their
    convolutions or, for the narrow one, into one add_relu."""
    model = await load_pte(_case_export("outside_clamps")[0])
    names = [name for name, _ in model.graph.calls]
    assert names.count("et_vk.conv_with_clamp.default") == 3 and names.count("aten::convolution.out") == 5
    assert names.count("aten.relu.default") == 1 and "aten.hardtanh.default" not in names and "aten.clamp.default" not in names
    assert names.count("pte_wgpu.conv_residual") == 3 and names.count("pte_wgpu.add_relu") == 1 and "aten.add.Tensor" not in names


class SmallCNN(nn.Module):
    """conv-bn-relu-pool blocks, depthwise + pointwise, an upsample and a pixel shuffle on an image
    of dynamic height and width; a global-pool head; and a 1-D branch on its own dynamic input."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2))
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 16, 1), nn.BatchNorm2d(16), nn.ReLU6())
        self.pool = nn.AvgPool2d(3, 2, padding=1, count_include_pad=False)  # ceil_mode guards H and W at export
        self.head = nn.Linear(16, 5)
        self.norm = nn.GroupNorm(2, 4)
        self.signal = nn.Conv1d(2, 4, 5, padding=2)
        randomize_batch_norms(self, seed=2)

    def forward(self, x, s):
        y = self.block(self.stem(x))
        up = F.pixel_shuffle(F.interpolate(y, scale_factor=2, mode="nearest"), 2)
        logits = self.head(F.adaptive_avg_pool2d(self.pool(y), 1).flatten(1))
        return self.norm(up), logits, torch.relu(self.signal(s))


H, W = torch.export.Dim("H", min=6, max=29), torch.export.Dim("W", min=6, max=23)
L = torch.export.Dim("L", min=3, max=31)
CNN_SAMPLE = (torch.randn(1, 3, 29, 23), torch.randn(1, 2, 31))
CNN_DYNAMIC = ({2: H, 3: W}, {2: L})


def _cnn():
    # ExecuTorch 1.5.1 cannot export a dynamic upsample with require_dynamic_shapes: the partitioner
    # keeps it from decomposing, then refuses it because its own runtime cannot resize it. pte-wgpu
    # resizes it, so the CNN is lowered without that requirement.
    return export_pte("vision_cnn_dynamic", SmallCNN, CNN_SAMPLE, dynamic_shapes=CNN_DYNAMIC, require_dynamic_shapes=False)


async def test_cnn_at_dynamic_heights_and_widths(load_pte):
    pte, module = _cnn()
    calls = dynamic_shape_calls(CNN_SAMPLE, CNN_DYNAMIC, n=6, seed=4)  # min, max, then random
    stats = await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-4, rtol=1e-4)
    assert stats.resize_events > 0


async def test_cnn_resizes_run_only_the_affected_hooks(load_pte):
    """A new signal length re-runs the 1-D branch's hooks only; a new image size the image's, but
    not the head's after the global pool, whose shapes do not change."""
    pte, _ = _cnn()
    model = await load_pte(pte)
    nodes, ran = model.plan.nodes, []
    for i, node in enumerate(nodes):
        nodes[i] = dataclasses.replace(node, hook=lambda ctx, hook=node.hook, i=i: (ran.append(i), hook(ctx)))
    image, signal = model.graph.inputs
    downstream = {image: _downstream(nodes, image), signal: _downstream(nodes, signal)}
    assert downstream[image] and downstream[signal] and not downstream[image] & downstream[signal]

    await model.execute(rand(1, 3, 12, 9), rand(1, 2, 7))
    ran.clear()
    await model.execute(rand(1, 3, 12, 9), rand(1, 2, 19))
    assert set(ran) == downstream[signal]
    ran.clear()
    await model.execute(rand(1, 3, 17, 11), rand(1, 2, 19))
    head = {i for i in downstream[image] if nodes[i].name in ("aten.linear.default", "aten.addmm.default", "aten.mm.default")}
    assert head and set(ran) and set(ran) <= downstream[image] - head
    ran.clear()
    await model.execute(rand(1, 3, 17, 11), rand(1, 2, 19))
    assert ran == []


def _downstream(nodes, vid):
    """Indices of the nodes that (transitively) read `vid`."""
    reached, found = {vid}, set()
    for i, node in enumerate(nodes):
        if reached & set(node.reads):
            found.add(i)
            reached |= set(node.writes)
    return found


@pytest.mark.parametrize(
    "shape, message", [((1, 3, 30, 23), "dim 2 is 30"), ((3, 29, 23), "rank 3")]
)
async def test_cnn_refuses_inputs_outside_its_shapes(shape, message, load_pte):
    pte, module = _cnn()
    model = await load_pte(pte)
    with pytest.raises(ar.InputError, match=message):
        await model.execute(rand(*shape), rand(1, 2, 5))
    await assert_matches_eager(model, module, [(rand(1, 3, 6, 7), rand(1, 2, 3))], atol=1e-4, rtol=1e-4)


class GemmConvolutions(nn.Module):
    """The implicit-GEMM route's shape classes (kernels/vision/conv_gemm.py) at prime channel counts:
    ResNet's stem (7x7, stride 2, 3 input channels), 3x3 with padding 1, stride 2, dilation 2, an
    asymmetric window, 1x1 (a plain GEMM), strided 1x1, a deep one few tiles split over K, a 1-D
    one; ReLU and a clamp fused (et_vk.conv_with_clamp); a batch of 2 left to the portable kernel
    (aten::convolution.out), through the same route; and 5 output channels, too few for the GEMM's
    tiles (conv.GEMM_MIN_COUT): the direct kernel."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 37, 7, stride=2, padding=3)
        self.same = nn.Conv2d(37, 67, 3, padding=1)
        self.strided = nn.Conv2d(67, 41, 3, stride=2, padding=1, bias=False)
        self.dilated = nn.Conv2d(41, 37, 3, padding=2, dilation=2)
        self.asymmetric = nn.Conv2d(37, 43, (3, 5), stride=(2, 1), padding=(1, 4), dilation=(1, 2))
        self.pointwise = nn.Conv2d(37, 131, 1)
        self.strided_1x1 = nn.Conv2d(131, 47, 1, stride=2)
        self.deep = nn.Conv2d(67, 41, 3, stride=3, padding=1)  # K = 603 over a few pixels: split K
        self.conv1d = nn.Conv1d(5, 53, 3, stride=2, padding=1, dilation=2)
        self.batched = nn.Conv2d(5, 59, 3, padding=1)
        self.narrow = nn.Conv2d(37, 5, 3, padding=1)

    def forward(self, x, z, pair):
        y = F.relu(self.stem(x))
        wide = F.hardtanh(self.same(y), -0.5, 0.75)
        d = self.dilated(self.strided(wide))
        return (
            y, wide, d, self.asymmetric(d), self.strided_1x1(self.pointwise(d)), self.deep(wide),
            self.conv1d(z), self.batched(pair), self.narrow(d),
        )  # fmt: skip


GEMM_SIDE = torch.export.Dim("gemm_side", min=17, max=37)
GEMM_SAMPLE = (torch.randn(1, 3, 37, 37), torch.randn(1, 5, 29), torch.randn(2, 5, 9, 11))
GEMM_DYNAMIC = ({2: GEMM_SIDE, 3: GEMM_SIDE}, None, None)


def _live_convolution_kernels(model, session):
    """How many GEMMs, split-K reduces and direct kernels of the convolutions have a grid in `session`."""
    ops = ("aten.convolution.default", "et_vk.conv_with_clamp.default", "aten::convolution.out")
    live = [d.shader for did, d in enumerate(model.graph.dispatches) if d.op in ops and all(session.state.grids[did])]
    gemms, directs = sum("fn b_at" in s for s in live), sum("fn element(" in s for s in live)
    return gemms, len(live) - gemms - directs, directs


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the kernels are the same on trio
async def test_convolutions_run_as_implicit_gemms(load_pte):
    """Every convolution above but the narrow one runs through the GEMM route, at square sizes
    17..37 (min, max, then random), and all match eager."""
    pte, module = export_pte("vision_conv_routes", GemmConvolutions, GEMM_SAMPLE, dynamic_shapes=GEMM_DYNAMIC)
    model = await load_pte(pte)
    assert set(model.graph.kernel_ops) == {"aten::convolution.out"}
    calls = dynamic_shape_calls(GEMM_SAMPLE, GEMM_DYNAMIC, n=4, seed=3)
    await assert_matches_eager(model, module, calls, atol=1e-4, rtol=1e-4)
    session = await model.open_session()
    await session.execute(*(c.numpy() for c in calls[1]))
    gemms, reduces, directs = _live_convolution_kernels(model, session)
    assert (gemms, directs) == (10, 1) and reduces > 0  # the deep one (at least) split K
    await session.aclose()


IMAGE = torch.export.Dim("side", min=64, max=96)
ZOO_SAMPLE, ZOO_DYNAMIC = (torch.randn(1, 3, 96, 96),), ({2: IMAGE, 3: IMAGE},)


def _mobilenet_v2():
    return randomize_batch_norms(MobileNetV2(classes=10))


def _resnet18():
    return randomize_batch_norms(ResNet18(classes=10))


# ResNet-18 adds about a minute (35 s of lowering, 17 s on lavapipe): only with PTE_WGPU_SLOW=1
SLOW = pytest.mark.skipif(os.environ.get("PTE_WGPU_SLOW") != "1", reason="slow (a minute); set PTE_WGPU_SLOW=1")


def _zoo_export(name, make):
    return export_pte(f"vision_{name}", make, ZOO_SAMPLE, dynamic_shapes=ZOO_DYNAMIC)


# tests/prebuild.py: the slowest exports of this file
PREBUILD = [lambda: _zoo_export("mobilenet_v2", _mobilenet_v2), _cnn] + [functools.partial(_case_export, case) for case in CASES]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the kernels are the same on trio
@pytest.mark.parametrize("name, make", [("mobilenet_v2", _mobilenet_v2), pytest.param("resnet18", _resnet18, marks=SLOW)])
async def test_model_zoo_at_square_sizes_64_to_96(name, make, load_pte):
    pte, module = _zoo_export(name, make)
    calls = dynamic_shape_calls(ZOO_SAMPLE, ZOO_DYNAMIC, n=3, seed=1)  # 64, 96 and one between
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-4, rtol=1e-3)


# -- the shape functions alone: no device ---------------------------------------------------------


def test_shape_functions_follow_torch():
    """conv_out_shape, pool_out_size and upsample_out_size against torch's own output shapes over
    odd sizes, strides, paddings, dilations and ceil modes."""
    from pte_wgpu.kernels.vision.conv import conv_out_shape
    from pte_wgpu.kernels.vision.pool import pool_out_size
    from pte_wgpu.kernels.vision.resample import upsample_out_size

    for size in (5, 7, 11, 13):
        for k, s, p, d in ((3, 2, 1, 1), (2, 3, 0, 2), (5, 1, 2, 1), (3, 3, 1, 2)):
            x = torch.zeros(1, 2, size, size + 2)
            w = (4, 2, k, k)
            want = F.conv2d(x, torch.zeros(w), stride=s, padding=p, dilation=d).shape
            assert conv_out_shape(x.shape, w, (s, s), (p, p), (d, d), False, (0, 0), 1) == tuple(want)
            op = min(s, d) - 1
            want = F.conv_transpose2d(x, torch.zeros(2, 3, k, k), stride=s, padding=p, dilation=d, output_padding=op).shape
            assert conv_out_shape(x.shape, (2, 3, k, k), (s, s), (p, p), (d, d), True, (op, op), 1) == tuple(want)
            if p <= k // 2 and (k - 1) * d < size:
                for ceil in (False, True):
                    want = F.max_pool2d(x, k, s, p, d, ceil_mode=ceil).shape[-2:]
                    got = (pool_out_size(size, k, s, p, d, ceil), pool_out_size(size + 2, k, s, p, d, ceil))
                    assert got == tuple(want)
        want = F.interpolate(torch.zeros(1, 1, size, size + 2), scale_factor=(1.7, 0.6)).shape
        assert upsample_out_size((1, 1, size, size + 2), None, (1.7, 0.6)) == tuple(want[2:])
    with pytest.raises(ValueError, match="channels"):
        conv_out_shape((1, 3, 9, 9), (4, 2, 3, 3), (1, 1), (0, 0), (1, 1), False, (0, 0), 1)
    with pytest.raises(ValueError, match="too small"):
        conv_out_shape((1, 2, 2, 9), (4, 2, 3, 3), (1, 1), (0, 0), (1, 1), False, (0, 0), 1)


class PortableVision(nn.Module):
    """Adaptive average pooling to any size, antialiased bilinear resampling (shrinking and
    growing, either align_corners, by size or scale factor), batch norm by the batch's statistics
    (its saved mean and invstd too) and instance norm, with and without their affine."""

    def __init__(self, by_scale=True):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.rand(3) + 0.5), nn.Parameter(torch.randn(3))
        self.by_scale = by_scale  # ExecuTorch 1.5.1 cannot export a scale factor's resampling at a dynamic size

    def forward(self, x):
        aa = functools.partial(F.interpolate, mode="bilinear", antialias=True)
        return (
            F.adaptive_avg_pool2d(x, (5, 3)), F.adaptive_avg_pool2d(x, 1), F.adaptive_avg_pool2d(x, (7, 13)),
            aa(x, size=(5, 3)), aa(x, size=(5, 3), align_corners=True), aa(x, size=(23, 29)), aa(x, size=(31, 6), align_corners=True),
            *([aa(x, scale_factor=0.37)] if self.by_scale else []),
            F.batch_norm(x, None, None, training=True), F.batch_norm(x, None, None, self.weight, self.bias, training=True),
            *torch.ops.aten._native_batch_norm_legit.no_stats(x, self.weight, None, True, 0.1, 1e-3),
            F.instance_norm(x), F.instance_norm(x, weight=self.weight, bias=self.bias, eps=1e-4),
        )


PORTABLE_OPS = {"aten::_adaptive_avg_pool2d.out", "aten::_upsample_bilinear2d_aa.out", "aten::_native_batch_norm_legit.no_stats_out"}


@pytest.mark.anyio
async def test_portable_vision_ops_without_delegates(load_pte):
    """Lowered with no partitioner: equal to torch eager (1e-5), with the statistics a batch norm saves."""
    from .exporting import eager, without_delegates
    from .test_more_ops import _kernel_calls

    torch.manual_seed(2)
    module, x = PortableVision(), torch.randn(2, 3, 17, 13) * 2 + 0.5
    pte = without_delegates("portable_vision", module, (x,))
    assert PORTABLE_OPS <= _kernel_calls(pte), sorted(_kernel_calls(pte))
    outs = await (await load_pte(pte)).execute(x.numpy())
    for k, (out, want) in enumerate(zip(outs, eager(module, x.numpy()), strict=True)):
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=f"output {k}")


@pytest.mark.anyio
async def test_portable_vision_ops_at_live_sizes(load_pte):
    """Beside a delegate (which takes none of them), at live heights and batch sizes in random
    order, the least and the most included."""
    from .test_more_ops import _kernel_calls

    height, batch = torch.export.Dim("height", min=6, max=17), torch.export.Dim("batch", min=1, max=3)
    sample, shapes = (torch.randn(3, 3, 17, 13),), ({0: batch, 2: height},)
    pte, module = export_pte("portable_vision_live", functools.partial(PortableVision, by_scale=False), sample, shapes, seed=2)
    assert PORTABLE_OPS <= _kernel_calls(pte), sorted(_kernel_calls(pte))
    calls = dynamic_shape_calls(sample, shapes, n=5, seed=6)
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-5, rtol=1e-5)


class PortableVisionRanks(nn.Module):
    """The portable vision ops at other ranks and affines: adaptive pooling of [C, H, W] inputs,
    resampling to 1 x 1 and to sizes computed from the input's, batch norm by the batch's statistics
    of [N, C], [N, C, L] and [N, C, D, H, W] inputs with a weight or a bias alone (the saved mean and
    invstd of one), instance norm of [N, C, L]."""

    def __init__(self):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.rand(3) + 0.5), nn.Parameter(torch.randn(3))

    def forward(self, x):
        aa = functools.partial(F.interpolate, mode="bilinear", antialias=True)
        h, w = x.shape[-2:]
        return (
            F.adaptive_avg_pool2d(x[0], (4, 6)), F.adaptive_avg_pool2d(x[1] * 2, (1, 5)),
            aa(x, size=(1, 1)), aa(x, size=(1, 1), align_corners=True),
            aa(x, size=(h // 2 + 1, w * 2 - 1), align_corners=True), aa(x, size=(h * 3, w // 3 + 1)),
            F.batch_norm(x.mean((2, 3)), None, None, training=True),
            F.batch_norm(x.flatten(2), None, None, self.weight, None, training=True),
            F.batch_norm(torch.stack([x, x * 2 - 1], 2), None, None, None, self.bias, training=True, eps=1e-2),
            *torch.ops.aten._native_batch_norm_legit.no_stats(x, None, self.bias, True, 0.1, 1e-2),
            F.instance_norm(x.flatten(2), weight=self.weight, bias=self.bias),
        )


@pytest.mark.anyio
async def test_portable_vision_ops_of_other_ranks_at_live_widths(load_pte):
    """Beside a delegate, at live widths (the resampling's sizes follow them) and batch sizes in
    random order, the least and the most included: equal to torch eager (1e-5)."""
    from .test_more_ops import _kernel_calls

    width, batch = torch.export.Dim("width", min=5, max=13), torch.export.Dim("batch", min=2, max=3)
    sample, shapes = (torch.randn(3, 3, 17, 13) * 2 + 0.5,), ({0: batch, 3: width},)
    pte, module = export_pte("portable_vision_ranks_live", PortableVisionRanks, sample, shapes, seed=3)
    assert PORTABLE_OPS <= _kernel_calls(pte), sorted(_kernel_calls(pte))
    calls = dynamic_shape_calls(sample, shapes, n=5, seed=3)
    assert {c[0].shape[3] for c in calls} >= {5, 13} and {c[0].shape[0] for c in calls} == {2, 3}
    await assert_matches_eager(await load_pte(pte), module, calls, atol=1e-5, rtol=1e-5)


class Shrinks(nn.Module):
    """Antialiased bilinear shrinking by 150 and 133 times, and by 75 along the height alone."""

    def forward(self, x):
        aa = functools.partial(F.interpolate, mode="bilinear", antialias=True)
        return aa(x, size=(2, 3)), aa(x, size=(4, 400), align_corners=True)


@pytest.mark.anyio
async def test_antialiased_shrinks_by_a_hundred_times(load_pte):
    """Windows of 300 x 267 inputs an output (its 2-D window's 80,000 reads in one pass): equal to
    torch eager (1e-5)."""
    from .exporting import eager, without_delegates

    x = torch.randn(1, 2, 300, 400)
    pte = without_delegates("antialiased_shrinks", Shrinks(), (x,))
    outs = await (await load_pte(pte)).execute(x.numpy())
    for k, (out, want) in enumerate(zip(outs, eager(Shrinks(), x.numpy()), strict=True)):
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=f"output {k}")


@pytest.mark.anyio
async def test_portable_vision_ops_in_half_precision(load_pte):
    """A float16 program with no partitioner runs these ops on f16 storage where the device has
    shader-f16: equal to eager in f32 on the same f16 values within f16's rounding of the outputs."""
    import copy

    from .exporting import eager, without_delegates
    from .test_more_ops import _kernel_calls

    torch.manual_seed(4)
    half, x = PortableVision().half(), (torch.randn(2, 3, 17, 13) * 2 + 0.5).half()
    pte = without_delegates("portable_vision_half", half, (x,))
    assert PORTABLE_OPS <= _kernel_calls(pte), sorted(_kernel_calls(pte))
    model = await load_pte(pte)
    assert model.precision == ("f16" if "shader-f16" in model.device_info.features else "f32"), model.precision_note
    outs = await model.execute(x.numpy())
    wants = eager(copy.deepcopy(half).float(), x.float().numpy())
    for k, (out, want) in enumerate(zip(outs, wants, strict=True)):
        assert out.dtype == np.float16, f"output {k}"
        np.testing.assert_allclose(out.astype(np.float32), want, rtol=2e-3, atol=4e-3, err_msg=f"output {k}")


def test_portable_vision_ops_refuse_bad_shapes():
    """Each op's build or resize hook names what was wrong with its arguments."""
    from pte_wgpu.resize.values import IntList, Scalar, Tensor, ValueList

    from .hooks import Graph, resize

    def build(name, x_dims, *args, outs=1):
        g = Graph()
        x = g.add(Tensor("float32", x_dims))
        ids = [x] + [g.add(a) for a in args]
        out = [g.add(Tensor("float32", (4, 4, 4, 4))) for _ in range(outs)]
        tail = [g.add(ValueList(tuple(out)))] if outs > 1 else []
        return g, name, ids + out + tail

    with pytest.raises(ValueError, match=r"_adaptive_avg_pool2d.out: output size \[0, 3\]: expected 2 sizes of at least 1"):
        resize(*build("aten::_adaptive_avg_pool2d.out", (1, 3, 8, 8), IntList((0, 3))), {})
    with pytest.raises(ValueError, match=r"_adaptive_avg_pool2d.out: input of shape \(8, 8\): expected 3-D or 4-D"):
        resize(*build("aten::_adaptive_avg_pool2d.out", (8, 8), IntList((2, 3))), {})
    aa = (IntList((5, 3)), Scalar(False), Scalar(None), Scalar(None))
    with pytest.raises(ValueError, match=r"_upsample_bilinear2d_aa.out: input of shape \(3, 8, 8\): expected 4-D"):
        resize(*build("aten::_upsample_bilinear2d_aa.out", (3, 8, 8), *aa), {})
    bn = "aten::_native_batch_norm_legit.no_stats_out"
    settings = (Scalar(None), Scalar(True), Scalar(0.1), Scalar(1e-5))
    with pytest.raises(ValueError, match=r"no_stats_out: input of shape \(8,\): expected at least 2 dims"):
        resize(*build(bn, (8,), Scalar(None), *settings, outs=3), {})
    with pytest.raises(ValueError, match=r"no_stats_out: weight or bias of shape \(4,\) for 3 channels"):
        resize(*build(bn, (2, 3, 5), Tensor("float32", (4,)), *settings, outs=3), {})
