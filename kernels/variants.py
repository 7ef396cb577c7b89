"""Kernel variants as data: each kernel family lists its variants in one table, and the registry
builds, at load, those meant for the adapter's class, then picks one per live shape at every
resize (the first in table order that applies; none for an empty product).

Adapter classes: "gpu", and "cpu" for software adapters (lavapipe, SwiftShader, WARP: wgpu's
adapter_type "CPU"). On those a workgroup runs on one thread, its invocations as SIMD lanes, and
a workgroup barrier or a shared-memory tree reduction costs far more than on a GPU, so their
variants keep each sum in one invocation. PTE_WGPU_KERNELS=cpu|gpu overrides the detected class
(the tests run both sets on any adapter).
"""

import os
from dataclasses import dataclass
from typing import Callable

GPU, CPU = "gpu", "cpu"
GPU_ONLY, CPU_ONLY, ANY = frozenset({GPU}), frozenset({CPU}), frozenset({GPU, CPU})


def adapter_class(adapter_type):
    """"cpu" or "gpu" for wgpu's adapter_type ("CPU", "DiscreteGPU", ...), or PTE_WGPU_KERNELS."""
    forced = os.environ.get("PTE_WGPU_KERNELS", "").strip().lower()
    if forced:
        if forced not in (GPU, CPU):
            raise ValueError(f"PTE_WGPU_KERNELS={forced!r}: expected 'cpu' or 'gpu'")
        return forced
    return CPU if str(adapter_type).strip().lower() == "cpu" else GPU


@dataclass(frozen=True)
class Variant:
    """`adapters`: the classes it is built for; `applies(shape)`: whether it runs at a live shape
    (a family's own shape record); `build(b, op)`: records its dispatches and returns a route with
    `set(ctx, shape, on)`, or None where this op has no such variant (a layout it does not take)."""

    name: str
    adapters: frozenset
    applies: Callable
    build: Callable


class Routes:
    """The variants of one op built for its adapter class, and the choice among them."""

    def __init__(self, table, b, op):
        built = ((v, v.build(b, op)) for v in table if b.adapter in v.adapters)
        self.built = [(v, route) for v, route in built if route is not None]

    def set(self, ctx, shape):
        """Turn on the first variant that applies to `shape` and off every other; its name, or None."""
        chosen = next((v for v, _ in self.built if v.applies(shape)), None)
        for v, route in self.built:
            route.set(ctx, shape, v is chosen)
        return chosen and chosen.name

    def route(self, name):
        """The built route of the variant called `name`."""
        return next(route for v, route in self.built if v.name == name)
