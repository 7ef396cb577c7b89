"""The choice of f16 or f32 storage for a model's float16 tensors, at load (kernels' own f16 cases
are in their families' tests; whole fp16 models in tests/test_fp16.py)."""

import numpy as np
import pytest
import torch

import async_runtime as ar
from pte_wgpu.kernels import OPS

from .exporting import export_pte
from .one_kernel import run_kernel

pytestmark = pytest.mark.usefixtures("adapter")


class Pointwise(torch.nn.Module):
    """Only elementwise ops: every one has an f16 kernel."""

    def forward(self, x, y):
        return torch.nn.functional.gelu(x * 2 + y) - torch.sigmoid(y)


def pointwise_half():
    rows = torch.export.Dim("rows", min=1, max=9)
    sample = [torch.randn(5, 13).half(), torch.randn(5, 13).half()]
    return export_pte("pointwise_half", Pointwise, sample, dynamic_shapes=({0: rows}, {0: rows}))[0]


def inputs(rows, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((rows, 13)).astype(np.float16) for _ in range(2)]


def eager_half(x, y):
    with torch.no_grad():
        return Pointwise()(torch.from_numpy(x), torch.from_numpy(y)).numpy()


async def test_float16_tensors_are_f16_where_the_adapter_has_shader_f16():
    async with await ar.load(pointwise_half()) as model:
        if "shader-f16" not in model.device_info.features:
            pytest.skip("the adapter has no shader-f16")
        assert (model.precision, model.device_info.precision, model.precision_note) == ("f16", "f16", "")
        for k, rows in enumerate((9, 1, 4, 7)):
            x, y = inputs(rows, k)
            (out,) = await model.execute(x, y)
            assert out.dtype == np.float16 and out.shape == (rows, 13)
            # each op rounds to f16 as torch's fp16 eager does, from f32 arithmetic: a few ulps
            np.testing.assert_allclose(out.astype(np.float32), eager_half(x, y).astype(np.float32), rtol=4e-3, atol=4e-3)


async def test_precision_f32_widens_and_gives_the_same_values_up_to_f16_rounding():
    async with await ar.load(pointwise_half()) as half, await ar.load(pointwise_half(), precision="f32") as wide:
        assert wide.precision == "f32" and wide.precision_note == 'f32: load(precision="f32")'
        x, y = inputs(9, 0)
        (a,), (b,) = await half.execute(x, y), await wide.execute(x, y)
        assert a.dtype == b.dtype == np.float16
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=4e-3, atol=4e-3)
        if half.precision == "f16":  # the activations take half the bytes
            assert half.memory() <= 0.6 * wide.memory()


async def test_an_op_without_an_f16_kernel_widens_the_whole_model(monkeypatch):
    monkeypatch.setattr(OPS["aten.sigmoid.default"], "half", False)
    async with await ar.load(pointwise_half()) as model:
        assert model.precision == "f32"
        if "shader-f16" in model.device_info.features:
            assert model.precision_note == "f32: aten.sigmoid.default has no f16 kernel"
        x, y = inputs(6, 1)
        (out,) = await model.execute(x, y)
        np.testing.assert_allclose(out.astype(np.float32), eager_half(x, y).astype(np.float32), rtol=4e-3, atol=4e-3)


async def test_float32_given_for_a_float16_input_is_rounded_and_an_int_is_refused():
    async with await ar.load(pointwise_half()) as model:
        x, y = inputs(3, 2)
        (from_f32,) = await model.execute(x.astype(np.float32) + np.float32(1e-5), y)  # rounds back to x
        (from_f16,) = await model.execute(x, y)
        np.testing.assert_array_equal(from_f32, from_f16)
        with pytest.raises(ar.InputError, match=r"input 0: dtype int32 given, expected float16"):
            await model.execute(np.ones((3, 13), np.int32), y)
        (again,) = await model.execute(x, y)  # the model keeps working
        np.testing.assert_array_equal(again, from_f16)


async def test_a_bad_precision_is_refused_before_anything_loads():
    with pytest.raises(ValueError, match=r"precision must be one of 'auto', 'f16-sums', 'f32', got 'f16'"):
        await ar.load(pointwise_half(), precision="f16")


def test_kernels_round_to_f16_to_nearest_even():
    """wgsl.rounded(v, "f16"), how kernels round a value to f16 as a store and a reload would (an
    epilogue's product before its residual, a fused norm's rows, RoPE's inputs): as numpy rounds
    to float16 (to nearest, ties to even; subnormals; infinite past 65,504), on every device.
    (NVIDIA's Vulkan driver keeps the f32 value of f32(f16(v)) and of a pack2x16float round trip.)"""
    from pte_wgpu.kernels.wgsl import rounded

    from async_runtime.pipelines import wgsl_for_device

    n = 1 << 14
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-9, 5, n)).astype(np.float32)  # f16's subnormals to past its largest
    halves = x[: n // 4].astype(np.float16)
    x[: n // 4] = halves.astype(np.float32) + np.spacing(np.abs(halves)).astype(np.float32) / 2  # ties between two halves
    x[:12] = [0.0, -0.0, 65504.0, 65519.99, 65520.0, -7e4, 2.0**-14, 2.0**-24, 2.0**-25, 3 * 2.0**-26, np.inf, -np.inf]
    src = wgsl_for_device(
        "@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
        "@group(0) @binding(1) var<storage, read_write> y: array<f32>;\n"
        f"@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {{ y[g.x] = {rounded('x[g.x]', 'f16')}; }}\n"
    )
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    got = run_kernel(src, (x,), np.float32, n)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
