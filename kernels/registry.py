"""The op registry and the builder every op's build function receives.

An op module registers `build(b)` functions by name with `@op("aten.add.Tensor", ...)`. A build
function reads its arguments through the `OpBuilder`, declares parameter blocks, dispatches
(WGSL compute or buffer copies) and exactly one resize hook. The hook computes output live shapes,
parameter bytes and grids from the inputs' live shapes; the runtime calls it once at load (at the
maximum shapes) and again whenever an input of the op changes. Nothing here touches the GPU.

Live shapes follow ExecuTorch's capacity rule: a tensor may take any shape of its rank whose
element count fits its buffer. An op registered with `capacity=True` was checked to compute
everything from live dims; every other op keeps each dim of its tensors within the exported
maximum (`Node.bounded`), since its kernels or hooks may rely on that.
"""

from collections import Counter
from dataclasses import dataclass

from pte_wgpu.resize.engine import Node
from pte_wgpu.resize.values import Constant, Scalar, SymInt, Tensor, ValueList

from .variants import GPU
from .wgsl import PACKED, is_float, wgsl_type

OPS = {}


class HalfUnsupported(NotImplementedError):
    """An op met a float16 tensor but has no f16 kernel: the load widens the model to f32."""


def op(*names, half=False, capacity=False):
    """Register a build function under one or more operator names; `half`: its kernels read and
    write float16 tensors as f16 (every storage type from `wgsl.wgsl_type`, f32 arithmetic where
    precision needs it); `capacity`: its kernels, routes and hook take any live shape whose element
    count fits each tensor's buffer, a dim above its exported maximum included (nothing planned
    from the maximum dims)."""

    def register(fn):
        for name in names:
            if name in OPS:
                raise RuntimeError(f"operator {name} registered twice")
            OPS[name] = fn
        fn.half = half
        fn.capacity = capacity
        return fn

    return register


@dataclass(frozen=True)
class Params:
    """A per-session uniform block of `size` bytes (a multiple of 16) owned by one op."""

    index: int
    size: int


@dataclass(frozen=True)
class Dispatch:
    """A compute dispatch (`shader` set) or an in-graph buffer copy (`src`/`dst` set)."""

    op: str
    shader: str | None = None
    bindings: tuple = ()  # value ids and Params, in @binding order
    src: int | None = None
    dst: int | None = None


class OpBuilder:
    def __init__(self, graph, name, args, adapter=GPU, subgroups=False, merge_apart=False, int8_matrices=False, half_sums=False, f16_matrices=False,
                 batch_invariant=True):
        self.graph, self.name, self.args = graph, name, args
        self.adapter = adapter  # the adapter class whose kernel variants to build (kernels/variants.py)
        self.subgroups = subgroups  # the device has WebGPU's "subgroup" feature: variants may use it
        # workgroups' results are merged by a dispatch of its own, not by the last of them to arrive
        # (a storage barrier orders only its own workgroup's accesses: WGSL's rule, Dawn's compiler)
        self.merge_apart = merge_apart
        # int8 products on subgroup matrices (kernels/matmul/int8_matrix.py's INT8_MATRIX) may be built
        self.int8_matrices = int8_matrices
        # products of f16 operands may sum in f16 within a K step (kernels/matmul/gemm.py's HALF_TILES)
        self.half_sums = half_sums
        # f16 products on subgroup matrices (kernels/matmul/f16_matrix.py's F16_MATRIX) may be built
        self.f16_matrices = f16_matrices
        # a pass of up to routes.py's BITWISE_ROWS rows gives each row the bits it gets alone; without it
        # products with f16 matrices take them from fewer rows (routes.py's exact_rows)
        self.batch_invariant = batch_invariant
        self._hook = None
        self._extra_writes = []
        self._extra_reads = []

    # arguments
    def value(self, i):
        return self.graph.values[self.args[i]]

    def tensor(self, i):
        v = self.value(i)
        if not isinstance(v, Tensor):
            raise TypeError(f"{self.name}: argument {i} is {type(v).__name__}, expected a tensor")
        return v

    def is_tensor(self, i):
        return isinstance(self.value(i), Tensor)

    def scalar(self, i, default=None):
        v = self.value(i)
        if isinstance(v, Scalar):
            return default if v.value is None else v.value
        raise TypeError(f"{self.name}: argument {i} is {type(v).__name__}, expected a scalar")

    def is_none(self, i):
        v = self.value(i)
        return isinstance(v, Scalar) and v.value is None

    def flag(self, i):
        """A Bool argument that may be left off the end of the list (keepdim): False if absent."""
        return bool(self.scalar(i, False)) if i < len(self.args) - 1 else False

    def int_list(self, i):
        """An int list argument fixed in the file: an IntList in a delegate, a list of Int values
        outside one."""
        v = self.value(i)
        if isinstance(v, ValueList):
            return tuple(int(self.graph.values[k].value) for k in v.items)
        return tuple(v.items)

    @property
    def out(self):
        return self.args[-1]

    def outputs(self, n):
        """The `n` outputs of a multi-output op (its last argument, a ValueList)."""
        v = self.graph.values[self.out]
        if not isinstance(v, ValueList) or len(v.items) != n:
            self.fail(f"expected a list of {n} outputs")
        return list(v.items)

    # storage and errors
    def storage(self, vid, packed=True):
        """The WGSL storage type of value `vid` (f32, f16, i32, u32); `packed` False refuses 8-bit
        tensors, stored 4 a word, for kernels that read one element a storage word."""
        dtype = self.graph.values[vid].dtype
        if not packed and dtype in PACKED:
            self.fail(f"{dtype} tensors are not supported")
        return wgsl_type(dtype)

    def float_storage(self, *vids):
        """The storage types (f32 or f16) of the float tensors `vids`, for kernels that compute in
        f32 and convert at loads and stores; NotImplementedError naming the dtypes otherwise."""
        dtypes = [self.graph.values[v].dtype for v in vids]
        if not all(is_float(t) for t in dtypes):
            raise NotImplementedError(f"{self.name}: {', '.join(dtypes)} tensors, expected float ones")
        return [wgsl_type(t) for t in dtypes]

    def fail(self, msg):
        """Refuse the op's arguments or live shapes: ValueError naming the op (raised from None:
        the message says what was wrong, a caught error's own text included)."""
        raise ValueError(f"{self.name}: {msg}") from None

    # recording
    def params(self, size):
        size = -(-size // 16) * 16
        self.graph.params.append(size)
        return Params(len(self.graph.params) - 1, size)

    def dispatch(self, shader, bindings):
        self.graph.dispatches.append(Dispatch(self.name, shader=shader, bindings=tuple(bindings)))
        return len(self.graph.dispatches) - 1

    def copy(self, src, dst):
        self.graph.dispatches.append(Dispatch(self.name, src=src, dst=dst))
        return len(self.graph.dispatches) - 1

    def writes(self, vid):
        """Declare an in-place write to an input (a KV cache)."""
        self._extra_writes.append(vid)

    def reads(self, vid):
        """Declare a read of a value that is not an argument (the input of the op that made an
        argument, which a kernel reads in that op's place)."""
        self._extra_reads.append(vid)

    def scratch(self, dtype, numel):
        """A tensor of the op's own that its kernels write (split-K's partial sums, quantized
        words): a value of the op alone, so the memory planner lets ops share its memory."""
        vid = len(self.graph.values)
        self.graph.values.append(Tensor(dtype, (numel,)))
        self.writes(vid)
        return vid

    def arrival_counts(self, n):
        """`n` counters of workgroups' arrivals (wgsl.py's LAST_TO_ARRIVE), int32 zeros that the last
        to arrive sets back to 0: a state tensor (kept by each session, its initial contents a
        constant) that the op writes."""
        vid = len(self.graph.values)
        self.graph.values.append(Tensor("int32", (n,), constant=Constant(blob=bytes(4 * n), length=4 * n)))
        self.writes(vid)
        return vid

    def part(self, name, args):
        """A builder recording another op's routes as part of this one (a fused op): same graph,
        its writes this op's; its hook is not this op's (the caller runs it)."""
        sub = OpBuilder(self.graph, name, args, self.adapter, self.subgroups, self.merge_apart, half_sums=self.half_sums, f16_matrices=self.f16_matrices,
                        batch_invariant=self.batch_invariant)
        sub._extra_writes = self._extra_writes
        return sub

    def hook(self, fn, *more):
        """The op's resize hook: `fn`, then each of `more` (an op of several outputs, each resized by a
        hook of its own)."""
        if self._hook is not None:
            raise RuntimeError(f"{self.name}: one resize hook per op")
        self._hook = fn if not more else lambda ctx: [hook(ctx) for hook in (fn, *more)]


def build_node(graph, name, args, adapter=GPU, subgroups=False, merge_apart=False, int8_matrices=False, half_sums=False, f16_matrices=False,
               batch_invariant=True):
    """Build one op into `graph`, with the kernel variants of adapter class `adapter` (those that
    need subgroup operations only with `subgroups`, int8 subgroup matrices only with
    `int8_matrices`, f16 ones only with `f16_matrices`; merging workgroups' results in a dispatch of its own with `merge_apart`;
    products of f16 operands summing in f16 within a K step with `half_sums`; each row of a pass
    of up to BITWISE_ROWS rows computed as alone unless not `batch_invariant`), and return its
    resize-plan `Node`."""
    fn = OPS[name]
    values = graph.values
    if not getattr(fn, "half", False) and any(values[t].dtype == "float16" for t in _tensors(values, args)):
        raise HalfUnsupported(f"{name} has no f16 kernel")
    b = OpBuilder(graph, name, args, adapter, subgroups, merge_apart, int8_matrices, half_sums, f16_matrices, batch_invariant)
    fn(b)
    if b._hook is None:
        raise RuntimeError(f"{name} registered no resize hook")
    out = args[-1] if args else None
    outs = set(values[out].items) if out is not None and isinstance(values[out], ValueList) else {out}
    reads = []
    for a in args[:-1]:
        v = values[a]
        if isinstance(v, (Tensor, SymInt)) and a not in outs:
            reads.append(a)
        elif isinstance(v, ValueList):
            reads.extend(i for i in v.items if i >= 0 and isinstance(values[i], (Tensor, SymInt)))  # -1: None
    reads += b._extra_reads
    writes = tuple(outs - {None}) + tuple(b._extra_writes)
    bounded = () if getattr(fn, "capacity", False) else tuple(dict.fromkeys(_tensors(values, args)))
    return Node(
        name, b._hook, tuple(dict.fromkeys(reads)), writes, data_dependent=getattr(fn, "data_dependent", False), bounded=bounded
    )


def value_uses(graph, skip=()):
    """How many times each value is read: by the graph's outputs and its calls but those of `skip`
    (a list's items each time the list is)."""
    uses = Counter(graph.outputs)
    for i, (_, args) in enumerate(graph.calls):
        if i in skip:
            continue
        for a in args[:-1]:
            uses[a] += 1
            if isinstance(graph.values[a], ValueList):
                uses.update(graph.values[a].items)
    return uses


def _tensors(values, args):
    """The tensor value ids among `args`, list items included."""
    for a in args:
        v = values[a]
        if isinstance(v, Tensor):
            yield a
        elif isinstance(v, ValueList):
            yield from (i for i in v.items if i >= 0 and isinstance(values[i], Tensor))
