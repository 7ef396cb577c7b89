"""The runtime's exceptions.

The resource errors are anyio's (which are trio's names): `ClosedResourceError` when your code
closed the model or session, `BusyResourceError` for two concurrent calls on one session,
`BrokenResourceError` when the device was lost (the wgpu error is the `__cause__`).
"""

from anyio import BrokenResourceError, BusyResourceError, ClosedResourceError

__all__ = [
    "BrokenResourceError",
    "BusyResourceError",
    "ClosedResourceError",
    "InputError",
    "MemoryBudgetError",
    "ModelFormatError",
    "ResizeError",
    "RuntimeFault",
    "UnsupportedOperatorError",
]


class ModelFormatError(ValueError):
    """The file is not a valid ExecuTorch program with a Vulkan delegate."""


class UnsupportedOperatorError(NotImplementedError):
    """The program uses operators this runtime has no kernel for; `ops` lists every one."""

    def __init__(self, ops):
        self.ops = sorted(set(ops))
        super().__init__("unsupported operators: " + ", ".join(self.ops))


class InputError(ValueError):
    """An input has the wrong count, dtype, rank or shape; the message says what was expected."""


class MemoryBudgetError(MemoryError):
    """Loading the model or opening a session would pass the memory budget given to `load`."""


class ResizeError(RuntimeError):
    """Live shapes could not be propagated through the graph; the previous state is kept."""


class RuntimeFault(RuntimeError):
    """Something inside the runtime went wrong that is not the caller's fault."""
