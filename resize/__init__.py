"""The resize engine: live shapes under the maximum, SymInts and resize propagation.

Nothing here touches the GPU: ops describe what a resize changes (output dims, parameter bytes,
dispatch grids) and the runtime applies those changes to the device afterwards.
"""

from .engine import LiveState, Node, Plan, ResizeContext, propagate_resize
from .events import InputResized
from .shapes import broadcast_shapes, contiguous_strides, fold_grid, normalize_dim, numel_of

__all__ = [
    "InputResized",
    "LiveState",
    "Node",
    "Plan",
    "ResizeContext",
    "broadcast_shapes",
    "contiguous_strides",
    "fold_grid",
    "normalize_dim",
    "numel_of",
    "propagate_resize",
]
