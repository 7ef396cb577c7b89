"""Exporting torch modules to `.pte` with ExecuTorch's VulkanPartitioner, cached per test session.

Each export is kept in a store folder (the .pte and the module's weights) and read back from
there: PTE_WGPU_EXPORT_DIR when set, so a later run reuses it without ExecuTorch (that is how the
suite runs on a GPU machine whose torch cannot export; a test whose export is missing there skips,
as does one whose eager reference needs ExecuTorch or torchao: `export_extras`),
else a folder of the session's (tests/conftest.py). A process claims an export by name before
building it, so the session's background prebuild (tests/prebuild.py) and the tests never build one
twice: a test that meets an export another live process is building waits for it.
"""

import contextlib
import importlib.util
import os
import time
from pathlib import Path

import pytest
import torch

from async_runtime.testing import export_pte as lower

_CACHE = {}
EXPORT_DIR = os.environ.get("PTE_WGPU_EXPORT_DIR")
STORE = EXPORT_DIR  # where exports are kept; the session's own folder when EXPORT_DIR is unset
PREBUILD_ENV = "PTE_WGPU_PREBUILD"  # set in the prebuild process: it skips claimed exports
EXPORT_EXTRAS = ("torchao", "executorch")  # the `export` extra's ExecuTorch and the torchao it brings


class Claimed(Exception):
    """Another process is building this export (raised in the prebuild process only)."""


def export_pte(name, make_module, example_args, dynamic_shapes=None, seed=0, require_dynamic_shapes=None,
               force_fp16=False):
    """(bytes of the .pte, the eager module) for `make_module()`; built once per session per name.
    `require_dynamic_shapes` (default: whether `dynamic_shapes` is given) and `force_fp16` are the
    partitioner's options (`async_runtime.testing.export_pte`)."""
    if name in _CACHE:
        return _CACHE[name]
    torch.manual_seed(seed)
    with export_extras(f"export {name!r}: its eager module"):
        module = make_module().eval()
    lowering = lambda: lower(module, tuple(example_args), dynamic_shapes,  # noqa: E731
                             require_dynamic_shapes=require_dynamic_shapes, force_fp16=force_fp16)
    _CACHE[name] = (stored_pte(name, lowering, module), module)
    return _CACHE[name]


@contextlib.contextmanager
def export_extras(what):
    """Skips the test where `what` (its eager reference) imports an export-time extra
    (EXPORT_EXTRAS) that is not installed: a GPU machine given the store."""
    try:
        yield
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in EXPORT_EXTRAS:
            raise
        pytest.skip(f"{what} needs {e.name}, an export-time extra not installed here")


def without_delegates(name, module, sample, keep=(), dynamic_shapes=None, reinplace=False):
    """The .pte bytes of `module` on the inputs `sample` (with torch.export's `dynamic_shapes`)
    lowered with no partitioner, so every op runs as one of ExecuTorch's portable kernels, kept in
    the store under `name`; `keep`: ops the lowering keeps whole instead of decomposing them
    (var_mean); `reinplace`: ExecuTorch's pass that writes a buffer's update in place (index_put_)."""

    def lowering():
        import executorch.kernels.quantized  # noqa: F401  (the quantized ops' portable kernels, for their out variants)
        from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower

        config = EdgeCompileConfig(_core_aten_ops_exception_list=list(keep))
        program = torch.export.export(module, tuple(sample), dynamic_shapes=dynamic_shapes)
        lowered = to_edge_transform_and_lower(program, compile_config=config, partitioner=[])
        return bytes(lowered.to_executorch(ExecutorchBackendConfig(run_reinplace_pass=reinplace)).buffer)

    return stored_pte(name, lowering)


def stored_pte(name, lowering, module=None):
    """The .pte bytes of export `name`: from the store (its weights loaded into `module`), or made by
    `lowering()` and kept there (with `module`'s weights). The global RNG is reseeded after, so what
    a test draws next does not depend on whether the lowering ran here (it draws, ExecuTorch's
    pattern builders do)."""
    stored = Path(STORE) / name if STORE else None
    if stored is not None and _stored_or_claim(stored):
        if module is not None:
            module.load_state_dict(torch.load(stored.with_suffix(".pt"), weights_only=True))
        pte = stored.with_suffix(".pte").read_bytes()
    else:
        try:
            if importlib.util.find_spec("executorch") is None:  # a GPU machine given part of a store
                pytest.skip(f"export {name!r} is not in the store ({STORE}), and ExecuTorch is not installed to build it")
            pte = lowering()
            if stored is not None:
                if module is not None:
                    torch.save(module.state_dict(), stored.with_suffix(".pt"))
                partial = stored.with_suffix(".pte.partial")
                partial.write_bytes(pte)
                partial.replace(stored.with_suffix(".pte"))  # whole or absent: waiters read it when it appears
        finally:
            if stored is not None:
                stored.with_suffix(".claim").unlink(missing_ok=True)
    torch.manual_seed(len(pte))
    return pte


def _stored_or_claim(stored):
    """True once `stored` is in the store (waiting while another live process builds it); False
    when this process has claimed it and must build it."""
    stored.parent.mkdir(parents=True, exist_ok=True)
    claim = stored.with_suffix(".claim")
    while not stored.with_suffix(".pte").exists():
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if not _claimant_alive(claim):
                claim.unlink(missing_ok=True)
            elif os.environ.get(PREBUILD_ENV):
                raise Claimed(stored.name) from None
            else:
                time.sleep(0.2)
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return False
    return True


def _claimant_alive(claim):
    try:
        pid = int(claim.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return True  # gone (look again) or being written
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def eager(module, *args):
    """Run the eager module on numpy inputs; a list of numpy outputs."""
    with torch.no_grad():
        out = module(*[torch.from_numpy(a) for a in args])
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [o.numpy() for o in outs]
