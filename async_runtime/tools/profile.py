"""GPU timestamp profiling: per-dispatch GPU time, a per-op table and a Chrome trace.

    enable_timestamp_normalization()         # before any adapter is requested (ns, not ticks)
    model = await ar.load(pte)
    profiler = Profiler(model)               # .supported is False without "timestamp-query"
    session.profiler = profiler              # that session's steps are now profiled
    await session.execute(...)
    await profiler.collect()                 # maps the resolved timestamps (after the steps ran)
    profiler.op_table(); profiler.chrome_trace()

While a profiler is attached, `Session._encode_commands` hands the encoding to `Profiler.encode`:
the same commands, but every dispatch in its own compute pass with `timestamp_writes` (begin and
end of the pass), one query set per step (more only past 2,048 dispatches), resolved into a
buffer and copied to a mapped readback buffer in the same command buffer. One pass per dispatch
costs more than the batched passes of a normal step (gpu-baseline.md: ~51 vs ~7 µs a tiny
dispatch on an H100), so profiled steps are slower than unprofiled ones: use the per-op shares
and the ordering, not the absolute step time. Buffer copies between dispatches are not timed.

`Profiler(model, whole_steps=True)` times real steps instead: the session's commands encoded as
they always are (many dispatches per pass), with timestamps at the beginning of a step's first
compute pass and the end of its last, so the table has one row, "step", whose mean is the GPU
time of a step as it runs unprofiled. Per-dispatch passes can mislead about the whole: on an
H100 they rated a 4-bit GEMV variant 18% faster at one decode row that made real steps 17%
slower (BENCHMARKS.md, "The 4-bit GEMV by row count").

Without the "timestamp-query" feature (some adapters; wgpu-native's lavapipe has it), `supported`
is False, `encode` is never reached (attach only when supported) and the tables are empty.
"""

import json
from collections import defaultdict

import numpy as np
import wgpu

from pte_wgpu.kernels.wgsl import elem_bytes
from pte_wgpu.resize.shapes import numel_of

from .. import backend

MAX_QUERIES = 4096  # WebGPU's limit on one query set
PAIRS_PER_SET = MAX_QUERIES // 2  # a dispatch's (begin, end)


def enable_timestamp_normalization():
    """Ask wgpu-native to resolve timestamps in nanoseconds (AutomaticTimestampNormalization).

    Must run before the process requests its first adapter (the instance is global). Returns
    "ns" when set, "ticks" when the instance already existed (timestamps are then raw ticks:
    1 ns on NVIDIA, lavapipe and most desktop Vulkan drivers, not on every GPU). Dawn resolves
    them in nanoseconds itself, and its instance keeps the runtime's toggles (backend.py)."""
    if backend.NAME == "dawn":
        return "ns"
    try:
        from wgpu.backends.wgpu_native.extras import set_instance_extras

        set_instance_extras(flags=["AutomaticTimestampNormalization"])
        return "ns"
    except Exception:
        return "ticks"


def _bound_bytes(model, session, dispatch):
    """Bytes of the tensors a dispatch binds, at the session's live shapes."""
    values, dims = model.graph.values, session.state.dims
    return sum(
        numel_of(dims[b]) * elem_bytes(values[b].dtype) for b in dispatch.bindings if isinstance(b, int) and dims[b] is not None
    )


class _Pending:
    __slots__ = ("step", "session", "ops", "query_sets", "resolve", "read", "count")


class Profiler:
    def __init__(self, model, units="ns", whole_steps=False):
        self.model = model
        self.whole_steps = whole_steps
        self.device = model.device
        self.supported = "timestamp-query" in model.device_info.features
        self.units = units
        self._pending = []
        self._steps = 0
        self.records = []  # (step, session id, dispatch id, op, begin, end) in timestamp units
        self.bytes = {}  # (step, dispatch id) -> bytes of its tensors at live shapes
        self.step_labels = {}

    def label_next_step(self, label):
        """Name the next profiled step (e.g. "prefill 128", "decode") in the trace."""
        self.step_labels[self._steps] = label

    # --- encoding (called from Session._encode_commands) -----------------------------------------
    def encode(self, session, encoder):
        if self.whole_steps:
            return self._encode_whole(session, encoder)
        graph, model = self.model.graph, self.model
        active = [
            (did, d, session.state.grids[did])
            for did, d in enumerate(graph.dispatches)
            if (all(session.state.grids[did]) if d.shader is not None else session.state.grids[did][0] and did not in model._aliased)
        ]
        n = sum(d.shader is not None for _, d, _ in active)
        query_sets = [
            self.device.create_query_set(type="timestamp", count=2 * min(PAIRS_PER_SET, n - k))
            for k in range(0, n, PAIRS_PER_SET)
        ]
        ops, k = [], 0
        for did, d, grid in active:
            if d.shader is not None:
                qs, j = query_sets[k // PAIRS_PER_SET], k % PAIRS_PER_SET
                compute = encoder.begin_compute_pass(
                    timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 2 * j, "end_of_pass_write_index": 2 * j + 1}
                )
                compute.set_pipeline(model._pipelines[d.shader])
                compute.set_bind_group(0, session._bind_groups[did])
                compute.dispatch_workgroups(*grid)
                compute.end()
                ops.append((did, d.op, _bound_bytes(model, session, d)))
                k += 1
            else:
                encoder.copy_buffer_to_buffer(session._buffer(d.src), 0, session._buffer(d.dst), 0, -(-grid[0] // 4) * 4)
        self._resolve(session, encoder, ops, query_sets, n)

    def _encode_whole(self, session, encoder):
        """The step's commands as the session encodes them unprofiled (`Session._encode_runs`), its
        first compute pass writing the beginning timestamp and its last the end one."""
        qs = self.device.create_query_set(type="timestamp", count=2)
        timed = session._encode_runs(encoder, qs)
        self._resolve(session, encoder, [(-1, "step", 0)] if timed else [], [qs] if timed else [], 1 if timed else 0)

    def _resolve(self, session, encoder, ops, query_sets, n):
        """Resolve the step's `n` timestamp pairs of `query_sets` (`ops`: what each pair timed) into
        a readback buffer that `collect` maps."""
        p = _Pending()
        p.step, p.session, p.ops, p.query_sets, p.count = self._steps, session.id, ops, query_sets, 2 * n
        self._steps += 1
        if n:
            nbytes = 8 * 2 * n
            usage = wgpu.BufferUsage
            p.resolve = self.device.create_buffer(size=nbytes, usage=usage.QUERY_RESOLVE | usage.COPY_SRC)
            p.read = self.device.create_buffer(size=nbytes, usage=usage.MAP_READ | usage.COPY_DST)
            offset = 0
            for qs, start in zip(query_sets, range(0, n, PAIRS_PER_SET)):
                count = 2 * min(PAIRS_PER_SET, n - start)
                encoder.resolve_query_set(qs, 0, count, p.resolve, offset)
                offset += 8 * count
            encoder.copy_buffer_to_buffer(p.resolve, 0, p.read, 0, nbytes)
            self._pending.append(p)

    # --- results ----------------------------------------------------------------------------------
    async def collect(self):
        """Read back the timestamps of every step encoded so far (call after those executes)."""
        pending, self._pending = self._pending, []
        for p in pending:
            await p.read.map_async("READ")
            ts = np.frombuffer(p.read.read_mapped(copy=True), np.uint64).astype(np.int64)
            p.read.unmap()
            for k, (did, op, nbytes) in enumerate(p.ops):
                self.records.append((p.step, p.session, did, op, int(ts[2 * k]), int(ts[2 * k + 1])))
                self.bytes[(p.step, did)] = nbytes
            for b in (p.read, p.resolve):
                b.destroy()
            for qs in p.query_sets:
                qs.destroy()

    def _scale_us(self):
        return 1e-3  # ns (or 1 ns ticks) -> µs

    def op_table(self, steps=None):
        """[{op, count, total_us, mean_us, share, bytes, gb_per_s}] over the collected steps (or
        `steps`), by total. `bytes` sums each dispatch's bound tensors at their live shapes (what a
        kernel reads and writes if it touches each once; a KV cache counts whole), so `gb_per_s`
        is the op family's achieved bandwidth by that measure."""
        scale = self._scale_us()
        total = defaultdict(float)
        count = defaultdict(int)
        moved = defaultdict(int)
        for step, _, did, op, b, e in self.records:
            if steps is not None and step not in steps:
                continue
            total[op] += max(e - b, 0) * scale
            count[op] += 1
            moved[op] += self.bytes.get((step, did), 0)
        grand = sum(total.values()) or 1.0
        rows = [
            dict(
                op=op, count=count[op], total_us=total[op], mean_us=total[op] / count[op], share=total[op] / grand,
                bytes=moved[op], gb_per_s=moved[op] / (total[op] * 1e3) if total[op] else 0.0,
            )
            for op in total
        ]
        return sorted(rows, key=lambda r: -r["total_us"])

    def steps_labelled(self, words):
        """The steps whose label is `words` or starts with them and a space ("run" takes "run 0",
        "rows1" does not take "rows16")."""
        return {s for s, label in self.step_labels.items() if label == words or label.startswith(words + " ")}

    def chrome_trace(self):
        """Trace Event Format (Perfetto / chrome://tracing): one complete ("X") event per dispatch
        on the session's track, one per step on a "steps" track; ts and dur in µs from the first
        timestamp."""
        if not self.records:
            return {"traceEvents": [], "displayTimeUnit": "ns", "otherData": {"units": self.units}}
        scale = self._scale_us()
        t0 = min(r[4] for r in self.records)
        events = [
            {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": f"GPU: {self.model.device_info.name}"}},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "steps"}},
        ]
        sessions = sorted({r[1] for r in self.records})
        for sid in sessions:
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": sid + 1, "args": {"name": f"session {sid} dispatches"}})
        spans = {}
        for step, sid, did, op, b, e in self.records:
            e = max(e, b)
            events.append(
                {
                    "name": op, "cat": "dispatch", "ph": "X", "pid": 0, "tid": sid + 1,
                    "ts": (b - t0) * scale, "dur": (e - b) * scale,
                    "args": {"dispatch": did, "step": step},
                }
            )
            lo, hi = spans.get(step, (b, e))
            spans[step] = (min(lo, b), max(hi, e))
        for step, (b, e) in sorted(spans.items()):
            events.append(
                {
                    "name": self.step_labels.get(step, f"step {step}"), "cat": "step", "ph": "X", "pid": 0, "tid": 0,
                    "ts": (b - t0) * scale, "dur": (e - b) * scale, "args": {"step": step},
                }
            )
        return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"units": self.units}}

    def write_trace(self, path):
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
