"""Graph rewrites that merge ops into one kernel where that is cheap and exact.

SiLU arrives decomposed (`aten.silu` is not in Vulkan's registry): s = sigmoid(a), g = a * s,
y = g * b. When s and g feed nothing else, the three become one `pte_wgpu.silu_mul` dispatch at
the place of the last multiply (b is often computed in between).
"""

from collections import Counter

from resize.values import ValueList

from .elementwise import add_elementwise
from .registry import op

SIGMOID = ("aten.sigmoid.default",)
MUL = ("aten.mul.Tensor",)


@op("pte_wgpu.silu_mul")
def silu_mul(b):
    add_elementwise(b, [0, 1], "a / (1.0 + exp(-a)) * b")


def _uses(graph):
    uses = Counter(graph.outputs)
    for _, args in graph.calls:
        for a in args[:-1]:
            uses[a] += 1
            if isinstance(graph.values[a], ValueList):
                uses.update(graph.values[a].items)
    return uses


def fuse(graph):
    """Rewrite `graph.calls` in place; returns how many patterns were fused."""
    uses = _uses(graph)
    producer = {args[-1]: i for i, (_, args) in enumerate(graph.calls) if args}
    calls, drop, fused = graph.calls, set(), 0
    for k, (name, args) in enumerate(calls):
        if name not in MUL or len(args) != 3:
            continue
        for g, other in ((args[0], args[1]), (args[1], args[0])):
            i = producer.get(g)
            if i is None or i in drop or calls[i][0] not in MUL or uses[g] != 1:
                continue
            ga, gb = calls[i][1][:2]
            for a, s in ((ga, gb), (gb, ga)):
                j = producer.get(s)
                if j is not None and j not in drop and calls[j][0] in SIGMOID and calls[j][1][0] == a and uses[s] == 1:
                    drop.update((i, j))
                    calls[k] = ("pte_wgpu.silu_mul", (a, other, args[-1]))
                    fused += 1
                    break
            else:
                continue
            break
    graph.calls[:] = [c for i, c in enumerate(calls) if i not in drop]
    return fused
