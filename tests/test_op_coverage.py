"""Every operator the installed ExecuTorch's Vulkan partitioner delegates has a kernel here.

The names come from `executorch.backends.vulkan.op_registry.vulkan_supported_ops`, spelled as the
VkGraph serializer writes them (`node.target.__name__`: `aten.add.Tensor`, `et_vk.q8ta_add.default`,
`sym_size.int`, bare `add` for SymInt arithmetic). A registry key given as a string
("llama::update_cache") is a custom op matched by `OpOverload.name()`; its graph name is that op's
`__name__`, with or without its namespace.
"""

import pytest

from pte_wgpu import kernels

# Registry entries that never reach a VkGraph: getitem resolves to a ValueList item while
# serializing, and the assertion ops are removed by the Vulkan preprocess (RemoveAssertsTransform).
NEVER_SERIALIZED = {"getitem", "_assert_scalar.default", "sym_constrain_range_for_size.default"}

# Training only: backward passes, the optimizer step and the fused loss.
TRAINING_ONLY = {
    "et_vk.fused_ce.default",  # cross-entropy loss and its logits gradient
    "et_vk.linear_dW.default",  # a linear layer's weight gradient
    "et_vk.linear_q4gsw_backward.default",
    "et_vk.q4gsw_requant.default",  # requantizes trained latent weights
    "et_vk.adamw_step.default",
}

# Delegated ops without a kernel yet: none.
EXPECTED_MISSING = frozenset()


def _graph_names(key):
    """The names a registry key can take in a VkGraph."""
    if not isinstance(key, str):
        return {key.__name__}
    namespace, name = key.split("::")
    return {f"{name}.default", f"{namespace}.{name}.default"}


@pytest.fixture(scope="module")
def registry():
    """{registry key's display name: its possible graph names}; skipped without ExecuTorch."""
    op_registry = pytest.importorskip("executorch.backends.vulkan.op_registry")
    return {str(getattr(k, "__name__", k)): _graph_names(k) for k in op_registry.vulkan_supported_ops}


def _missing(registry):
    return {
        shown
        for shown, names in registry.items()
        if not names & kernels.OPS.keys() and not names & (NEVER_SERIALIZED | TRAINING_ONLY | EXPECTED_MISSING)
    }


def test_every_delegated_op_has_a_kernel(registry):
    assert not _missing(registry), f"delegated by ExecuTorch's Vulkan partitioner, no kernel here: {sorted(_missing(registry))}"


def test_expected_missing_ops_are_still_missing_and_still_delegated(registry):
    """The exemption lists shrink as kernels land: an op with a kernel, or one the registry no
    longer names, must leave them."""
    delegated = set().union(*registry.values())
    assert not EXPECTED_MISSING & kernels.OPS.keys(), "has a kernel now: remove it from the expected-missing sets"
    assert EXPECTED_MISSING <= delegated, f"no longer in the registry: {sorted(EXPECTED_MISSING - delegated)}"
