import os

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    """Every async test runs on asyncio and on trio."""
    return request.param


def _adapter_summary():
    try:
        import wgpu

        adapter = wgpu.gpu.request_adapter_sync()
        return adapter.summary if adapter is not None else None
    except Exception:
        return None


@pytest.fixture(scope="session")
def adapter():
    """The WebGPU adapter summary; skips without one unless PTE_WGPU_REQUIRE_ADAPTER=1."""
    summary = _adapter_summary()
    if summary is None:
        if os.environ.get("PTE_WGPU_REQUIRE_ADAPTER") == "1":
            pytest.fail("no WebGPU adapter, and PTE_WGPU_REQUIRE_ADAPTER=1")
        pytest.skip("no WebGPU adapter (install mesa-vulkan-drivers for lavapipe)")
    return summary
