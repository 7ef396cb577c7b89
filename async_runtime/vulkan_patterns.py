"""ExecuTorch's Vulkan fusion patterns, built once per process: export time only (imports torch
and ExecuTorch when called). Used by every export of this package: `async_runtime.testing.export_pte`,
the LLM export's subprocess (`async_runtime.llm.export`), and the tests' exports.
"""

import functools
from unittest import mock


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
        import torch

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
