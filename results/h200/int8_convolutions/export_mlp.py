"""A statically quantized int8 MLP (ExecuTorch's static int8 flow, as tests/test_more_ops.py's
export_quantized): three 2,048 x 2,048 linears over 2,048 rows, so q8ta_linear products of 8.6
GMAC each, large enough for tensor cores to matter. Writes OUT/mlp_int8.pte.

    python export_mlp.py OUT
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.test_more_ops import _xnnpack_static, export_quantized  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self, width=2048):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


torch.manual_seed(0)
pte, _ = export_quantized("mlp_int8", _xnnpack_static, (torch.randn(2048, 2048),), make_module=MLP)
Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
(Path(sys.argv[1]) / "mlp_int8.pte").write_bytes(pte)
