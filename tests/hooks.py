"""One op's resize hook, run without a device: build the op into a bare graph and call its hook
at the live dims and SymInt values given."""

from pte_wgpu.kernels import build_node
from pte_wgpu.resize import LiveState, Plan, ResizeContext
from pte_wgpu.resize.values import Tensor


class Graph:
    """The parts of a loaded graph that `build_node` fills: values, parameters, dispatches."""

    def __init__(self):
        self.values, self.params, self.dispatches = [], [], []

    def add(self, v):
        self.values.append(v)
        return len(self.values) - 1


def resize(graph, name, args, live, symints=None):
    """Build op `name` over value ids `args`, run its hook with the tensors of `live` (id -> dims)
    at those dims, the others at their maximum; returns the live state."""
    node = build_node(graph, name, args)
    state = LiveState(len(graph.values), len(graph.params), len(graph.dispatches))
    for k, v in enumerate(graph.values):
        if isinstance(v, Tensor):
            state.dims[k] = v.dims
    for k, dims in live.items():
        state.dims[k] = dims
    state.symints.update(symints or {})
    node.hook(ResizeContext(Plan([node], graph.values), state))
    return state
