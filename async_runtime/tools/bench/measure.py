"""The scenarios the bench times on this runtime: decode, prefill, resize, CPU split, concurrency, profile."""

import time
from contextlib import contextmanager

import anyio
import numpy as np

from .report import SPLIT_PARTS, median




# --- measuring --------------------------------------------------------------------------------
class LlamaStream:
    """One decoding stream: `await step(tokens [1, S] int64, pos) -> logits [vocab]`."""

    def __init__(self, step):
        self.step = step


def _tokens(rng, vocab, n):
    return rng.integers(0, vocab, (1, n)).astype(np.int64)


async def decode_rate(stream, rng, vocab, prompt0, n_tokens):
    """tokens/s of n_tokens greedy decode steps after an untimed prompt of prompt0 tokens."""
    logits = await stream.step(_tokens(rng, vocab, prompt0), 0)
    tok = int(np.argmax(logits))
    t0 = time.perf_counter()
    for i in range(n_tokens):
        logits = await stream.step(np.array([[tok]], np.int64), prompt0 + i)
        tok = int(np.argmax(logits))
    return n_tokens / (time.perf_counter() - t0)


async def prefill_rates(stream, rng, vocab, prompts, runs):
    """{prompt: [tokens/s per run]}; each run goes through the prompts in turn (so each execute
    changes the input shape, as a real prefill after decoding does)."""
    out = {p: [] for p in prompts}
    await stream.step(_tokens(rng, vocab, prompts[0]), 0)  # warm-up
    for _ in range(runs):
        for p in prompts:
            tokens = _tokens(rng, vocab, p)
            t0 = time.perf_counter()
            await stream.step(tokens, 0)
            out[p].append(p / (time.perf_counter() - t0))
    return out


def wgpu_stream(session):
    async def step(tokens, pos):
        (logits,) = await session.execute(tokens, np.array([pos], np.int64))
        return logits.reshape(-1)

    return LlamaStream(step)


class CpuSplit:
    """Wraps the runtime's per-execute methods with perf_counter while active; totals in seconds."""

    def __init__(self):
        self.totals = dict.fromkeys(SPLIT_PARTS + ("execute",), 0.0)
        self.executes = 0

    @contextmanager
    def active(self, model):
        from ...session import Session

        queue_cls = type(model.device.queue)
        buffer_cls = type(_engine(model, model._default)._staging)
        saved = []
        in_map = [False]

        def patch(cls, name, part, kind="sync"):
            orig = cls.__dict__[name]
            totals = self.totals

            if kind == "sync":
                def wrapper(*a, **k):
                    t0 = time.perf_counter()
                    try:
                        return orig(*a, **k)
                    finally:
                        totals["map_submit" if part == "submit" and in_map[0] else part] += time.perf_counter() - t0
            elif kind == "async":
                async def wrapper(*a, **k):
                    t0 = time.perf_counter()
                    try:
                        return await orig(*a, **k)
                    finally:
                        totals[part] += time.perf_counter() - t0
            else:  # returns an awaitable: time until it resolves
                def wrapper(*a, **k):
                    in_map[0] = True
                    try:
                        awaitable = orig(*a, **k)
                    finally:
                        in_map[0] = False
                    return _Resolved(awaitable, totals, part)

            saved.append((cls, name, orig))
            setattr(cls, name, wrapper)

        session_cls = type(model._default)  # Session, or BatchedSession whose passes run on a Session
        patch(session_cls, "_prepare", "prepare")
        patch(Session, "_propagate", "resize", "async")
        patch(Session, "_stage", "stage")
        patch(Session, "_encode", "encode")
        patch(queue_cls, "submit", "submit")
        patch(buffer_cls, "map_async", "readback_wait", "awaitable")
        patch(Session, "_read_outputs", "read_outputs")
        patch(session_cls, "execute", "execute", "async")
        try:
            yield self
        finally:
            for cls, name, orig in reversed(saved):
                setattr(cls, name, orig)

    def per_execute_ms(self, executes):
        row = {k: 1e3 * v / max(executes, 1) for k, v in self.totals.items()}
        row["other"] = row["execute"] - sum(row[p] for p in SPLIT_PARTS)
        return row


class _Resolved:
    """`awaitable` that adds the time until it resolves to totals[part]. Awaitable again after a
    cancelled await, as wgpu's promise is: the scheduler waits on a readback under a timeout and
    awaits it again (a coroutine wrapper failed there with "cannot reuse already awaited
    coroutine" when a readback outlasted the timeout)."""

    def __init__(self, awaitable, totals, part):
        self.awaitable, self.totals, self.part = awaitable, totals, part
        self.t0 = time.perf_counter()

    def __await__(self):
        result = yield from self.awaitable.__await__()
        self.totals[self.part] += time.perf_counter() - self.t0
        return result


def _engine(model, session):
    """The Session whose steps reach the GPU: the session itself, or the ragged batch's runner."""
    return session if model._batcher is None else model._batcher.runner


# --- wgpu scenarios ---------------------------------------------------------------------------
async def wgpu_scenarios(models, p, log, profile_units=None):
    import async_runtime as ar

    res = {}
    rng = np.random.default_rng(0)
    async with await ar.load(models["vulkan"]) as model:
        ins = model.inputs
        if not (len(ins) == 2 and ins[0].dtype.startswith("int") and len(ins[0].max_shape) == 2 and ins[1].max_shape == (1,)):
            raise SystemExit(
                f"bench: {models['vulkan']} does not look like an ExecuTorch Llama export "
                f"(tokens int [1, S], input_pos int [1]); its inputs: {model.describe_inputs()}"
            )
        vocab = model.outputs[0].max_shape[-1]
        max_prompt = model.inputs[0].max_shape[-1]
        max_len = max_prompt + 1
        prompts = sorted({min(x, max_prompt) for x in p["prompts"]})
        n_dec = max(1, min(p["decode_tokens"], max_len - p["prompt0"] - 1))
        res["device"] = model.device_info.name
        res["device_features"] = list(model.device_info.features)
        res["model"] = dict(vocab=vocab, max_prompt=max_prompt, dispatches=len(model.graph.dispatches), weights_bytes=model.memory())
        res["prompts"], res["decode_tokens"] = prompts, n_dec

        log("wgpu: decode, one session")
        stream = wgpu_stream(model._default)
        res["decode"] = [await decode_rate(stream, rng, vocab, p["prompt0"], n_dec) for _ in range(p["runs"])]
        log("wgpu: prefill")
        res["prefill"] = await prefill_rates(stream, rng, vocab, prompts, p["runs"])

        log("wgpu: CPU time split per execute")
        res["split"] = {}
        for label, tokens_of in (("decode", lambda i: 1), (f"prefill {prompts[-1]}", lambda i: prompts[-1])):
            runs = []
            for _ in range(p["runs"]):
                split = CpuSplit()
                await stream.step(_tokens(rng, vocab, p["prompt0"]), 0)
                with split.active(model):
                    for i in range(n_dec):
                        s = tokens_of(i)
                        pos = p["prompt0"] + i if s == 1 else 0
                        await stream.step(_tokens(rng, vocab, s), pos)
                runs.append(split.per_execute_ms(n_dec))
            res["split"][label] = {k: median([r[k] for r in runs]) for k in runs[0]}

        log("wgpu: resize overhead (dynamic export)")
        res["resize"] = {}
        res["resize"]["dynamic, fixed [1, 1]"] = await _resize_runs(model, rng, vocab, max_len, p, cycle=(1,))
        res["resize"]["dynamic, cycling 1..4"] = await _resize_runs(model, rng, vocab, max_len, p, cycle=(1, 2, 3, 4))

        if profile_units is not None:
            log("wgpu: GPU timestamp profile")
            res["profile"] = await _profile(model, rng, vocab, prompts, p, profile_units)

    if models.get("static"):
        log("wgpu: resize overhead (static export)")
        async with await ar.load(models["static"]) as smodel:
            if smodel.inputs[0].max_shape[-1] != 1:
                res["resize"]["static [1, 1]"] = {"error": f"static export takes {smodel.inputs[0].max_shape} tokens"}
            else:
                res["resize"]["static [1, 1]"] = await _resize_runs(smodel, rng, vocab, max_len, p, cycle=(1,))
    else:
        res["resize"]["static [1, 1]"] = None

    log("wgpu: concurrency")
    # both models loaded at once and measured alternately, so drifting host load hits both alike
    modes = {"batched": True, "unbatched": False}
    res["concurrency"] = {mode: {} for mode in modes}
    loaded = {mode: await ar.load(models["vulkan"], batch_submits=flag) for mode, flag in modes.items()}
    try:
        sessions = {mode: [await m.open_session() for _ in range(max(p["sessions"]))] for mode, m in loaded.items()}
        for n in p["sessions"]:
            rates = {mode: [] for mode in modes}
            submits = {mode: [] for mode in modes}
            for _ in range(p["runs"]):
                for mode, model in loaded.items():
                    before = model.statistics()
                    rates[mode].append(await _concurrent_decode(sessions[mode][:n], rng, vocab, p["prompt0"], n_dec))
                    after = model.statistics()
                    submits[mode].append((after.submits - before.submits) / max(after.executes - before.executes, 1))
            for mode in modes:
                res["concurrency"][mode][n] = {"tokens_per_s": rates[mode], "submits_per_execute": median(submits[mode])}
    finally:
        for model in loaded.values():
            await model.aclose()
    return res


async def _resize_runs(model, rng, vocab, max_len, p, cycle):
    """ms per execute and per-execute counters over resize_steps executes, cycling token counts."""
    session = await model.open_session()
    try:
        await session.execute(_tokens(rng, vocab, cycle[0]), np.array([0], np.int64))
        ms, hooks, events = [], [], []
        for _ in range(p["runs"]):
            before = session.statistics()
            pos, n = 1, p["resize_steps"]
            t0 = time.perf_counter()
            for i in range(n):
                s = cycle[(i + 1) % len(cycle)]
                if pos + s > max_len - 1:
                    pos = 0
                await session.execute(_tokens(rng, vocab, s), np.array([pos], np.int64))
                pos += s
            ms.append(1e3 * (time.perf_counter() - t0) / n)
            after = session.statistics()
            hooks.append((after.hook_calls - before.hook_calls) / n)
            events.append((after.resize_events - before.resize_events) / n)
        return {"ms_per_execute": ms, "hook_calls_per_execute": median(hooks), "resize_events_per_execute": median(events)}
    finally:
        await session.aclose()


async def _concurrent_decode(sessions, rng, vocab, prompt0, n_tokens):
    """Aggregate tokens/s: every session decodes n_tokens at once (prompts first, untimed)."""
    streams = [wgpu_stream(s) for s in sessions]
    first = {}

    async def prompt(i, st):
        first[i] = int(np.argmax(await st.step(_tokens(rng, vocab, prompt0), 0)))

    async with anyio.create_task_group() as tg:
        for i, st in enumerate(streams):
            tg.start_soon(prompt, i, st)

    async def decode(i, st):
        tok = first[i]
        for k in range(n_tokens):
            tok = int(np.argmax(await st.step(np.array([[tok]], np.int64), prompt0 + k)))

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i, st in enumerate(streams):
            tg.start_soon(decode, i, st)
    return len(sessions) * n_tokens / (time.perf_counter() - t0)


async def _profile(model, rng, vocab, prompts, p, units):
    from ..profile import Profiler

    profiler = Profiler(model, units)
    if not profiler.supported:
        return {"supported": False, "units": units, "note": "the adapter has no timestamp-query: no GPU profile"}
    session = await model.open_session()
    engine = _engine(model, session)
    engine.profiler = profiler
    try:
        stream = wgpu_stream(session)
        max_prompt = model.inputs[0].max_shape[-1]
        steps = min(8, max_prompt - 1)
        prompt = max(1, min(prompts[-1], max_prompt - steps))  # room for the decode steps after it
        profiler.label_next_step(f"prefill {prompt}")
        logits = await stream.step(_tokens(rng, vocab, prompt), 0)
        tok = int(np.argmax(logits))
        for i in range(steps):
            profiler.label_next_step("decode")
            tok = int(np.argmax(await stream.step(np.array([[tok]], np.int64), prompt + i)))
        await profiler.collect()
    finally:
        engine.profiler = None
        await session.aclose()
    gpu_us = {}
    for s in range(profiler._steps):
        spans = [(b, e) for st, _, _, _, b, e in profiler.records if st == s]
        if spans:
            gpu_us[s] = (max(e for _, e in spans) - min(b for b, _ in spans)) * 1e-3
    return {
        "supported": True,
        "units": units,
        "steps": {s: profiler.step_labels.get(s, "") for s in range(profiler._steps)},
        "step_span_us": gpu_us,
        "ops": {
            "prefill": profiler.op_table(profiler.steps_labelled("prefill")),
            "decode": profiler.op_table(profiler.steps_labelled("decode")),
        },
        "trace": profiler.chrome_trace(),
    }
