"""The input validation matrix: every bad input is an InputError that names the input and what was
expected, and the next call on the same model works.

Decided here (and in RELIABILITY.md): anything `numpy.asarray` reads as an array of the right kind
is accepted and copied to the device's layout: non-contiguous, Fortran-ordered, big-endian and
read-only arrays, other float widths for a float input, nested lists of numbers. NaN and Inf are
not checked; they run through the kernels as through torch's (`test_nan_and_inf`).
"""

import re

import numpy as np
import pytest
import torch

import async_runtime as ar

from .exporting import eager, export_pte
from .models import MLP, elementwise_dynamic

pytestmark = pytest.mark.usefixtures("adapter")

CONTEXT = 16


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


class PositionTable(torch.nn.Module):
    """The Llama pattern in small: rows `pos .. pos+S` of a `CONTEXT`-row table (a KV cache's
    positions); `pos` is a data-dependent SymInt (et_vk.select_as_symint)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(CONTEXT, 5))

    def forward(self, x, pos):
        p = pos[0].item()
        torch._check(p >= 0)
        torch._check(p + x.shape[0] <= CONTEXT)
        return self.table.narrow(0, p, x.shape[0]) * x


def position_table():
    s = torch.export.Dim("S", min=1, max=CONTEXT)
    return export_pte("position_table", PositionTable, [torch.randn(CONTEXT, 5), torch.tensor([0])], dynamic_shapes=({0: s}, None))


def _grad_tensor():
    return torch.randn(3, 4, 7, requires_grad=True)


# (what, the inputs, a regex the InputError must match). Each names the input ("input 0") or the
# count, and what was expected.
Y = rand(4, 1)
BAD = [
    ("no inputs", lambda: (), r"expected 2 inputs \(float32\[3, 9, 7\], float32\[9, 1\]\), got 0"),
    ("one input", lambda: (rand(3, 4, 7),), r"expected 2 inputs .*got 1"),
    ("three inputs", lambda: (rand(3, 4, 7), Y, Y), r"expected 2 inputs .*got 3"),
    ("int32 for float32", lambda: (np.ones((3, 4, 7), np.int32), Y), r"input 0: dtype int32 given, expected float32"),
    ("bool for float32", lambda: (rand(3, 4, 7) > 0, Y), r"input 0: dtype bool given, expected float32"),
    ("complex", lambda: (rand(3, 4, 7).astype(np.complex64), Y), r"input 0: dtype complex64 given, expected float32"),
    ("rank 2 for rank 3", lambda: (rand(3, 4), Y), r"input 0: rank 2 \(shape \[3, 4\]\) given, expected rank 3 \(exported shape \[3, 9, 7\]\)"),
    ("rank 4 for rank 3", lambda: (rand(1, 3, 4, 7), Y), r"input 0: rank 4 .*expected rank 3"),
    ("more elements than exported", lambda: (rand(3, 10, 7), rand(10, 1)), r"input 0: shape \[3, 10, 7\] has 210 elements, its buffer holds 189 \(exported shape \[3, 9, 7\]\)"),
    ("a static dim over, too many elements", lambda: (rand(4, 9, 7), Y), r"input 0: shape \[4, 9, 7\] has 252 elements"),
    ("zero dim", lambda: (rand(3, 0, 7), rand(0, 1)), r"input 0: dim 1 is 0, expected at least 1"),
    ("second input's elements", lambda: (rand(3, 4, 7), rand(5, 2)), r"input 1: shape \[5, 2\] has 10 elements, its buffer holds 9"),
    ("shapes that fit but do not broadcast", lambda: (rand(3, 4, 7), rand(4, 2)), r"these inputs do not fit the model: .*do not broadcast"),
    ("dims that disagree", lambda: (rand(3, 4, 7), rand(5, 1)), r"these inputs do not fit the model"),
    ("a Python scalar", lambda: (1.5, Y), r"input 0: rank 0 \(shape \[\]\) given, expected rank 3"),
    ("a 0-d array", lambda: (np.float32(1.5), Y), r"input 0: rank 0"),
    ("None", lambda: (None, Y), r"input 0: dtype object given, expected float32"),
    ("a string", lambda: ("abc", Y), r"input 0: dtype <U3 given, expected float32"),
    ("bytes", lambda: (b"abc", Y), r"input 0: dtype \|S3 given, expected float32"),
    ("a dict", lambda: ({"x": 1}, Y), r"input 0: dtype object given"),
    ("ragged nested lists", lambda: ([[1.0], [1.0, 2.0]], Y), r"input 0: cannot be read as an array"),
    ("nested lists of strings", lambda: ([[["a"] * 7] * 4] * 3, Y), r"input 0: dtype <U1 given"),
    ("an object array", lambda: (rand(3, 4, 7).astype(object), Y), r"input 0: dtype object given"),
    ("a torch tensor that requires grad", lambda: (_grad_tensor(), Y), r"input 0: cannot be read as an array \(Can't call numpy\(\)"),
    ("a bfloat16 torch tensor", lambda: (torch.randn(3, 4, 7, dtype=torch.bfloat16), Y), r"input 0: cannot be read as an array"),
    ("the second input None", lambda: (rand(3, 4, 7), None), r"input 1: dtype object given, expected float32 \(exported shape \[9, 1\]\)"),
]

ACCEPTED = [  # copied to the device's layout; the result is eager's on the same values
    ("non-contiguous (strided)", lambda: (rand(3, 8, 7)[:, ::2], Y)),
    ("transposed", lambda: (rand(7, 4, 3).transpose(2, 1, 0), Y)),
    ("Fortran order", lambda: (np.asfortranarray(rand(3, 4, 7)), np.asfortranarray(Y))),
    ("big-endian", lambda: (rand(3, 4, 7).astype(">f4"), Y)),
    ("float64", lambda: (rand(3, 4, 7).astype(np.float64), Y)),
    ("float16", lambda: (rand(3, 4, 7).astype(np.float16), Y)),
    ("read-only", lambda: (_read_only(rand(3, 4, 7)), Y)),
    ("nested lists", lambda: (rand(3, 4, 7).tolist(), Y.tolist())),
    ("torch tensors, one non-contiguous", lambda: (torch.from_numpy(rand(3, 4, 14))[:, :, ::2], torch.from_numpy(Y))),
    ("a static dim smaller than exported", lambda: (rand(2, 4, 7), Y)),  # see RELIABILITY.md
    ("a static dim larger than exported, the elements within", lambda: (rand(4, 4, 7), Y)),
]


def _read_only(a):
    a.flags.writeable = False
    return a


async def test_every_bad_input_is_named_and_the_next_call_works(load_pte):
    pte, module = elementwise_dynamic()
    x, y = rand(3, 6, 7, seed=1), rand(6, 1, seed=1)
    want = eager(module, x, y)[0]
    failures = []
    model = await load_pte(pte)
    for what, inputs, message in BAD:
        try:
            await model.execute(*inputs())
            failures.append(f"{what}: no error")
        except ar.InputError as e:
            if not re.search(message, str(e)):
                failures.append(f"{what}: {e!s} does not match {message!r}")
        except Exception as e:  # noqa: BLE001 - the point is to list every wrong kind of error
            failures.append(f"{what}: {type(e).__name__}: {e}")
        (out,) = await model.execute(x, y)  # the model keeps working
        np.testing.assert_allclose(out, want, atol=1e-5, err_msg=f"after {what}")
    assert failures == []


@pytest.mark.parametrize("what, inputs", ACCEPTED, ids=[a[0] for a in ACCEPTED])
async def test_accepted_inputs_are_copied(what, inputs, load_pte):
    pte, module = elementwise_dynamic()
    args = inputs()
    plain = [np.ascontiguousarray(np.asarray(a, dtype=np.float32)) for a in args]
    model = await load_pte(pte)
    (out,) = await model.execute(*args)
    assert out.dtype == np.float32 and out.shape == np.broadcast_shapes(*(p.shape for p in plain))
    np.testing.assert_allclose(out, eager(module, *plain)[0], atol=1e-5)


async def test_int64_inputs_out_of_the_int32_range_and_positions_past_the_context(load_pte):
    """A position input (the Llama pattern): within the context it runs; past it, negative, or
    outside int32 it is an InputError, and the next call works. Other int kinds are accepted."""
    pte, module = position_table()
    x = rand(5, 5)
    model = await load_pte(pte)
    for pos, message in [
        (12, r"do not fit the model"),  # 12 + 5 > 16
        (16, r"do not fit the model"),
        (40, r"do not fit the model"),
        (-1, r"do not fit the model"),
        (2**40, r"input 1: values outside the int32 range"),
    ]:
        with pytest.raises(ar.InputError, match=message):
            await model.execute(x, np.array([pos]))
        (out,) = await model.execute(x, np.array([11]))  # the last position that fits
        np.testing.assert_allclose(out, eager(module, x, np.array([11]))[0], atol=1e-6)
    with pytest.raises(ar.InputError, match=r"input 1: dtype float64 given, expected int64"):
        await model.execute(x, np.array([1.0]))
    with pytest.raises(ar.InputError, match=r"input 1: shape \[2\] has 2 elements, its buffer holds 1"):
        await model.execute(x, np.array([1, 2]))
    for pos in (np.array([3], np.int32), np.array([3], np.uint8), [3]):
        (out,) = await model.execute(x, pos)
        np.testing.assert_allclose(out, eager(module, x, np.array([3]))[0], atol=1e-6)


async def test_nan_and_inf(load_pte):
    """What NaN and Inf do (RELIABILITY.md): no input is scanned for them; they run through the
    kernels as through torch's, relu's NaN included, and nothing sticks."""
    pte, module = export_pte("mlp", MLP, [torch.randn(5, 13)])
    model = await load_pte(pte)
    x = rand(5, 13)
    x[1, 3] = np.inf
    (out,) = await model.execute(x)
    want = eager(module, x)[0]
    np.testing.assert_allclose(out, want, atol=1e-4)  # Inf rows: the same Inf/NaN as torch
    x = rand(5, 13)
    x[1, 3] = np.nan
    (out,) = await model.execute(x)
    want = eager(module, x)[0]
    assert np.isnan(want[1]).all() and np.isnan(out[1]).all()  # through the linear, relu and the next linear
    np.testing.assert_allclose(np.delete(out, 1, 0), np.delete(want, 1, 0), atol=1e-4)  # other rows untouched
    (again,) = await model.execute(rand(5, 13))
    assert np.isfinite(again).all()  # nothing sticks


class Activations(torch.nn.Module):
    """The activations that clamp, each an op of the delegate."""

    def forward(self, x):
        f = torch.nn.functional
        return (torch.relu(x), torch.clamp(x, -1.5, 2.0), f.relu6(x), torch.tanh(x), f.leaky_relu(x, 0.1), f.hardswish(x),
                torch.clamp(x, min=0.5), torch.clamp(x, max=-0.5), torch.clamp(x, 1.0, -1.0))


class ConvActivations(torch.nn.Module):
    """Clamps in a convolution's epilogue (et_vk.conv_with_clamp): a direct convolution of 8
    channels and an implicit GEMM of 32; relu(x + y), one pte_wgpu.add_relu; and a convolution
    with no clamp."""

    def __init__(self):
        super().__init__()
        self.narrow = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.wide = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.plain = torch.nn.Conv2d(3, 5, 3, padding=1)

    def forward(self, x, y):
        return torch.nn.functional.relu6(self.narrow(x)), torch.relu(self.wide(x)), torch.relu(x + y), self.plain(x)


class Extremes(torch.nn.Module):
    """The ops that pick a larger or smaller value: elementwise, along a row with its index, and the
    k largest or smallest of a row or of a middle dim (topk, which ExecuTorch leaves to its portable kernels)."""

    def forward(self, x, y):
        return (torch.maximum(x, y), torch.minimum(x, y), x.amax(-1), x.amin(-1), x.argmax(-1), x.argmin(-1), *x.max(-1),
                *y.min(0, keepdim=True), x.max(), y.min(), *torch.topk(x, 5), *torch.topk(y, 3, dim=0, largest=False), *torch.topk(x, 13))


def _same_as_torch(out, want):
    """NaN where torch has NaN, the sign of every zero and infinity as torch's, the rest within f32 rounding."""
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    exact = (want == 0) | np.isinf(want)
    np.testing.assert_array_equal(np.signbit(out[exact]), np.signbit(want[exact]))
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6, equal_nan=True)


async def test_activations_pass_nan_and_keep_signed_zeros_as_torch(load_pte):
    """relu, clamp (one bound or both, the lower above the upper too), relu6 (hardtanh), tanh,
    leaky_relu and hardswish of NaN, +-Inf, -0.0 and numbers on both sides of their bounds, and the
    clamps the graph rewrites move into a convolution's epilogue or an add: torch's values, Inf
    where a convolution meets one. WGSL's max, min and clamp may return the other operand of a NaN
    (lavapipe's max(NaN, 0) is 0), and NVIDIA's compilers read a select of a comparison as a max;
    the kernels clamp by comparisons that also test a NaN's bits."""
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -2.5, -1.0, 0.25, 1.75, 2.5, 7.0, -7.0, 30.0, -30.0], np.float32)
    x = np.resize(special, (3, 14)) * np.array([[1], [1], [-1]], np.float32)
    pte, module = export_pte("activations", Activations, [torch.randn(3, 14)])
    model = await load_pte(pte)
    for out, want in zip(await model.execute(x), eager(module, x), strict=True):
        _same_as_torch(out, want)
    pte, module = export_pte("conv_activations", ConvActivations, [torch.randn(1, 3, 9, 11), torch.randn(1, 3, 9, 11)])
    model = await load_pte(pte)
    x, y = rand(1, 3, 9, 11), rand(1, 3, 9, 11, seed=1)
    x[0, 1, 4, 5], y[0, 2, 0, 0], y[0, 0, 3, 3] = np.nan, np.nan, -0.0
    x[0, 0, 3, 3], x[0, 2, 7, 2] = 0.0, np.inf
    outs, wants = await model.execute(x, y), eager(module, x, y)
    assert all(np.isnan(w).any() for w in wants) and all(np.isinf(w).any() for w in wants[1:])
    for out, want in zip(outs, wants, strict=True):
        np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert np.signbit(outs[2][0, 0, 3, 3]) == np.signbit(wants[2][0, 0, 3, 3])  # relu(0.0 + -0.0)


async def test_extremes_of_nan_as_torch(load_pte):
    """maximum and minimum are NaN where either operand is, amax and amin of a row with a NaN are
    NaN, and argmax and argmin of such a row name its first NaN, as in torch; so do max and min
    along a dim (values and indices; ExecuTorch leaves them to its portable kernels), and topk
    ranks NaN above every number (last, taking the smallest)."""
    x, y = rand(4, 13), rand(4, 13, seed=1)
    x[0, 5], x[2, 0], x[2, 9], y[1, 3], x[3, 7], y[3, 7] = np.nan, np.nan, np.nan, np.nan, np.inf, -np.inf
    pte, module = export_pte("extremes", Extremes, [torch.randn(4, 13), torch.randn(4, 13)])
    model = await load_pte(pte)
    outs, wants = await model.execute(x, y), eager(module, x, y)
    assert np.isnan(wants[2][[0, 2]]).all() and list(wants[4][[0, 2]]) == [5, 0]
    for out, want in zip(outs[:12], wants[:12], strict=True):
        np.testing.assert_array_equal(out, want)
    # topk: torch's values; indices that hold them (the order of equal values, two NaNs here, is torch's to choose)
    for (values, indices), want, source, dim in zip(zip(outs[12::2], outs[13::2]), wants[12::2], (x, y, x), (1, 0, 1), strict=True):
        np.testing.assert_array_equal(values, want)
        np.testing.assert_array_equal(np.take_along_axis(source, indices.astype(np.int64), dim), want)
