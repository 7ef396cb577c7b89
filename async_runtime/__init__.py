"""pte-wgpu: run ExecuTorch `.pte` models (Vulkan delegate) on any WebGPU adapter from async Python.

    import async_runtime as ar
    model = await ar.load("model.pte")
    outputs = await model.execute(x)      # list of numpy arrays at their live shapes
    await model.aclose()
"""

from . import backend  # noqa: F401 (first: it chooses the WebGPU implementation before wgpu is imported)
from pte_wgpu.resize.events import InputResized

from .device import DeviceInfo
from .errors import (
    BrokenResourceError,
    BusyResourceError,
    ClosedResourceError,
    InputError,
    MemoryBudgetError,
    ModelFormatError,
    ResizeError,
    RuntimeFault,
    UnsupportedOperatorError,
)
from .llm.generate import GenerationStats, context_length, generate
from .model import PRECISIONS, IOSpec, Model, load
from .sampling import Sampling
from .session import Session
from .stats import Statistics

__all__ = [
    "BrokenResourceError",
    "BusyResourceError",
    "ClosedResourceError",
    "DeviceInfo",
    "GenerationStats",
    "IOSpec",
    "InputError",
    "InputResized",
    "MemoryBudgetError",
    "Model",
    "ModelFormatError",
    "PRECISIONS",
    "ResizeError",
    "RuntimeFault",
    "Sampling",
    "Session",
    "Statistics",
    "UnsupportedOperatorError",
    "context_length",
    "generate",
    "load",
]
