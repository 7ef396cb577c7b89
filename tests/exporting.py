"""Exporting torch modules to `.pte` with ExecuTorch's VulkanPartitioner, cached per test session."""

import torch

_CACHE = {}


def export_pte(name, make_module, example_args, dynamic_shapes=None, seed=0):
    """(bytes of the .pte, the eager module) for `make_module()`; built once per session per name."""
    if name not in _CACHE:
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
        from executorch.exir import to_edge_transform_and_lower

        torch.manual_seed(seed)
        module = make_module().eval()
        ep = torch.export.export(module, tuple(example_args), dynamic_shapes=dynamic_shapes)
        partitioner = VulkanPartitioner({"require_dynamic_shapes": dynamic_shapes is not None})
        program = to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch()
        _CACHE[name] = (bytes(program.buffer), module)
    return _CACHE[name]


def eager(module, *args):
    """Run the eager module on numpy inputs; a list of numpy outputs."""
    with torch.no_grad():
        out = module(*[torch.from_numpy(a) for a in args])
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [o.numpy() for o in outs]
