"""Testing your own model with pte-wgpu's pytest plugin: copy this file next to your tests.

Needs `pip install "pte-wgpu[export,test]"` (the plugin comes with pte-wgpu and is found by pytest
on its own; from a checkout that is not installed, add `-p async_runtime.testing.pytest_plugin`). Run:

    pytest examples/test_my_model.py        # every test runs on asyncio and on trio

Without a WebGPU adapter the test is skipped (PTE_WGPU_REQUIRE_ADAPTER=1 makes that a failure).
"""

import pytest
import torch

from async_runtime.testing import assert_matches_eager, dynamic_shape_calls, export_pte

pytestmark = pytest.mark.anyio  # run the async tests through anyio's plugin


class MyModel(torch.nn.Module):
    """A small model with a dynamic batch: linear, GELU, a residual and a softmax."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        h = self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        return torch.softmax(h + x, dim=-1)


BATCH = torch.export.Dim("batch", min=1, max=24)
SAMPLE = (torch.randn(24, 16),)  # the inputs at their maximum shapes
DYNAMIC_SHAPES = ({0: BATCH},)


@pytest.fixture(scope="module")
def exported():
    """(the .pte's bytes, the eager module it was exported from); exported once per module."""
    torch.manual_seed(0)
    module = MyModel().eval()
    return export_pte(module, SAMPLE, DYNAMIC_SHAPES), module


async def test_my_model_matches_eager(exported, load_pte):
    pte, module = exported
    model = await load_pte(pte)  # closed at teardown
    await assert_matches_eager(model, module, dynamic_shape_calls(SAMPLE, DYNAMIC_SHAPES, n=8))
