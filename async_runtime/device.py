"""Choosing the WebGPU adapter and opening a device with the adapter's full limits."""

import os
from dataclasses import dataclass

import anyio
import wgpu

from .backend import SHADER_CHECKS, SUBGROUP_FEATURES, SUBGROUP_MATRIX_FEATURE, parse_c_types_at_once, subgroup_matrix_configs

# subgroups: the CPU adapters' GEMVs sum along K across a subgroup's lanes (kernels/matmul/linear.py);
# kernels use them only when the device was opened with them (`build_node(..., subgroups=...)`).
# implicit-device-synchronization: Dawn locks the device around every call, as wgpu-native always
# does; without it, calls from other threads (pipeline compiles in workers, a buffer the collector
# releases on wgpudawn's event-pump thread) may race the loop's. Seen once on Mesa 25's lavapipe:
# Dawn aborted in such a release during test_batching on trio (not reproduced since, either way).
WANTED_FEATURES = ("shader-f16", "timestamp-query", *SUBGROUP_FEATURES, SUBGROUP_MATRIX_FEATURE, "implicit-device-synchronization")
ADAPTER_ENV = "PTE_WGPU_ADAPTER"
GPU_INDEX_PREFIX = "gpu:"  # "gpu:1": the second GPU, for identical cards whose names cannot tell them apart


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # the adapter summary, e.g. "NVIDIA H100 80GB HBM3 (DiscreteGPU) via Vulkan"
    adapter_type: str
    backend: str
    features: tuple
    max_storage_binding: int
    max_buffer_size: int
    max_workgroups_per_dimension: int
    max_storage_buffers: int  # storage buffers one kernel may bind (16 on Dawn's Vulkan adapters; more on wgpu-native's)
    # the subgroup-matrix products the device offers, (component, result, M, N, K, subgroup size):
    # Dawn's on NVIDIA ("i8", "i32", 16, 16, 32, 32) and others; () on wgpu-native
    subgroup_matrices: tuple = ()
    precision: str = "f32"  # how a loaded model stores and sums float16 tensors: "f16", "f16-sums" or "f32" (Model.precision)
    shader_checks: bool = False  # the shader compilers' bounds checks ($PTE_WGPU_SHADER_CHECKS=1; backend.py)


def find_adapter(name=None, power_preference="high-performance"):
    """The adapter whose summary contains `name` (or $PTE_WGPU_ADAPTER), case-insensitively, else
    the preferred one; RuntimeError lists what exists. Blocking: call it from a worker thread or
    where no event loop runs (adapter requests resolve synchronously in wgpu-py 0.32)."""
    name = name or os.environ.get(ADAPTER_ENV)
    if name and name.lower().startswith(GPU_INDEX_PREFIX):
        return _gpu_by_index(name[len(GPU_INDEX_PREFIX):])
    if name:
        adapters = wgpu.gpu.enumerate_adapters_sync()  # worker thread
        matches = [a for a in adapters if name.lower() in a.summary.lower()]
        if not matches:
            found = "; ".join(a.summary for a in adapters) or "none"
            raise RuntimeError(f"no WebGPU adapter matches {name!r}; adapters found: {found}")
        return matches[0]
    adapter = wgpu.gpu.request_adapter_sync(power_preference=power_preference)  # worker thread
    if adapter is None:
        raise RuntimeError("no WebGPU adapter found (on Linux without a GPU, install mesa-vulkan-drivers)")
    return adapter


def _gpu_by_index(index):
    """The GPU adapter at `index` among the GPUs (not CPU adapters) of the first backend that has
    any, in the driver's enumeration order (NVIDIA's Vulkan driver: PCI bus order, like nvidia-smi)."""
    if not index.isdigit():
        raise RuntimeError(f"{ADAPTER_ENV}={GPU_INDEX_PREFIX}{index}: the index must be a number")
    gpus = [a for a in wgpu.gpu.enumerate_adapters_sync() if a.info.get("adapter_type") in ("DiscreteGPU", "IntegratedGPU")]  # worker thread (find_adapter)
    backends = [a.info.get("backend_type") for a in gpus]
    gpus = [a for a, b in zip(gpus, backends) if b == backends[0]] if gpus else []
    if int(index) >= len(gpus):
        raise RuntimeError(f"no GPU adapter {index}: {len(gpus)} found ({'; '.join(a.summary for a in gpus) or 'none'})")
    return gpus[int(index)]


def _open_in_worker_thread(name, power_preference):
    """Creating a Vulkan device takes tens of ms on a real GPU: this runs off the event loop."""
    parse_c_types_at_once()
    adapter = find_adapter(name, power_preference)
    features = [f for f in WANTED_FEATURES if f in adapter.features]
    limits = dict(adapter.limits)
    device = adapter.request_device_sync(required_features=features, required_limits=limits)  # worker thread
    return adapter, device, features, limits


async def open_device(name=None, power_preference="high-performance"):
    """(adapter, device, DeviceInfo). `name` (or $PTE_WGPU_ADAPTER) picks an adapter by a
    case-insensitive substring of its summary; otherwise the preferred adapter is taken."""
    adapter, device, features, limits = await anyio.to_thread.run_sync(_open_in_worker_thread, name, power_preference)
    info = adapter.info
    return (
        adapter,
        device,
        DeviceInfo(
            name=adapter.summary,
            adapter_type=str(info.get("adapter_type", "")),
            backend=str(info.get("backend_type", "")),
            features=tuple(sorted(features)),
            max_storage_binding=limits["max-storage-buffer-binding-size"],
            max_buffer_size=limits["max-buffer-size"],
            max_workgroups_per_dimension=limits["max-compute-workgroups-per-dimension"],
            max_storage_buffers=limits["max-storage-buffers-per-shader-stage"],
            subgroup_matrices=subgroup_matrix_configs(adapter),
            shader_checks=SHADER_CHECKS,
        ),
    )
