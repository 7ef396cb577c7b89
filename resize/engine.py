"""Live state of one stream and the topological resize sweep.

A `Plan` is the model's immutable list of `Node`s in topological order. Each node has a hook that
computes its outputs' live dims (and SymInts), its parameter bytes and its dispatch grids from its
inputs' live dims. A `LiveState` holds one session's values of all of those. `propagate_resize`
runs, in one ordered sweep, only the nodes whose inputs changed; it journals every write so a
failure leaves the previous state untouched.

A live shape keeps the tensor's rank and fits its buffer: its element count is at most that of the
maximum (exported) shape, as ExecuTorch's `resize_tensor` and Vulkan's `virtual_resize` allow.
A tensor of a node that is not capacity-safe (`Node.bounded`) also keeps each dim within its maximum.
"""

import heapq
from dataclasses import dataclass, field

import anyio

from .shapes import numel_of
from .values import ValueList

YIELD_EVERY = 64  # hooks run between checkpoints, so a large graph never starves the loop


class ResizeFailure(Exception):
    """Raised by the engine; the runtime turns it into its public ResizeError."""


class ShapeOverflow(ResizeFailure):
    """A live shape does not fit its tensor: the inputs are too large for the model (the runtime
    raises InputError)."""


@dataclass(frozen=True)
class Node:
    name: str
    hook: object  # hook(ctx) -> None
    reads: tuple  # value ids whose change triggers the hook (tensors and SymInts)
    writes: tuple  # value ids it may set
    data_dependent: bool = False  # reads host data (select_as_symint): runs whenever its input is fed
    bounded: tuple = ()  # tensor value ids whose every live dim must stay within its maximum for this op


@dataclass
class Plan:
    nodes: list
    values: list  # the value table (async_runtime.values objects), for hooks reading size lists
    consumers: dict = field(default_factory=dict)  # value id -> sorted node indexes reading it
    bounded: dict = field(default_factory=dict)  # value id -> the first node name that bounds its dims

    def __post_init__(self):
        consumers, bounded = {}, {}
        for i, node in enumerate(self.nodes):
            for v in node.reads:
                consumers.setdefault(v, []).append(i)
            for v in node.bounded:
                bounded.setdefault(v, node.name)
        self.consumers, self.bounded = consumers, bounded


class LiveState:
    """Live dims, SymInt values, parameter bytes and grids of one session."""

    def __init__(self, n_values, n_params, n_dispatches):
        self.dims = [None] * n_values
        self.symints = {}
        self.params = [b""] * n_params
        self.grids = [(0, 0, 0)] * n_dispatches

    def copy(self):
        other = LiveState(0, 0, 0)
        other.dims, other.symints = list(self.dims), dict(self.symints)
        other.params, other.grids = list(self.params), list(self.grids)
        return other


class ResizeContext:
    """What a hook sees. Every write is journaled and reported as changed only when it differs."""

    def __init__(self, plan, state, host=None):
        self.plan = plan
        self.state = state
        self.host = host or {}  # value id -> numpy array of host input data
        self.journal = []
        self.changed_values = set()
        self.recent = []  # values changed by the hook now running
        self.changed_params = set()
        self.changed_grids = set()
        self.hook_calls = 0

    # reads
    def dims(self, vid):
        d = self.state.dims[vid]
        if d is None:
            raise ResizeFailure(f"value {vid} is not a tensor")
        return d

    def numel(self, vid):
        return numel_of(self.dims(vid))

    def symint(self, vid):
        return self.state.symints[vid]

    def int_value(self, vid):
        """An Int fixed in the file or the live value of a SymInt."""
        if vid in self.state.symints:
            return self.state.symints[vid]
        return self.plan.values[vid].value

    def int_list(self, vid):
        """A size list with its SymInts resolved to their live values."""
        v = self.plan.values[vid]
        if isinstance(v, ValueList):
            return tuple(self.int_value(i) for i in v.items)
        return tuple(v.items)

    # writes
    def set_dims(self, vid, dims):
        dims = tuple(map(int, dims))
        old = self.state.dims[vid]
        if old == dims:
            return
        check_fits(dims, self.plan.values[vid].dims, self.plan.bounded.get(vid), f"value {vid}")
        self.journal.append(("dims", vid, old))
        self.state.dims[vid] = dims
        self.changed_values.add(vid)
        self.recent.append(vid)

    def set_symint(self, vid, value):
        value = int(value)
        old = self.state.symints.get(vid)
        if old == value:
            return
        self.journal.append(("symint", vid, old))
        self.state.symints[vid] = value
        self.changed_values.add(vid)
        self.recent.append(vid)

    def set_params(self, params, data):
        """`params` is the op's Params block (kernels.registry); `data` must fill it exactly."""
        data = bytes(data)
        if len(data) > params.size:
            raise ResizeFailure(f"{len(data)} parameter bytes overflow a {params.size}-byte block")
        data = data.ljust(params.size, b"\0")
        pid = params.index
        old = self.state.params[pid]
        if old == data:
            return
        self.journal.append(("params", pid, old))
        self.state.params[pid] = data
        self.changed_params.add(pid)

    def set_grid(self, did, grid):
        grid = tuple(map(int, grid))
        old = self.state.grids[did]
        if old == grid:
            return
        self.journal.append(("grid", did, old))
        self.state.grids[did] = grid
        self.changed_grids.add(did)

    def restore(self, known):
        """Take the state `known` that the hooks computed before for the same input dims (a
        LiveState copy): what differs from the current one is reported as changed, no hook runs."""
        s = self.state
        self.changed_params.update(i for i, (a, b) in enumerate(zip(s.params, known.params)) if a is not b and a != b)
        self.changed_grids.update(i for i, (a, b) in enumerate(zip(s.grids, known.grids)) if a != b)
        self.changed_values.update(i for i, (a, b) in enumerate(zip(s.dims, known.dims)) if a != b)
        s.dims[:], s.params[:], s.grids[:] = known.dims, known.params, known.grids
        s.symints = dict(known.symints)

    def rollback(self):
        s = self.state
        for kind, key, old in reversed(self.journal):
            if kind == "dims":
                s.dims[key] = old
            elif kind == "symint":
                if old is None:
                    s.symints.pop(key, None)
                else:
                    s.symints[key] = old
            elif kind == "params":
                s.params[key] = old
            else:
                s.grids[key] = old
        self.journal.clear()
        self.changed_values.clear()
        self.changed_params.clear()
        self.changed_grids.clear()


def check_fits(dims, limit, bounded_by, what):
    """Raise unless live `dims` fit a tensor of maximum shape `limit`: ResizeFailure for another rank
    or a dim below 1 (0 only where the maximum is 0); ShapeOverflow for more elements than the
    maximum, or where an op bounds it (`bounded_by`, its name) a dim above the maximum."""
    limit = tuple(limit)
    if len(dims) != len(limit):
        raise ResizeFailure(f"{what}: shape {list(dims)} has rank {len(dims)}, expected rank {len(limit)} (exported shape {list(limit)})")
    for k, (d, m) in enumerate(zip(dims, limit)):
        if d < 1 and not d == m == 0:
            raise ResizeFailure(f"{what}: dim {k} is {d}, expected at least 1 (shape {list(dims)})")
        if bounded_by is not None and d > m:
            raise ShapeOverflow(
                f"{what}: dim {k} is {d}, expected 1..{m} (shape {list(dims)}; {bounded_by} keeps every dim "
                f"within the exported maximum {list(limit)})"
            )
    if numel_of(dims) > numel_of(limit):
        raise ShapeOverflow(
            f"{what}: shape {list(dims)} has {numel_of(dims)} elements, its buffer holds {numel_of(limit)} "
            f"(exported shape {list(limit)})"
        )


def run_all(plan, ctx):
    """Run every hook once in order (the build, at maximum shapes)."""
    for node in plan.nodes:
        node.hook(ctx)


async def propagate_resize(plan, ctx, changed, fed=()):
    """Run, in topological order, every node whose inputs changed (`changed` value ids, plus the
    data-dependent nodes reading the inputs in `fed`). Cascades happen within the one sweep. A hook
    that changes a value whose readers already ran (a non-topological write) means the graph did
    not converge: everything is rolled back and ResizeFailure names the values."""
    pending = []
    queued = set()

    def enqueue(vid):
        for i in plan.consumers.get(vid, ()):
            if i not in queued:
                queued.add(i)
                heapq.heappush(pending, i)

    for vid in changed:
        enqueue(vid)
    for vid in fed:
        for i in plan.consumers.get(vid, ()):
            if plan.nodes[i].data_dependent and i not in queued:
                queued.add(i)
                heapq.heappush(pending, i)
    ctx.changed_values.update(changed)
    current, done = -1, 0
    try:
        while pending:
            current = heapq.heappop(pending)
            node = plan.nodes[current]
            ctx.recent.clear()
            try:
                node.hook(ctx)
            except ShapeOverflow as e:
                raise ShapeOverflow(f"{node.name}: {e}") from None
            ctx.hook_calls += 1
            late = []
            for vid in ctx.recent:
                if any(i <= current for i in plan.consumers.get(vid, ())):
                    late.append(vid)
                enqueue(vid)
            if late:
                raise ResizeFailure(
                    f"resize did not converge: {node.name} changed values {sorted(late)} after their readers ran"
                )
            done += 1
            if done % YIELD_EVERY == 0:
                await anyio.lowlevel.checkpoint()
    except BaseException:
        ctx.rollback()
        raise
