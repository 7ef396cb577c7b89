import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytest_plugins = ["async_runtime.testing.pytest_plugin"]  # also found through its entry point once installed


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    """Every async test runs on asyncio and on trio."""
    return request.param


@pytest.fixture(params=["gpu", "cpu"])
def kernel_variants(request, monkeypatch):
    """Runs a test with the GPU kernel variants and with the CPU adapters' (kernels/variants.py),
    whatever the adapter: CI on lavapipe covers both."""
    monkeypatch.setenv("PTE_WGPU_KERNELS", request.param)
    return request.param


@pytest.fixture(scope="session", autouse=True)
def exports_under_way(request, tmp_path_factory):
    """Slow exports start with the first test, side by side, for the selected files that use them:
    test_llama's tiny Llama exports (minutes each, in subprocesses; test_batching, test_server and
    test_greedy_bursts use two of them), test_fp16's and test_q4_fusion's, when ExecuTorch is here to make them;
    test_bench's run (its own export, then the bench). Those for the last files, the Vulkan
    delegate adapter's lowerings and the vision bench's export, run niced: they take the CPU the
    files before them leave idle. So does the prebuild of the exports the selected modules list
    in PREBUILD (tests/prebuild.py), into the session's export store (tests/exporting.py), and,
    when other files are selected too, test_soak's run (niced further)."""
    from . import exporting

    items = request.session.items
    selected = {item.path.name for item in items}
    runs, pool = [], None
    exporting.STORE = exporting.STORE or str(tmp_path_factory.mktemp("exports"))
    if any("bench_run" in getattr(item, "fixturenames", ()) for item in items):
        from .test_bench import start_bench

        runs.append(start_bench(tmp_path_factory))
    if "test_soak.py" in selected and len(selected) > 1:
        from .test_soak import start_soak

        runs.append(start_soak(tmp_path_factory))
    if importlib.util.find_spec("executorch") is not None:
        if "test_llama.py" in selected:
            from .test_llama import start_exports

            start_exports(tmp_path_factory)
        if "test_llm_families.py" in selected:
            from .test_llm_families import start_exports

            start_exports(tmp_path_factory)
        if "test_fp16.py" in selected:
            from .test_fp16 import start_exports

            start_exports(tmp_path_factory)
        if "test_q4_fusion.py" in selected:
            from .test_q4_fusion import start_exports

            start_exports(tmp_path_factory)
        if "test_paged_cache.py" in selected:
            from .test_paged_cache import start_exports

            start_exports(tmp_path_factory)
        if "test_vulkan_delegate_adapter.py" in selected:
            from .test_vulkan_delegate_adapter import start_lowerings

            pool = start_lowerings(request.session)
        if any(item.name == "test_vision_bench_exports_compressible_files_and_runs" for item in items):
            from .test_zoo import start_vision_export

            runs.append(start_vision_export(tmp_path_factory))
        runs.append(_start_prebuild(items, exporting.STORE, tmp_path_factory))
    yield
    for run in filter(None, runs):
        run.stop()
    if pool is not None:
        pool.shutdown(cancel_futures=True)


def _start_prebuild(items, store, tmp_path_factory):
    """tests/prebuild.py over the selected modules that list exports in PREBUILD, in the order
    the session reaches them, niced; None when none does."""
    modules = list(dict.fromkeys(item.module.__name__ for item in items if getattr(getattr(item, "module", None), "PREBUILD", None)))
    if not modules:
        return None
    from .background import Background

    env = dict(os.environ, PTE_WGPU_EXPORT_DIR=store)
    root = Path(__file__).parents[1]
    return Background([sys.executable, "-m", "tests.prebuild", *modules], tmp_path_factory.mktemp("prebuild"), cwd=root, nice=10, env=env)


@pytest.fixture(scope="session")
def adapter(wgpu_adapter):
    """The WebGPU adapter's summary (the plugin skips without one, or fails under
    PTE_WGPU_REQUIRE_ADAPTER=1)."""
    return wgpu_adapter.summary


@pytest.fixture
def half_adapter(wgpu_adapter):
    """For the tests of float16 storage: they skip on an adapter without shader-f16 (Dawn's on
    NVIDIA), where every model loads in f32."""
    if "shader-f16" not in wgpu_adapter.features:
        pytest.skip("the adapter has no shader-f16: models load in f32")


def pytest_terminal_summary(terminalreporter):
    """The pass count of ExecuTorch's Vulkan delegate tests (tests/test_vulkan_delegate_adapter.py)."""
    adapter = sys.modules.get("tests.test_vulkan_delegate_adapter")
    line = adapter and adapter.summary_line(terminalreporter.stats)
    if line:
        terminalreporter.write_sep("=", line)
