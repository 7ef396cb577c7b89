"""Exporting torch modules to `.pte` with ExecuTorch's VulkanPartitioner, cached per test session.

With PTE_WGPU_EXPORT_DIR set, each export is also kept there (the .pte and the module's weights),
and a later run reuses it without ExecuTorch: that is how the suite runs on a GPU machine whose
torch cannot export.
"""

import os
from pathlib import Path

import torch

from async_runtime.testing import export_pte as lower

_CACHE = {}
EXPORT_DIR = os.environ.get("PTE_WGPU_EXPORT_DIR")


def export_pte(name, make_module, example_args, dynamic_shapes=None, seed=0, require_dynamic_shapes=None,
               force_fp16=False):
    """(bytes of the .pte, the eager module) for `make_module()`; built once per session per name.
    `require_dynamic_shapes` (default: whether `dynamic_shapes` is given) and `force_fp16` are the
    partitioner's options (`async_runtime.testing.export_pte`)."""
    if name in _CACHE:
        return _CACHE[name]
    torch.manual_seed(seed)
    module = make_module().eval()
    stored = Path(EXPORT_DIR) / name if EXPORT_DIR else None
    if stored is not None and stored.with_suffix(".pte").exists():
        module.load_state_dict(torch.load(stored.with_suffix(".pt"), weights_only=True))
        _CACHE[name] = (stored.with_suffix(".pte").read_bytes(), module)
        return _CACHE[name]
    pte = lower(module, tuple(example_args), dynamic_shapes, require_dynamic_shapes=require_dynamic_shapes,
                force_fp16=force_fp16)
    if stored is not None:
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.with_suffix(".pte").write_bytes(pte)
        torch.save(module.state_dict(), stored.with_suffix(".pt"))
    _CACHE[name] = (pte, module)
    return _CACHE[name]


def eager(module, *args):
    """Run the eager module on numpy inputs; a list of numpy outputs."""
    with torch.no_grad():
        out = module(*[torch.from_numpy(a) for a in args])
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [o.numpy() for o in outs]
