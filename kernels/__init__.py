"""WGSL kernels and the op registry, one module per op family; importing this registers them all."""

from . import elementwise, symint  # noqa: F401
from . import linear  # noqa: F401
from . import shape  # noqa: F401
from . import reduce  # noqa: F401
from .registry import OPS, Dispatch, OpBuilder, Params, build_node, op

__all__ = ["OPS", "Dispatch", "OpBuilder", "Params", "build_node", "op"]
