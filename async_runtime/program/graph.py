"""Links a method and its Vulkan delegates into one graph: one value table, one op chain.

Delegate inputs and outputs become the method's own values, so the delegates and the ops between
them run as one GPU plan. Values inside a delegate get fresh ids. The delegates' own memory plans
(`mem_obj_id`) are not used: `planning` plans the whole linked program at once.
"""

import math
from dataclasses import dataclass, field, replace

from pte_wgpu.kernels import OPS
from pte_wgpu.kernels.tensor.shape import MEMORY_VIEW
from pte_wgpu.kernels.wgsl import elem_bytes
from pte_wgpu.resize.values import NONE, Scalar, SymInt, Tensor, ValueList

from ..errors import ModelFormatError, UnsupportedOperatorError
from .pte import DelegateCall, FreeCall, JumpFalseCall, KernelCall, MoveCall
from .vkgraph import read_vkgraph

DELEGATE_ID = "VulkanBackend"
PREPACK = "et_vk.prepack.default"  # a delegate's copy of a constant into a tensor of its own
COPY_INTO = "aten::copy_"  # a program's write into one of its mutable buffers
SLICE_SCATTER = ("aten::slice_scatter.out", "aten.slice_scatter.default")
MAX_BINDING = 2**32 - 1  # WebGPU's maxStorageBufferBindingSize is at most this (u32 in wgpu)


@dataclass
class Graph:
    values: list
    inputs: tuple
    outputs: tuple
    calls: list  # (operator name, args) in execution order; output(s) last
    delegate_ops: list = field(default_factory=list)  # names of ops inside delegates, with repeats
    kernel_ops: list = field(default_factory=list)  # names of ops outside delegates
    compile_specs: list = field(default_factory=list)
    # filled by the op build:
    params: list = field(default_factory=list)
    dispatches: list = field(default_factory=list)

    def missing_ops(self):
        return sorted({name for name, _ in self.calls if name not in OPS})


def link(method, check=True):
    """The linked graph; with `check`, UnsupportedOperatorError lists every op without a kernel."""
    values = list(method.values)
    calls = []
    g = Graph(values, method.inputs, method.outputs, calls)
    for k, ins in enumerate(method.instructions):
        if isinstance(ins, DelegateCall):
            _link_delegate(g, method.delegates[ins.delegate], ins.args, k)
        elif isinstance(ins, KernelCall):
            args = ins.args
            if len(args) >= 2 and args[-1] == args[-2]:  # the out variant returns its out argument
                args = args[:-1]
            calls.append((ins.op, args))
            g.kernel_ops.append(ins.op)
            _live_ints(g, args)
        elif isinstance(ins, MoveCall):
            calls.append(("move", (ins.src, ins.dst)))
        elif isinstance(ins, JumpFalseCall):
            calls.append(("control flow (JumpFalseCall)", ()))
        elif isinstance(ins, FreeCall):
            continue
    _memory_views(g, method.allocations)
    _read_live_states(g)
    _index_put_in_place(g)
    _check_values(g)
    missing = g.missing_ops()
    if check and missing:
        raise UnsupportedOperatorError(missing)
    return g


def _live_ints(g, args):
    """An Int that an instruction outside the delegates writes (its last argument: sym_size's, a prim
    op's) is a SymInt: live, and read by the ops after it (the file holds its value at export). A
    missing or out-of-range id is left to the op's build to refuse."""
    if args and 0 <= args[-1] < len(g.values):
        v = g.values[args[-1]]
        if isinstance(v, Scalar) and type(v.value) in (int, bool):
            g.values[args[-1]] = SymInt(int(v.value))


def widen_half(graph):
    """Store every float16 tensor as float32: for a device without `shader-f16`, an op without an
    f16 kernel, or `load(precision="f32")`. The file's bytes stay float16 (`storage.to_storage`
    widens them) and so do the method's inputs and outputs (`Model.inputs`, `Model.outputs`)."""
    for vid, v in enumerate(graph.values):
        if isinstance(v, Tensor) and v.dtype == "float16":
            graph.values[vid] = replace(v, dtype="float32")


PRECISIONS = ("auto", "f16-sums", "f32")  # load()'s precision: how float16 tensors are stored and summed


def has_half(graph):
    return any(isinstance(v, Tensor) and v.dtype == "float16" for v in graph.values)


def _memory_views(g, allocations):
    """A tensor that no instruction writes, where memory planning gave it the bytes of another of
    its size (ExecuTorch folds a static view_copy outside the delegates into its base's memory),
    is that tensor's view: a memory_view from the one that last wrote those bytes goes in before
    its first reader (a copy that memory planning makes an alias when it can)."""
    writes, first_read = {}, {}
    for k, (_, args) in enumerate(g.calls):
        for n, a in enumerate(args):
            items = g.values[a].items if isinstance(g.values[a], ValueList) else (a,)
            for v in items:
                if n == len(args) - 1:
                    writes.setdefault(v, []).append(k)
                else:
                    first_read.setdefault(v, k)

    def nbytes(v):
        return math.prod(g.values[v].dims) * elem_bytes(g.values[v].dtype)

    views = []
    for t, at in allocations.items():
        if t in writes or t in g.inputs or g.values[t].constant is not None or (t not in first_read and t not in g.outputs):
            continue
        before = first_read.get(t, len(g.calls))
        last = {s: max([k for k in writes.get(s, ()) if k < before] + ([-1] if s in g.inputs else []), default=None)
                for s, other in allocations.items() if s != t and other == at and nbytes(s) == nbytes(t)}
        last = {s: k for s, k in last.items() if k is not None}
        if last:
            views.append((before, max(last, key=last.get), t))
    for before, base, t in sorted(views, reverse=True):
        g.calls.insert(before, (MEMORY_VIEW, (base, t)))


def _check_values(g):
    """What the op build relies on for every value: lists hold no lists (nor themselves), and every
    tensor fits the 4 GiB that a WebGPU storage binding can address at most (checked here, before
    anything is sized from it; the device's own, lower limit is checked at load)."""
    for vid, v in enumerate(g.values):
        if isinstance(v, ValueList):
            for item in v.items:
                if item != -1 and isinstance(g.values[item], ValueList):
                    raise ModelFormatError(f"value {vid}: a list whose item {item} is a list")
        elif isinstance(v, Tensor):
            nbytes = math.prod(v.dims) * elem_bytes(v.dtype)
            if nbytes > MAX_BINDING:
                raise ModelFormatError(
                    f"value {vid}: tensor {v.dtype}{list(v.dims)} needs {nbytes} bytes, more than any device binds"
                )


def _link_delegate(g, delegate, args, at):
    if delegate.backend != DELEGATE_ID:
        raise UnsupportedOperatorError([f"delegate backend {delegate.backend}"])
    vk = read_vkgraph(delegate.blob)
    g.compile_specs.append(delegate.compile_specs)
    n_in, n_out = len(vk.inputs), len(vk.outputs)
    written_back = _written_back(vk, n_in + n_out - len(args)) if len(args) < n_in + n_out else {}
    outputs = [o for o in vk.outputs if o not in written_back]
    if len(args) > n_in + len(outputs):  # inputs the graph dropped unread (n_out > 0: the outputs are the last arguments)
        cut = len(args) - len(outputs)
        args = (_inputs_taken(g, vk, args[:cut]) or args[:cut]) + tuple(args[cut:])
    if len(args) != n_in + len(outputs):
        def listed(ids):
            return ", ".join(f"{v.dtype}{list(v.dims)}" if isinstance(v, Tensor) else type(v).__name__ for v in (vk.values[i] for i in ids))
        why = (
            "an output without an argument is a result the program never reads, and these are not each the new value of "
            "a state tensor of the delegate" if len(args) < n_in + n_out else
            "the program passes values the delegate's graph does not take, and the graph's inputs do not match a part of them in order"
        )
        raise ModelFormatError(
            f"instruction {at}: delegate call has {len(args)} arguments, its graph has {n_in} inputs ({listed(vk.inputs)}) "
            f"and {n_out} outputs ({listed(vk.outputs)}); {why}"
        )
    mapping = dict(zip(outputs, args[n_in:]))
    mapping.update(zip(vk.inputs, args[:n_in]))  # an input that is also an output stays the input
    for local, value in enumerate(vk.values):
        if local in mapping:
            outer = mapping[local]
            _merge_boundary(g, outer, value, at)
            continue
        mapping[local] = len(g.values)
        g.values.append(value)
    for local, value in enumerate(vk.values):
        if isinstance(value, ValueList) and local not in vk.inputs + vk.outputs:
            g.values[mapping[local]] = ValueList(tuple(mapping[i] for i in value.items))
    for call in vk.chain:
        g.calls.append((call.name, tuple(mapping[a] for a in call.args)))
        g.delegate_ops.append(call.name)
    for k, local in enumerate(outputs):
        if local in vk.inputs:  # a delegate that returns its input (a clone lowered away): copy it out
            g.calls.append(("move", (mapping[local], args[n_in + k])))
    for local, state in written_back.items():
        g.calls.append(("move", (mapping[local], mapping[state])))


def recurrent_states(graph):
    """The state tensors that a copy overwrites whole each call: copies of a constant (et_vk.prepack)
    that a delegate's output is written back into (_written_back), and a program's own mutable
    buffers that aten::copy_ writes (Qwen3.5's)."""
    copies = {args[1] for name, args in graph.calls if _copies_a_constant(graph.values, name, args)}
    return [args[1] for name, args in graph.calls if name == "move" and args[1] in copies] + [
        args[0] for name, args in graph.calls if name == COPY_INTO
    ]


def _read_live_states(g):
    """A program's mutable buffer (a non-constant tensor that aten::copy_ writes) that a delegate
    reads through a constant instead: ExecuTorch 1.5.1 lowers Qwen3.5's state reset (`state *=
    keep`, then scattered back into the buffer) with the buffer's initial value captured as a
    delegate constant, so every call would start from it. Where a slice_scatter into the buffer
    takes a value computed from a copy of a constant of the buffer's dims (et_vk.prepack, the
    nearest such), that copy reads the buffer instead."""
    buffers = {args[0] for name, args in g.calls if name == COPY_INTO and g.values[args[0]].constant is None}
    if not buffers:
        return
    producer = {}
    for k, (name, args) in enumerate(g.calls):
        for out in _items(g.values, args[-1]) if args else ():
            producer.setdefault(out, k)
    for name, args in list(g.calls):
        if name not in SLICE_SCATTER or args[0] not in buffers:
            continue
        buffer = g.values[args[0]]
        frontier, seen = [args[1]], set()
        while frontier:
            copy = next((k for v in frontier if (k := producer.get(v)) is not None and _copies_a_constant(g.values, *g.calls[k], like=buffer)), None)
            if copy is not None:
                g.calls[copy] = ("move", (args[0], g.calls[copy][1][1]))
                break
            seen |= set(frontier)
            frontier = [a for v in frontier if v in producer for arg in g.calls[producer[v]][1][:-1] for a in _items(g.values, arg) if a not in seen]


def _index_put_in_place(g):
    """A program's mutable buffer updated at some indices, `buffer[..., pos] = new` exported without
    ExecuTorch's reinplace pass: index_put.out copies the whole buffer with the update into a tensor
    that aten::copy_ then copies whole back into the buffer (a KV cache: twice its size a step). Where
    nothing else touches the buffer from the index_put to the copy, nothing writes it or the result after, and the
    result is read only by the calls after (not a list, not an output), the index_put writes the
    buffer in place (index_put_), those calls read the buffer, and the write-back copies the buffer
    onto itself (nothing to run; the buffer stays a recurrent state)."""
    listed = {i for v in g.values if isinstance(v, ValueList) for i in v.items}
    for k, (name, args) in enumerate(g.calls):
        if name != "aten::index_put.out" or len(args) != 5:
            continue
        buffer, result = args[0], args[-1]
        back = next((j for j in range(k + 1, len(g.calls)) if g.calls[j][0] == COPY_INTO and g.calls[j][1][:2] == (buffer, result)), None)
        if back is None or result in listed or result in g.outputs or not _same_tensor(g.values[buffer], g.values[result]):
            continue
        between, after = g.calls[k + 1 : back], g.calls[back + 1 :]
        if any(buffer in {i for a in other for i in _items(g.values, a)} or other[-1:] == (result,) for _, other in between):
            continue
        if any(other[-1:] in ((buffer,), (result,)) for _, other in after):
            continue
        g.calls[k] = ("aten::index_put_", (*args[:-1], buffer))
        for j in range(k + 1, len(g.calls)):
            other = g.calls[j]
            g.calls[j] = (other[0], tuple(buffer if a == result else a for a in other[1]))


def _items(values, vid):
    """The values a call's argument names: a list's items, or itself."""
    value = values[vid]
    return value.items if isinstance(value, ValueList) else (vid,)


def _copies_a_constant(values, name, args, like=None):
    """Whether call (name, args) copies a constant into a tensor of the delegate's (et_vk.prepack),
    one of the dtype and dims of `like` when given."""
    source = values[args[0]] if name == PREPACK else None
    return getattr(source, "constant", None) is not None and (like is None or _same_tensor(source, like))


def _inputs_taken(g, vk, passed):
    """The arguments of `passed` that a delegate's inputs take, when a call passes more than its
    graph has: ExecuTorch 1.5.1 leaves in a call (Qwen3.5's) values that the graph dropped unread,
    such as a state's old value beside its new one. Matched from the last argument back, each
    input to the nearest argument of its kind (a tensor of its dims, or a scalar), so where two
    fit, the later one (the new value) is taken. None when not every input finds one."""
    taken, j = [], len(passed)
    for local in reversed(vk.inputs):
        inner = vk.values[local]
        j -= 1
        while j >= 0 and not _fits(g.values[passed[j]], inner):
            j -= 1
        if j < 0:
            return None
        taken.append(passed[j])
    return tuple(reversed(taken))


def _fits(outer, inner):
    if isinstance(inner, Tensor):
        return isinstance(outer, Tensor) and tuple(outer.dims) == tuple(inner.dims)
    return not isinstance(outer, (Tensor, ValueList))


def _written_back(vk, missing):
    """{output: state} for a delegate's `missing` outputs that the program has no argument for,
    when each is the new value of a state tensor: a copy of a constant (et_vk.prepack) of its dtype
    and dims that the output is computed from, nearer than any other such copy. ExecuTorch 1.5.1
    lowers a buffer that the model overwrites each call (LFM2's short-convolution state,
    `conv_state.copy_(new)`) this way and drops the write-back; linking writes the output back
    into the state, as the model does. {} when they are not all such outputs."""
    states = [c.args[1] for c in vk.chain if _copies_a_constant(vk.values, c.name, c.args)]

    def hops_from(state):  # ops from the state to each value computed from it (an op's last argument is its result)
        hops = {state: 0}
        for call in vk.chain:
            reached = [hops[i] for a in call.args[:-1] for i in _items(vk.values, a) if i in hops]
            if reached:
                for out in _items(vk.values, call.args[-1]):
                    hops[out] = min(hops.get(out, math.inf), min(reached) + 1)
        return hops

    reach = {s: hops_from(s) for s in states}
    found = {}
    for out in vk.outputs:
        value = vk.values[out]
        near = sorted((reach[s][out], s) for s in states if out in reach[s] and out != s and _same_tensor(vk.values[s], value))
        if near and (len(near) == 1 or near[0][0] < near[1][0]):
            found[out] = near[0][1]
    return found if len(found) == missing and len(set(found.values())) == missing else {}


def _same_tensor(a, b):
    return isinstance(a, Tensor) and isinstance(b, Tensor) and (a.dtype, tuple(a.dims)) == (b.dtype, tuple(b.dims))


def _merge_boundary(g, outer, inner, at):
    """A delegate input/output meets the method's value: check they agree, keep the richer type."""
    current = g.values[outer]
    if isinstance(inner, Tensor):
        if not isinstance(current, Tensor) or tuple(current.dims) != tuple(inner.dims):
            raise ModelFormatError(
                f"instruction {at}: delegate tensor {inner.dims} does not match the method's value {outer} ({current})"
            )
    elif isinstance(inner, SymInt):
        if not (isinstance(current, Scalar) and isinstance(current.value, int)) and not isinstance(current, SymInt):
            raise ModelFormatError(f"instruction {at}: delegate SymInt meets value {outer} of type {current}")
        g.values[outer] = inner
    elif inner != NONE and type(inner) is not type(current):
        raise ModelFormatError(f"instruction {at}: delegate value {inner} meets {current}")
