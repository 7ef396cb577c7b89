"""Choosing the WebGPU implementation ($PTE_WGPU_BACKEND, async_runtime/backend.py) and its shader
checks ($PTE_WGPU_SHADER_CHECKS), in fresh interpreters: the choice is made once, when async_runtime
is first imported."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest


def _import_runtime(backend, code="import async_runtime"):
    env = dict(os.environ, PTE_WGPU_BACKEND=backend)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_default_is_wgpu_native():
    r = _import_runtime("", "import async_runtime.backend as b, wgpu; print(b.NAME, b.native.__name__, wgpu.__name__)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["wgpu-native", "wgpu.backends.wgpu_native", "wgpu"]


def test_an_unknown_backend_is_named_with_the_choices():
    r = _import_runtime("vulkan")
    assert r.returncode != 0
    assert "PTE_WGPU_BACKEND='vulkan': expected one of wgpu-native, dawn" in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("wgpudawn") is not None, reason="wgpudawn is installed here")
def test_dawn_without_wgpudawn_says_what_to_install():
    r = _import_runtime("dawn")
    assert r.returncode != 0
    assert "PTE_WGPU_BACKEND=dawn needs the wgpudawn package: pip install 'pte-wgpu[dawn]'" in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("wgpudawn") is None, reason="wgpudawn is not installed")
def test_dawn_takes_the_name_wgpu_and_a_wgpu_imported_first_is_refused():
    r = _import_runtime("dawn", "import async_runtime.backend as b, wgpu; print(b.NAME, wgpu.__file__)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "dawn" and "wgpudawn" in r.stdout
    r = _import_runtime("dawn", "import wgpu, async_runtime")
    assert r.returncode != 0 and "wgpu was imported before async_runtime" in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("wgpudawn") is None, reason="wgpudawn is not installed")
def test_dawn_opens_the_device_with_its_subgroup_matrices():
    """Dawn's experimental features are allowed (its instance toggle, set at import) and a device
    opened by the runtime has the subgroup-matrix feature where the adapter lists it (Dawn's Null
    backend here: the feature, no configs)."""
    code = """
import anyio
from async_runtime.device import open_device
_, device, info = anyio.run(open_device)
print(info.backend, "chromium-experimental-subgroup-matrix" in info.features, info.subgroup_matrices)
"""
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PTE_WGPU_BACKEND="dawn", WGPU_BACKEND_TYPE="Null"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["Null", "True", "()"], r.stdout


CFFI_PARSES = """
import random, anyio, cffi.api, numpy as np
import async_runtime.backend as b
from async_runtime.device import open_device
parses, parse = [], cffi.api.FFI._typeof_locked
cffi.api.FFI._typeof_locked = lambda ffi, cdecl: (parses.append(cdecl), parse(ffi, cdecl))[1]

async def main():
    adapter, device, _ = await open_device()
    buffer = device.create_buffer(size=64, usage="STORAGE|COPY_SRC|COPY_DST")
    device.queue.write_buffer(buffer, 0, np.arange(16, dtype=np.float32))
    return await anyio.to_thread.run_sync(device.queue.read_buffer, buffer)

read = np.frombuffer(anyio.run(main), np.float32)
assert (read == np.arange(16)).all()
ffi, cached = b.native.ffi, dict(b.native.ffi._parsed_types)
ffi._parsed_types.clear()  # each string parsed alone gives the object the one declaration gave
keys = [*b.CALLBACK_TYPES, *b.PLAIN_C_TYPES, *random.Random(7).sample(sorted(k for k in cached if not k.startswith('__')), 24)]
print(len(parses), [k for k in keys if ffi._typeof(k, consider_function_as_funcptr=True) is not cached.get(k, (None,))[0] or ffi._parsed_types[k] != cached[k]])
"""


@pytest.mark.usefixtures("adapter")
def test_wgpu_natives_c_types_are_parsed_in_one_declaration():
    """Opening a device, a write and a readback parse one C declaration on wgpu-native (cffi's
    parse of a type string costs ~50 ms; async_runtime.backend.parse_c_types_at_once), and what
    it leaves in cffi's cache is what parsing each string alone gives."""
    r = _import_runtime("", CFFI_PARSES)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split(maxsplit=1) == ["1", "[]\n"]


CHECKED_RUN = """
import sys, anyio, numpy as np
import async_runtime as ar

async def main():
    async with await ar.load(sys.argv[1]) as model:
        outs = [await model.execute(np.load(x)) for x in sys.argv[2:]]
        print(model.device_info.shader_checks, *(np.asarray(o).tobytes().hex() for o in outs))

anyio.run(main)
"""


@pytest.mark.usefixtures("adapter")
def test_shader_checks_are_off_and_change_no_result(tmp_path):
    """The shader compilers' bounds checks are off unless $PTE_WGPU_SHADER_CHECKS=1
    (`device_info.shader_checks`); every kernel index is in range, so an attention block gives the
    same bits either way, at its largest and smallest live shapes and one between."""
    from .models import block_dynamic

    path = tmp_path / "block.pte"
    path.write_bytes(block_dynamic()[0])
    rng = np.random.default_rng(11)
    inputs = []
    for s in (11, 1, 6):
        inputs.append(tmp_path / f"x{s}.npy")
        np.save(inputs[-1], rng.standard_normal((1, s, 15)).astype(np.float32))
    runs = {}
    for checks in ("", "1"):
        env = dict(os.environ, PTE_WGPU_SHADER_CHECKS=checks)
        r = subprocess.run([sys.executable, "-c", CHECKED_RUN, str(path), *map(str, inputs)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[checks] = r.stdout.split()
    assert runs[""][0] == "False" and runs["1"][0] == "True"
    assert runs[""][1:] == runs["1"][1:] and len(runs[""]) == 4
