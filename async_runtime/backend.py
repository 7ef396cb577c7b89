"""Which WebGPU implementation runs the models: wgpu-native (wgpu-py's own, the default) or Dawn
(Chrome's, through the `wgpudawn` package: `pip install 'pte-wgpu[dawn]'`), chosen once a process
by $PTE_WGPU_BACKEND ("wgpu-native" or "dawn") when `async_runtime` is first imported. Both speak
wgpu-py's API; Dawn takes the name `wgpu` (`wgpudawn.install_as_wgpu`), so it must be chosen
before anything imports wgpu.

`native` is the backend's module, whose C functions (`ffi`, `lib`) and classes the hot paths reach
directly. They are taken as its attributes, never imported by a submodule path: under Dawn,
`wgpu.backends.wgpu_native._ffi` would load wgpudawn's bindings a second time, and adapter requests
then resolve to None.
"""

import functools
import os
import sys

BACKEND_ENV = "PTE_WGPU_BACKEND"
BACKENDS = ("wgpu-native", "dawn")

# The shader compilers' bounds checks (naga's on wgpu-native, Tint's robustness transform on Dawn)
# are off: every kernel indexes within its bindings by construction (tails clamp or branch), and
# a model gives the same bits either way (tests/test_backend.py). ONNX Runtime's WebGPU provider
# runs Dawn the same way. H200, Llama-3.2-1B fp16, two rounds in one call: Dawn's prompts of 2,047 tokens
# 25,960-26,065 -> 35,212-35,323 tokens/s (its f16 tensor-core tile ran 65-69 against 103-107
# TFLOP/s alone), one stream 517-528 -> 607; wgpu-native's prompts and 64 streams 2-4% faster
# (BENCHMARKS.md). On wgpu-native, Vulkan's robustBufferAccess stays on where the driver has it
# (wgpu-hal asks for it); Dawn drops it with its checks. PTE_WGPU_SHADER_CHECKS=1 keeps them all,
# for a kernel suspected of reading past a buffer.
SHADER_CHECKS_ENV = "PTE_WGPU_SHADER_CHECKS"
SHADER_CHECKS = os.environ.get(SHADER_CHECKS_ENV, "").strip() == "1"


def _choose():
    name = os.environ.get(BACKEND_ENV, "").strip().lower() or BACKENDS[0]
    if name not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV}={name!r}: expected one of {', '.join(BACKENDS)}")
    if name == "dawn":
        try:
            import wgpudawn
        except ImportError as e:
            raise ImportError(f"{BACKEND_ENV}=dawn needs the wgpudawn package: pip install 'pte-wgpu[dawn]'") from e
        if "wgpu" not in sys.modules:
            from wgpudawn.backends.dawn import extras

            # before the first adapter request: Dawn lists its experimental features (subgroup
            # matrices: int8 and f16 products on tensor cores) only to an instance that allows them,
            # and offers shader-f16 on NVIDIA's Vulkan driver only with its own toggle (held back
            # there for conformance tests, crbug.com/42251215; this project's f16 tests pass on it)
            # Dawn quantizes timestamps by default (a web page's timers' precision): a small model's
            # whole step then read 0 ns on an H200; the profiler (tools/profile.py) wants them as measured
            toggles = ["allow_unsafe_apis", "vulkan_enable_f16_on_nvidia"] + ([] if SHADER_CHECKS else ["disable_robustness"])
            extras.set_instance_extras(enable_toggles=toggles, disable_toggles=["timestamp_quantization"])
            wgpudawn.install_as_wgpu()
        elif sys.modules["wgpu"].__file__ != wgpudawn.__file__:  # (the caller may have installed it)
            raise RuntimeError(f"{BACKEND_ENV}=dawn: wgpu was imported before async_runtime, so it is wgpu-native's")
    return name


NAME = _choose()

import wgpu.backends.wgpu_native as native  # noqa: E402, F401 (after the choice; read by encoding.py and pipelines.py)

# WebGPU's subgroup feature: "subgroup" in wgpu-native, "subgroups" in Dawn, whose WGSL compiler
# also wants the extension enabled in every shader that uses it, and refuses subgroup operations
# it cannot prove run in subgroup-uniform control flow (the kernels call them where every lane of
# a subgroup does, past workgroup-uniform branches on loop bounds it does not follow)
SUBGROUP_FEATURES = ("subgroup", "subgroups")
ENABLE_SUBGROUPS = "enable subgroups;\ndiagnostic(off, subgroup_uniformity);\n" if NAME == "dawn" else ""

# naga's storage barrier orders storage accesses at device scope, so the last of a dispatch's
# workgroups to arrive may merge what the others wrote (split-K attention, the sampler); WGSL
# promises it only within a workgroup and Dawn's compiler gives no more: there a merge takes a
# dispatch of its own (seen on an H100: the sampler read other workgroups' stale maxima)
MERGE_APART = NAME == "dawn"

# Dawn's products of subgroup matrices (tensor cores: int8 -> int32, f16 -> f32), when its adapter lists them
SUBGROUP_MATRIX_FEATURE = "chromium-experimental-subgroup-matrix"


def subgroup_matrix_configs(adapter):
    """The (component, result, M, N, K, subgroup size) of the subgroup-matrix products `adapter`
    offers at one subgroup size (Dawn's adapter properties); () elsewhere."""
    if NAME != "dawn" or SUBGROUP_MATRIX_FEATURE not in adapter.features:
        return ()
    from wgpudawn.backends.dawn import extras

    configs = extras.get_adapter_properties(adapter).get("subgroup_matrix_configs") or ()
    return tuple((c["component_type"], c["result_component_type"], c["m"], c["n"], c["k"], c["max_subgroup_size"])
                 for c in configs if c["min_subgroup_size"] == c["max_subgroup_size"])


def device_gone(device):
    """Whether `device` was destroyed or lost, for a readback whose map may never resolve then.
    Neither backend's wgpu-py 0.32 offers that publicly: wgpu-native stops the thread that resolves
    its maps (`_poller` becomes None; `lost_async` is not implemented), Dawn resolves the promise
    its device-lost callback sets (and leaves pending maps pending)."""
    if getattr(device, "_poller", True) is None:
        return True
    lost = getattr(device, "_lost_promise", None)
    return lost is not None and lost._state != "pending"


# C types that wgpu-py's helpers name besides its structs (byte views, addresses, chained structs),
# and the callbacks of its wgpu-native backend that opening a device and reading back meet
PLAIN_C_TYPES = ("uint8_t []", "uint8_t *", "uintptr_t", "intptr_t", "char []", "WGPUChainedStruct * ")
CALLBACK_TYPES = (
    "void(WGPURequestAdapterStatus, WGPUAdapter, WGPUStringView, void *, void *)",
    "void(WGPURequestDeviceStatus, WGPUDevice, WGPUStringView, void *, void *)",
    "void(WGPUDevice const *, WGPUDeviceLostReason, WGPUStringView, void *, void *)",
    "void(WGPUDevice const *, WGPUErrorType, WGPUStringView, void *, void *)",
    "void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)",
    "void(WGPUQueueWorkDoneStatus, void *, void *)",
)


@functools.cache
def parse_c_types_at_once():
    """wgpu-py's wgpu-native calls name their C types as strings ("WGPUBufferDescriptor *"), and
    cffi parses each string the first time it is used, re-reading every typedef of the header with
    it: ~50 ms a type, ~2 s of a process's first load on a two-core machine (about 40 types), in
    the worker that loads, holding the GIL the event loop needs. One declaration that names every
    struct pointer and array and the callbacks, parsed once (~0.2 s), fills cffi's cache of parsed
    strings (the private `_parsed_types`, in cffi since 1.0) with the same type objects. Dawn's
    bindings are compiled and parse nothing: a cffi without that cache is left alone. Blocking: a
    worker thread."""
    ffi = native.ffi
    cache = getattr(ffi, "_parsed_types", None)
    if cache is None:
        return
    names = [n for n in ffi.list_types()[0] if n.startswith("WGPU")]
    keys = [*(f"{n} *" for n in names), *(f"{n}[]" for n in names), *PLAIN_C_TYPES, *CALLBACK_TYPES]
    # a parameter's array decays to a pointer: a pointer to the array instead; its function type
    # decays to the function pointer that cffi keeps for a function type's string
    arrays = {k for k in keys if k.rstrip().endswith("[]")}
    params = [f"{k.rstrip()[:-2]}(*)[]" if k in arrays else k for k in keys]
    signature = ffi.typeof(f"void(*)({', '.join(params)})")
    for key, ctype in zip(keys, signature.args):
        cache.setdefault(key, (ctype.item if key in arrays else ctype, key in CALLBACK_TYPES))
