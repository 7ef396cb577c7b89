"""Exporting torch modules to `.pte` with ExecuTorch's VulkanPartitioner, cached per test session.

With PTE_WGPU_EXPORT_DIR set, each export is also kept there (the .pte and the module's weights),
and a later run reuses it without ExecuTorch: that is how the suite runs on a GPU machine whose
torch cannot export.
"""

import functools
import os
from pathlib import Path
from unittest import mock

import torch

_CACHE = {}
EXPORT_DIR = os.environ.get("PTE_WGPU_EXPORT_DIR")


def export_pte(name, make_module, example_args, dynamic_shapes=None, seed=0, require_dynamic_shapes=None):
    """(bytes of the .pte, the eager module) for `make_module()`; built once per session per name.
    `require_dynamic_shapes` (default: whether `dynamic_shapes` is given) is the partitioner's
    option: False also delegates the ops that ExecuTorch's Vulkan runtime cannot resize."""
    if name in _CACHE:
        return _CACHE[name]
    torch.manual_seed(seed)
    module = make_module().eval()
    stored = Path(EXPORT_DIR) / name if EXPORT_DIR else None
    if stored is not None and stored.with_suffix(".pte").exists():
        module.load_state_dict(torch.load(stored.with_suffix(".pt"), weights_only=True))
        _CACHE[name] = (stored.with_suffix(".pte").read_bytes(), module)
        return _CACHE[name]
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    cache_vulkan_pattern_graphs()
    ep = torch.export.export(module, tuple(example_args), dynamic_shapes=dynamic_shapes)
    if require_dynamic_shapes is None:
        require_dynamic_shapes = dynamic_shapes is not None
    partitioner = VulkanPartitioner({"require_dynamic_shapes": require_dynamic_shapes})
    pte = bytes(to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch().buffer)
    if stored is not None:
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.with_suffix(".pte").write_bytes(pte)
        torch.save(module.state_dict(), stored.with_suffix(".pt"))
    _CACHE[name] = (pte, module)
    return _CACHE[name]


@functools.cache
def cache_vulkan_pattern_graphs():
    """Build each of the VulkanPartitioner's fusion pattern graphs once per process.

    ExecuTorch 1.5.1 registers its rope pattern builders beneath their `lru_cache` (the decorators
    are in the wrong order), so every partition and every preprocess exports three rope modules
    again: about 15 of the 18 s that lowering a one-op module takes on two cores. The patterns are
    only matched against, never changed: the `.pte` files are byte-identical. A cached call still
    makes the builder's `torch.randn` draws, so the global RNG moves as it does without the cache
    (ExecuTorch's tests draw their next inputs and weights after a lowering).
    """
    from executorch.backends.vulkan.patterns import fusable_patterns

    for entry in fusable_patterns.values():
        if entry.get_graphs_fn is not None:
            entry.get_graphs_fn = _built_once(entry.get_graphs_fn)


def _built_once(build):
    graphs, draws = None, []

    def cached():
        nonlocal graphs
        if graphs is None:
            randn = torch.randn

            def recorded(*args, **kwargs):
                draws.append((args, kwargs))
                return randn(*args, **kwargs)

            with mock.patch("torch.randn", recorded):
                graphs = build()
        else:
            for args, kwargs in draws:
                torch.randn(*args, **kwargs)
        return graphs

    return cached


def eager(module, *args):
    """Run the eager module on numpy inputs; a list of numpy outputs."""
    with torch.no_grad():
        out = module(*[torch.from_numpy(a) for a in args])
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [o.numpy() for o in outs]
