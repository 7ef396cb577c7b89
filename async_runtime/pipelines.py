"""A graph's kernels at load: compiled in parallel worker threads, then each dispatched once.

Every route a shape can select (GEMV and GEMM, attention's one-pass and split-K) is a dispatch of
its own in the graph, so compiling every dispatch's shader covers all of them. Drivers that
compile at first use (lavapipe turns a pipeline into machine code at its first dispatch, 0.1-0.8 s
each) are then made to do it at load: one workgroup of each pipeline, whatever the live shapes,
so the warm-up costs the same for a 128- or a 2,048-token export.
"""

import os
import re

import anyio
from pte_wgpu.kernels.wgsl import LIBRARY

from . import backend
from .encoding import encode_dispatches, prepare
from .errors import RuntimeFault

# Worker threads compiling at once: wgpu-core serializes part of pipeline creation, and anyio
# keeps idle threads for reuse, so a few suffice.
COMPILE_THREADS = min(4, os.cpu_count() or 1)


USES_F16 = re.compile(r"\bf16\b")
COMMENT = re.compile(r"//[^\n]*")  # a comment may name f16 or a subgroup operation that the kernel does not use
USES_SUBGROUPS = re.compile(r"\bsubgroup[A-Z_]")  # subgroupAdd, subgroup_size, ...
CALLS = {name: re.compile(rf"\b{name}\(") for name in LIBRARY}


def shader_module(device, src):
    """`src` as a shader module without naga's forced loop bounding, and without its bounds
    checks unless backend.SHADER_CHECKS.

    By default naga gives every loop a hidden 64-bit counter that breaks out after 2^64 turns, in
    case a shader never ends; that counter keeps the driver from unrolling and scheduling short
    loops, such as the GEMM's 16-step inner loop (1.3x the GEMM's time on an H100, and more in
    the decode GEMVs). Every loop of this project's kernels ends by construction: fixed trip
    counts, halving strides, or counts from uniforms; every index stays within its binding
    (backend.py). wgpu-native offers this as a "trusted" module; Dawn takes the default one, its
    checks set for the whole instance (backend.py)."""
    native = backend.native._api
    trusted = getattr(native.lib, "wgpuDeviceCreateShaderModuleTrusted", None) if backend.NAME == "wgpu-native" else None
    if trusted is None or not isinstance(device, native.GPUDevice):
        return device.create_shader_module(code=src)
    source = native.new_struct_p("WGPUShaderSourceWGSL *", code=native.to_c_string_view(src))
    source[0].chain.next = native.ffi.NULL
    source[0].chain.sType = native.lib.WGPUSType_ShaderSourceWGSL
    descriptor = native.new_struct_p(
        "WGPUShaderModuleDescriptor *",
        nextInChain=native.ffi.cast("WGPUChainedStruct *", source),
        label=native.to_c_string_view(""),
    )
    checks = native.lib.WGPUShaderRuntimeChecks_BoundsChecks if backend.SHADER_CHECKS else native.lib.WGPUShaderRuntimeChecks_None
    handle = native.libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, descriptor, checks)
    return native.GPUShaderModule("", handle, device)


def wgsl_for_device(src):
    """A kernel's source with the directives its compiler wants: `enable f16;` where it names f16
    (kernels do only for float16 tensors, on devices with shader-f16), Dawn's for subgroups; and
    the definitions of the LIBRARY functions it calls (kernels/wgsl.py: round_half, is_nan)."""
    for name, definition in LIBRARY.items():
        if CALLS[name].search(src) and f"fn {name}(" not in src:
            src += definition
    code = COMMENT.sub("", src)
    if USES_F16.search(code):
        src = "enable f16;\n" + src
    if backend.ENABLE_SUBGROUPS and USES_SUBGROUPS.search(code):
        src = backend.ENABLE_SUBGROUPS + src
    return src


def compile_pipeline(device, src):
    module = shader_module(device, wgsl_for_device(src))
    return device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})


def dispatch_once(device, pipeline, bind_group):
    """Submit one workgroup of `pipeline`: a driver that compiles at first use does it now."""
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    encode_dispatches(compute, [(*prepare(pipeline, bind_group), (1, 1, 1))])
    compute.end()
    device.queue.submit([encoder.finish()])


async def compile_pipelines(device, dispatches, progress):
    """{shader source: pipeline} for every dispatch with a shader; RuntimeFault names the op of
    the first kernel that fails to compile, with its source."""
    ops = {}
    for d in dispatches:
        if d.shader is not None:
            ops.setdefault(d.shader, d.op)
    pipelines, failures = {}, []
    limiter = anyio.CapacityLimiter(COMPILE_THREADS)
    progress("compile", 0, len(ops))

    async def compile_one(src, op, scope):
        try:
            pipelines[src] = await anyio.to_thread.run_sync(compile_pipeline, device, src, limiter=limiter)
        except Exception as e:
            failures.append(RuntimeFault(f"the kernel of {op} failed to compile: {e}\n--- shader ---\n{src}"))
            failures[-1].__cause__ = e
            scope.cancel()
            return
        progress("compile", len(pipelines), len(ops))

    async with anyio.create_task_group() as tg:
        for src, op in ops.items():
            tg.start_soon(compile_one, src, op, tg.cancel_scope)
    if failures:
        raise failures[0]
    return pipelines


def dispatch_each_once(session, progress):
    """Run one workgroup of every pipeline of the graph on `session` (a throwaway one: kernels
    write its state tensors), one submit per pipeline so `progress` moves as the driver compiles.
    Blocking: call it from a worker thread."""
    model = session._model
    first = {}  # shader -> the first dispatch that runs it (its bind group fits the pipeline)
    for did, d in enumerate(model.graph.dispatches):
        if d.shader is not None:
            first.setdefault(d.shader, did)
    device = model.device
    progress.from_worker("warm-up", 0, len(first))
    for done, (src, did) in enumerate(first.items(), 1):
        dispatch_once(device, model._pipelines[src], session._bind_groups[did])
        session._staging.map_sync("READ")  # worker thread: waits until the dispatch (and the driver's compile) ran
        session._staging.unmap()
        progress.from_worker("warm-up", done, len(first))
    session._staging.map_sync("READ")  # worker thread
    session._staging.read_mapped(copy=True)  # the first read of mapped memory is slow too
    session._staging.unmap()
