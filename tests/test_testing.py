"""async_runtime.testing (assert_matches_eager, dynamic_shape_calls) and the pytest plugin."""

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import async_runtime as ar
from async_runtime.testing import assert_matches_eager, dynamic_shape_calls

from .models import EW_DYNAMIC, EW_SAMPLE, MLP_DYNAMIC, MLP_SAMPLE, elementwise_dynamic, mlp_dynamic

EXAMPLE = Path(__file__).parent.parent / "examples" / "test_my_model.py"


# --- dynamic_shape_calls ------------------------------------------------------------------------
def test_dynamic_shape_calls_cover_each_range_and_share_dims():
    s, b = torch.export.Dim("s", min=2, max=9), torch.export.Dim("b", min=1, max=5)
    sample = (torch.randn(3, 9, 7), np.zeros((9, 1), np.float32), torch.randint(-3, 40, (5, 18)))
    spec = ({1: s}, {0: s}, {0: b, 1: 2 * s})
    calls = dynamic_shape_calls(sample, spec, n=30, seed=1)
    assert len(calls) == 30
    sizes = []
    for x, y, ids in calls:
        assert isinstance(x, torch.Tensor) and isinstance(y, np.ndarray) and ids.dtype == torch.int64
        assert x.shape[0] == 3 and x.shape[2] == 7 and y.shape[1] == 1  # static dims kept
        assert x.shape[1] == y.shape[0] == ids.shape[1] // 2  # one Dim, one size; 2*s follows s
        assert 2 <= x.shape[1] <= 9 and 1 <= ids.shape[0] <= 5
        assert -3 <= int(ids.min()) and int(ids.max()) <= 39  # ints within the sample's range
        assert x.dtype == torch.float32 and y.dtype == np.float32
        sizes.append((x.shape[1], ids.shape[0]))
    assert sizes[0] == (2, 1) and sizes[1] == (9, 5)  # min, then max, then random
    assert len(set(sizes)) > 5
    again = dynamic_shape_calls(sample, spec, n=30, seed=1)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(calls, again))  # deterministic per seed
    other = dynamic_shape_calls(sample, spec, n=30, seed=2)
    assert [c[0].shape for c in other] != [c[0].shape for c in calls]


def test_dynamic_shape_calls_spec_forms():
    class TwoArgs(torch.nn.Module):
        def forward(self, a, b):
            return a + b

    d = torch.export.Dim("d", max=4)  # no min (0 in torch): live dims start at 1
    sample = (torch.randn(4, 2), torch.randn(4, 2))
    named = dynamic_shape_calls(sample, {"b": {0: d}, "a": None}, n=3, module=TwoArgs())
    assert [tuple(c[0].shape) for c in named] == [(4, 2)] * 3  # a is static
    assert [c[1].shape[0] for c in named][:2] == [1, 4]
    single = dynamic_shape_calls(torch.randn(4, 2), (d, None), n=2)  # a lone tensor, per-dim spec
    assert [c.shape[0] for c in single] == [1, 4]
    unbounded = dynamic_shape_calls((torch.randn(6),), ({0: torch.export.Dim("u")},), n=2)
    assert [c[0].shape[0] for c in unbounded] == [1, 6]  # no max: up to the sample's size
    assert [len(c[0]) for c in dynamic_shape_calls((torch.randn(5),), None, n=2)] == [5, 5]
    with pytest.raises(ValueError, match="2 entries for 1 inputs"):
        dynamic_shape_calls((torch.randn(5),), ({0: d}, None), n=2)


def test_testing_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # `import torch` now raises ImportError
        "import numpy as np, async_runtime.testing as t, async_runtime.testing.pytest_plugin\n"
        "assert t._mismatch(np.ones(3), np.ones(3), 1e-4, 1e-4) is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- assert_matches_eager -----------------------------------------------------------------------
async def test_a_dynamic_export_matches_eager_at_live_shapes(load_pte):
    pte, module = elementwise_dynamic()
    model = await load_pte(pte)
    calls = dynamic_shape_calls(EW_SAMPLE, EW_DYNAMIC, n=6)
    stats = await assert_matches_eager(model, module, calls, atol=1e-5)
    assert stats.executes == 6 + 6 + 1  # in order, shuffled, the first again
    assert stats.resize_events > 0
    async with model.session() as s:  # a session works too
        await assert_matches_eager(s, module, calls[:2])


async def test_a_changed_module_fails_naming_the_call_and_the_output(wgpu_adapter, tmp_path):
    pte, module = mlp_dynamic()
    changed = copy.deepcopy(module)
    with torch.no_grad():
        changed.l2.bias[3] += 0.5  # the module changed after export: output column 3 is off
    calls = [(np.ones((4, 13), np.float32),), (np.ones((2, 13), np.float32),)]
    path = tmp_path / "mlp.pte"
    path.write_bytes(pte)
    with pytest.raises(AssertionError) as info:
        await assert_matches_eager(path, changed, calls)  # loaded from the path, and closed
    message = str(info.value)
    assert message.startswith("call 0 (inputs float32[4, 13]; step 1 of 5, in order): output 0 differs from eager")
    assert "in 4 of 28 elements" in message and "worst at (0, 3): got " in message
    await assert_matches_eager(path, module, calls)  # the exported module matches


async def test_precomputed_outputs_and_a_bad_input_named_by_call(load_pte):
    pte, module = mlp_dynamic()
    calls = dynamic_shape_calls(MLP_SAMPLE, MLP_DYNAMIC, n=3, seed=5)
    with torch.no_grad():
        expected = [[module(*c).numpy()] for c in calls]
    model = await load_pte(pte)
    await assert_matches_eager(model, None, calls, expected=expected)  # no torch needed this way
    with pytest.raises(ar.InputError) as info:
        await assert_matches_eager(model, module, [calls[0], (np.ones((24, 13), np.float32),)])
    assert "dim 0 is 24, expected 1..23" in str(info.value)
    assert any("call 1 (inputs float32[24, 13]" in n for n in info.value.__notes__)
    (out,) = await model.execute(*calls[0])  # the model keeps working
    assert out.shape == tuple(calls[0][0].shape[:1]) + (7,)


# --- the pytest plugin, in a pytest of its own ----------------------------------------------------
def run_pytest(tmp_path, source, *args, **env):
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(source))
    # Only the two plugins, whether or not pte-wgpu's entry point is installed.
    plugins = ["-p", "anyio.pytest_plugin", "-p", "async_runtime.testing.pytest_plugin"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PTE_WGPU_")}
    environ.update(env, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run(
        [sys.executable, "-m", "pytest", *plugins, "-rsfE", *args, str(tmp_path / "test_inner.py")],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_plugin_load_pte_closes_its_models_on_asyncio_and_trio(wgpu_adapter, tmp_path):
    pte, _ = mlp_dynamic()
    (tmp_path / "mlp.pte").write_bytes(pte)
    source = """
        import numpy as np, pytest
        pytestmark = pytest.mark.anyio
        LOADED = []

        async def test_load(load_pte, anyio_backend, wgpu_adapter):
            model = await load_pte("mlp.pte")
            second = await load_pte(open("mlp.pte", "rb").read(), batch_submits=False)
            (out,) = await model.execute(np.ones((3, 13), np.float32))
            assert out.shape == (3, 7) and wgpu_adapter.summary
            LOADED.append((anyio_backend, model, second))

        def test_closed_at_teardown():
            assert LOADED and all(m._closed and s._closed for _, m, s in LOADED)

        def test_both_backends_ran():
            assert sorted(b for b, _, _ in LOADED) == ["asyncio", "trio"]
    """
    result = run_pytest(tmp_path, source)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout or "5 passed" in result.stdout, result.stdout


GPU_SOURCE = """
    import pytest

    @pytest.mark.gpu
    def test_needs_gpu(wgpu_adapter):
        assert not wgpu_adapter.software

    def test_any_adapter(wgpu_adapter):
        assert wgpu_adapter.summary
"""


def test_plugin_gpu_marker(wgpu_adapter, tmp_path):
    result = run_pytest(tmp_path, GPU_SOURCE)
    assert result.returncode == 0, result.stdout + result.stderr
    if wgpu_adapter.software:
        assert "1 passed, 1 skipped" in result.stdout and "software" in result.stdout, result.stdout
        strict = run_pytest(tmp_path, GPU_SOURCE, PTE_WGPU_REQUIRE_GPU="1")
        assert strict.returncode == 1 and "1 passed, 1 error" in strict.stdout, strict.stdout  # fails at setup
        assert "PTE_WGPU_REQUIRE_GPU=1" in strict.stdout
    else:
        assert "2 passed" in result.stdout, result.stdout


def test_plugin_without_an_adapter_skips_or_fails(tmp_path):
    none = {"PTE_WGPU_ADAPTER": "no-such-adapter-anywhere"}
    result = run_pytest(tmp_path, GPU_SOURCE, **none)
    assert result.returncode == 0 and "2 skipped" in result.stdout, result.stdout
    assert "no WebGPU adapter matches 'no-such-adapter-anywhere'" in result.stdout
    strict = run_pytest(tmp_path, GPU_SOURCE, PTE_WGPU_REQUIRE_ADAPTER="1", **none)
    assert strict.returncode == 1 and "PTE_WGPU_REQUIRE_ADAPTER=1" in strict.stdout, strict.stdout


def test_the_example_passes_on_asyncio_and_trio_in_a_directory_of_its_own(wgpu_adapter, tmp_path):
    """examples/test_my_model.py alone, as a user's project would have it: it exports its model
    (ExecuTorch needed) and its test passes on both backends."""
    pytest.importorskip("executorch")
    result = run_pytest(tmp_path, EXAMPLE.read_text(), "-v")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[asyncio] PASSED" in result.stdout and "[trio] PASSED" in result.stdout, result.stdout
