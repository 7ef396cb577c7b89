"""pytest plugin for pte-wgpu (registered through the `pytest11` entry point when pte-wgpu is
installed; otherwise `pytest -p async_runtime.testing.pytest_plugin`).

Fixtures:
  `wgpu_adapter` (session): the `AdapterInfo` of the adapter `ar.load` would pick (honouring
      $PTE_WGPU_ADAPTER). Tests that use it are skipped when there is no WebGPU adapter; with
      $PTE_WGPU_REQUIRE_ADAPTER=1 they fail instead (for CI, where a missing driver is a bug).
  `load_pte` (function, async): a factory, `model = await load_pte(path_or_bytes, **load_kwargs)`;
      every model it loaded is closed at teardown. Works on asyncio and trio through anyio's
      pytest plugin (mark the test `@pytest.mark.anyio`, or set `anyio_mode = "auto"`).

Marker:
  `@pytest.mark.gpu`: the test needs a real GPU. It is skipped on software adapters (Mesa's
      llvmpipe/lavapipe, SwiftShader, WARP: any adapter of type CPU) and when there is no adapter;
      with $PTE_WGPU_REQUIRE_GPU=1 it fails instead (for a GPU CI runner that must not fall back to
      software). Deselect with `-m "not gpu"`.
"""

import os
from dataclasses import dataclass

import pytest

REQUIRE_ADAPTER_ENV = "PTE_WGPU_REQUIRE_ADAPTER"
REQUIRE_GPU_ENV = "PTE_WGPU_REQUIRE_GPU"
SOFTWARE_NAMES = ("llvmpipe", "lavapipe", "swiftshader", "microsoft basic render", "warp")
GPU_MARKER = "gpu: needs a real GPU adapter (skipped on software adapters such as lavapipe; fails instead with PTE_WGPU_REQUIRE_GPU=1)"


@dataclass(frozen=True)
class AdapterInfo:
    """The WebGPU adapter the tests run on."""

    summary: str  # e.g. "llvmpipe (LLVM 15.0.6, 256 bits) (CPU) via Vulkan"
    adapter_type: str  # "DiscreteGPU", "IntegratedGPU", "CPU", ...
    backend: str  # "Vulkan", "Metal", "D3D12", ...
    vendor: str
    software: bool  # a CPU rasterizer (lavapipe, SwiftShader, WARP)
    features: tuple = ()  # WebGPU features it offers, e.g. "shader-f16"

    def __str__(self):
        return self.summary


_probe = []  # [(AdapterInfo or None, reason)]: probed once per process


def probe_adapter():
    """(AdapterInfo, "") for the adapter `ar.load` would pick, or (None, why there is none)."""
    if not _probe:
        _probe.append(_probe_once())
    return _probe[0]


def _probe_once():
    from ..device import find_adapter

    try:
        adapter = find_adapter()  # pytest's own thread: no event loop runs here
    except Exception as e:
        return None, str(e)
    info = adapter.info
    adapter_type = str(info.get("adapter_type", ""))
    summary = adapter.summary
    software = adapter_type.lower() == "cpu" or any(n in summary.lower() for n in SOFTWARE_NAMES)
    return (
        AdapterInfo(
            summary=summary,
            adapter_type=adapter_type,
            backend=str(info.get("backend_type", "")),
            vendor=str(info.get("vendor", "")),
            software=software,
            features=tuple(sorted(adapter.features)),
        ),
        "",
    )


def _env_on(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def pytest_configure(config):
    config.addinivalue_line("markers", GPU_MARKER)


def pytest_report_header(config):
    if config.option.verbose > 0:
        info, reason = probe_adapter()
        if info is None:
            return f"pte-wgpu: {reason}"
        return f"pte-wgpu: adapter {info.summary}{' (software: gpu-marked tests skip)' if info.software else ''}"
    return None


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is None:
        return
    info, reason = probe_adapter()
    if info is None:
        if _env_on(REQUIRE_GPU_ENV) or _env_on(REQUIRE_ADAPTER_ENV):
            pytest.fail(f"{reason}, and {REQUIRE_GPU_ENV if _env_on(REQUIRE_GPU_ENV) else REQUIRE_ADAPTER_ENV}=1", pytrace=False)
        pytest.skip(reason)
    if info.software:
        if _env_on(REQUIRE_GPU_ENV):
            pytest.fail(f"marked gpu, but the adapter is a software one ({info.summary}), and {REQUIRE_GPU_ENV}=1", pytrace=False)
        pytest.skip(f"needs a real GPU; the adapter is a software one ({info.summary})")


@pytest.fixture(scope="session")
def wgpu_adapter():
    """The WebGPU adapter (`AdapterInfo`); skips without one unless PTE_WGPU_REQUIRE_ADAPTER=1."""
    info, reason = probe_adapter()
    if info is None:
        if _env_on(REQUIRE_ADAPTER_ENV):
            pytest.fail(f"{reason}, and {REQUIRE_ADAPTER_ENV}=1", pytrace=False)
        pytest.skip(reason)
    return info


@pytest.fixture
async def load_pte(wgpu_adapter, anyio_backend):
    """`model = await load_pte(source, method="forward", **kw)` (as `ar.load`); every model loaded
    is closed at teardown, last first. Needs anyio's pytest plugin (it ships with anyio)."""
    import async_runtime as ar

    loaded = []

    async def load(source, method="forward", **kwargs):
        model = await ar.load(source, method, **kwargs)
        loaded.append(model)
        return model

    try:
        yield load
    finally:
        errors = []
        for model in reversed(loaded):
            try:
                await model.aclose()
            except Exception as e:  # close the others all the same
                errors.append(e)
        if errors:
            raise errors[0]
