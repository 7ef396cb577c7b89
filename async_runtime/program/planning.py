"""Memory planning over the whole linked program, with copies turned into aliases.

ExecuTorch plans memory per delegate (`mem_obj_id`); linking the delegates into one plan lets us do
better: every flat copy (view, squeeze, unsqueeze, clone, prepack, a MoveCall) whose source is
never written again makes its output an alias of its source, so the copy is never dispatched.
Alias sets then share buffers greedily by lifetime, like ExecuTorch's greedy planner: two sets
share a buffer when no op lies in both lifetimes (an op's input and output never share).
"""

from dataclasses import dataclass

from pte_wgpu.kernels.wgsl import elem_bytes
from pte_wgpu.resize.shapes import numel_of
from pte_wgpu.resize.values import Tensor


@dataclass
class MemoryPlan:
    keys: dict  # tensor value id -> buffer key
    sizes: dict  # buffer key -> bytes
    aliased: frozenset  # copy dispatches that need not run


def carried_state(nodes):
    """Values an op writes after that op or an earlier one read them: what one call leaves for the
    next (KV caches written in place, a recurrent state written back)."""
    read, state = set(), set()
    for n in nodes:
        read |= set(n.reads)
        state |= {w for w in n.writes if w in read}
    return state


def read_first(nodes):
    """Values an op reads before any op has written them: inputs, constants, and a program's own
    mutable buffers (Qwen3.5's states, copied back with aten::copy_ after the ops that read them)."""
    written, first = set(), set()
    for n in nodes:
        first |= {r for r in n.reads if r not in written}
        written |= set(n.writes)
    return first


def plan_memory(graph, nodes, own):
    """`own`: value ids with buffers of their own (per-session inputs and state tensors)."""
    values = graph.values
    tensors = [vid for vid, v in enumerate(values) if isinstance(v, Tensor)]
    parent = {vid: vid for vid in tensors}

    def root(v):
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    carried = carried_state(nodes)
    aliased = set()
    for did, d in enumerate(graph.dispatches):
        if d.shader is not None:
            continue
        src, dst = d.src, d.dst
        if src in own or dst in own or src in carried or values[dst].constant is not None:
            continue
        parent[root(dst)] = root(src)
        aliased.add(did)

    end = len(nodes)
    first, last = {}, {}
    for i, node in enumerate(nodes):
        for w in node.writes:
            if w in parent:
                first.setdefault(root(w), i)
        for r in node.reads:
            if r in parent:
                last[root(r)] = i
    for vid in graph.outputs:
        if vid in parent:
            last[root(vid)] = end

    keys, sizes, buffers = {}, {}, []  # buffers: [size, [(start, stop), ...]]
    members = {}
    for vid in tensors:
        members.setdefault(root(vid), []).append(vid)
    planned = []
    for r, group in members.items():
        nbytes = max(numel_of(values[v].dims) * elem_bytes(values[v].dtype) for v in group)
        if values[r].constant is not None or r in own:
            key = ("value", r)
            sizes[key] = max(nbytes, 4)
            keys.update((v, key) for v in group)
        else:
            planned.append((nbytes, r, group))
    for nbytes, r, group in sorted(planned, key=lambda p: (-p[0], p[1])):
        if r not in first and r not in last:
            continue  # nothing reads or writes it (an intermediate that fusion removed)
        span = (first.get(r, 0), last.get(r, first.get(r, 0)))
        for index, (size, spans) in enumerate(buffers):
            if all(span[1] < a or b < span[0] for a, b in spans):
                break
        else:
            index = len(buffers)
            buffers.append([0, []])
        buffers[index][0] = max(buffers[index][0], nbytes, 4)
        buffers[index][1].append(span)
        keys.update((v, ("planned", index)) for v in group)
    sizes.update((("planned", i), size) for i, (size, _) in enumerate(buffers))
    return MemoryPlan(keys, sizes, frozenset(aliased))
