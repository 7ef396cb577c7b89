"""`python -m async_runtime bench`: tokens/s, resize overhead, CPU time split and concurrency on
tiny Llama exports, with torch eager and ExecuTorch's own runtime (XNNPACK) as baselines in the
same run.

Models: a directory (`--models DIR`) or a `.pte` (positional; its directory is searched for the
siblings) holding, by these names (missing ones make their rows "n/a"):

    llama_vulkan.pte          ExecuTorch's LLM export, Vulkan delegate, dynamic sequence length
    llama_vulkan_static.pte   the same model exported with enable_dynamic_shape=false ([1, 1] tokens)
    llama_xnnpack.pte         the same weights lowered to XNNPACK (ExecuTorch's pybindings run it)
    program.pt2               the ExportedProgram before lowering (torch eager runs its module)

Without either, a tiny Llama is exported once into a cache directory (`--cache-dir`, default
$PTE_WGPU_BENCH_CACHE or ~/.cache/pte-wgpu/bench) with ExecuTorch's `export_llm` CLI, the same way
tests/llama.py does (ExecuTorch is imported only then, in subprocesses).

Every number is the median of N runs (N=5; `--short`: 1 run, tiny sizes). Scenarios:
decode (one session), prefill at 32/128/512/2048 tokens (capped to the model's maximum), resize
overhead (static export vs the dynamic export at the same [1, 1] shape vs cycling small shapes,
with resize-hook calls per execute from `model.statistics()`), the CPU time of one execute split
into prepare / resize / stage / encode / submit / readback wait / read outputs (the bench wraps the
runtime's methods while it measures), and aggregate decode tokens/s of 1..32 concurrent sessions
with `batch_submits` on and off, and the streaming-kernel bandwidth of the project's elementwise,
copy and GEMV kernels as a share of the device's copy bandwidth (bench_streaming.py; `--short`:
tiny tensors). `--trace` adds GPU timestamp profiling (profile.py).
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import anyio
import numpy as np

from .llm_export import export_command, export_llm_args

FILES = {
    "vulkan": "llama_vulkan.pte",
    "static": "llama_vulkan_static.pte",
    "xnnpack": "llama_xnnpack.pte",
    "program": "program.pt2",
}
FULL = dict(
    runs=5, prompts=(32, 128, 512, 2048), decode_tokens=32, prompt0=8, sessions=(1, 2, 4, 8, 16, 32),
    resize_steps=32, llama=dict(dim=128, n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=256, max_len=2048),
)
SHORT = dict(
    runs=1, prompts=(8, 32), decode_tokens=4, prompt0=4, sessions=(1, 2, 4),
    resize_steps=4, llama=dict(dim=64, n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=256, max_len=64),
)
# map_submit: wgpu-py 0.32's `map_async("READ")` first submits an empty command buffer (its
# workaround for wgpu-native#305), synchronously, on the calling (event loop) thread.
SPLIT_PARTS = ("prepare", "resize", "stage", "encode", "submit", "map_submit", "readback_wait", "read_outputs")


# --- exporting: a tiny Llama through ExecuTorch's export_llm (async_runtime/llm_export.py) ------
_WRITE_MODEL = textwrap.dedent(
    """
    import json, sys, torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    out, params, max_len, seed, init_std = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    torch.manual_seed(seed)
    model = construct_transformer(ModelArgs(max_seq_len=max_len, max_context_len=max_len, **params))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.split(".")[-2]:
                p.fill_(1.0)
            else:
                p.normal_(0.0, init_std)
    torch.save({k: v.detach().clone() for k, v in model.named_parameters()}, out + "/ckpt.pth")
    json.dump(params, open(out + "/params.json", "w"))
    """
)


def llama_tag(cfg):
    return "d{dim}h{n_heads}kv{n_kv_heads}l{n_layers}v{vocab_size}m{max_len}".format(**cfg)


def export_llama(out_dir, cfg, which=("vulkan", "static", "xnnpack"), seed=0, init_std=0.02, log=print):
    """Export the missing files of `which` into out_dir (in parallel subprocesses); returns the
    seconds each took. Raises RuntimeError with the log tail when one fails."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = dict(cfg)
    max_len = cfg.pop("max_len")
    params = dict(cfg, multiple_of=32, norm_eps=1e-5)
    if not (out_dir / "ckpt.pth").exists():
        subprocess.run(
            [sys.executable, "-c", _WRITE_MODEL, str(out_dir), json.dumps(params), str(max_len), str(seed), str(init_std)],
            check=True, capture_output=True, text=True,
        )
    jobs = {}
    plan = {"vulkan": ("vulkan", True, str(out_dir / FILES["program"])), "static": ("vulkan", False, "-"), "xnnpack": ("xnnpack", True, "-")}
    for key in which:
        if (out_dir / FILES[key]).exists():
            continue
        backend, dynamic, pt2 = plan[key]
        overrides = export_llm_args(f"{out_dir}/params.json", f"{out_dir}/ckpt.pth", str(out_dir), FILES[key], max_len,
                                    backend=backend, dynamic=dynamic)
        args = export_command(overrides, pt2)
        logf = open(out_dir / f"export_{key}.log", "w")
        log(f"exporting {FILES[key]} ({llama_tag(dict(cfg, max_len=max_len))}) with ExecuTorch's export_llm ...")
        jobs[key] = (subprocess.Popen(args, cwd=out_dir, stdout=logf, stderr=subprocess.STDOUT), logf, time.perf_counter())
    seconds = {}
    for key, (proc, logf, t0) in jobs.items():
        rc = proc.wait()
        logf.close()
        seconds[key] = time.perf_counter() - t0
        if rc != 0 or not (out_dir / FILES[key]).exists():
            tail = (out_dir / f"export_{key}.log").read_text()[-4000:]
            raise RuntimeError(f"export of {FILES[key]} failed (rc={rc}):\n{tail}")
    return seconds


def find_models(args, cfg, log):
    """{key: path or None} for the FILES keys, exporting a tiny Llama into the cache if needed."""
    if args.pte:
        base = Path(args.pte).parent
        found = {k: (base / f if (base / f).exists() else None) for k, f in FILES.items()}
        found["vulkan"] = Path(args.pte)
        return found, {}
    base = Path(args.models) if args.models else Path(args.cache_dir) / f"llama_{llama_tag(cfg)}"
    seconds = {}
    if not args.models:
        which = [w for w in args.exports.split(",") if w]
        missing = [w for w in which if not (base / FILES[w]).exists()]
        if missing:
            try:
                import executorch  # noqa: F401
            except ImportError:
                raise SystemExit(
                    f"no models in {base} and ExecuTorch is not installed: pass --models DIR or a .pte "
                    "(pip install 'pte-wgpu[export]' to export one)"
                ) from None
            seconds = export_llama(base, cfg, missing, log=log)
    return {k: (base / f if (base / f).exists() else None) for k, f in FILES.items()}, seconds


# --- measuring --------------------------------------------------------------------------------
def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


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
        from .session import Session

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
                    t0 = time.perf_counter()

                    async def waiting():
                        try:
                            return await awaitable
                        finally:
                            totals[part] += time.perf_counter() - t0

                    return waiting()

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
    from .profile import Profiler

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


# --- baselines --------------------------------------------------------------------------------
def _sync_stream(fn):
    async def step(tokens, pos):
        return fn(tokens, pos)

    return LlamaStream(step)


def eager_baseline(models, p, prompts, n_dec, vocab, log):
    """torch eager on program.pt2's module: CPU always, CUDA too when torch has it."""
    if not models.get("program"):
        return {"cpu": {"error": "no program.pt2"}}
    try:
        import torch

        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  llama::sdpa_with_kv_cache
        try:
            import torchao.quantization  # noqa: F401
        except ImportError:
            pass
        program = torch.export.load(str(models["program"]))
    except Exception as e:  # torch, ExecuTorch's custom ops or the file missing
        return {"cpu": {"error": f"{type(e).__name__}: {e}"}}
    out = {}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        log(f"torch eager ({dev})")
        try:
            module = program.module().to(dev)

            def fn(tokens, pos, module=module, dev=dev):
                with torch.no_grad():
                    o = module(torch.from_numpy(tokens).to(dev), {"input_pos": torch.tensor([pos], device=dev)})
                o = o[0] if isinstance(o, (tuple, list)) else o
                return o.float().cpu().numpy().reshape(-1)

            out[dev] = _run_baseline(_sync_stream(fn), p, prompts, n_dec, vocab)
        except Exception as e:
            out[dev] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out


def xnnpack_baseline(models, p, prompts, n_dec, vocab, log):
    if not models.get("xnnpack"):
        return {"error": "no llama_xnnpack.pte"}
    try:
        import torch

        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
        import executorch.kernels.quantized  # noqa: F401
        from executorch.extension.pybindings.portable_lib import _load_for_executorch

        module = _load_for_executorch(str(models["xnnpack"]))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    log("ExecuTorch runtime (XNNPACK)")

    def fn(tokens, pos):
        o = module.forward((torch.from_numpy(tokens), torch.tensor([pos], dtype=torch.int64)))
        return o[0].float().numpy().reshape(-1)

    try:
        return _run_baseline(_sync_stream(fn), p, prompts, n_dec, vocab)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def _run_baseline(stream, p, prompts, n_dec, vocab):
    async def main():
        rng = np.random.default_rng(0)
        dec = [await decode_rate(stream, rng, vocab, p["prompt0"], n_dec) for _ in range(p["runs"])]
        pre = await prefill_rates(stream, rng, vocab, prompts, p["runs"])
        return {"decode": dec, "prefill": pre}

    return anyio.run(main)


# --- report -----------------------------------------------------------------------------------
def summarize(raw):
    """Medians (and the raw runs) in one JSON-able dict."""
    w = raw["wgpu"]
    base = raw["baselines"]
    out = {"meta": raw["meta"], "models": raw["models"]}
    backends = {"wgpu": {"decode": w["decode"], "prefill": w["prefill"]}}
    for dev, r in base["eager"].items():
        backends[f"torch eager ({dev})"] = r
    backends["executorch xnnpack"] = base["xnnpack"]
    decode, prefill = {}, {}
    for name, r in backends.items():
        if r is None or "error" in r:
            decode[name] = None
            prefill[name] = {str(pp): None for pp in w["prompts"]}
            continue
        decode[name] = median(r["decode"])
        prefill[name] = {str(pp): median(r["prefill"][pp]) for pp in w["prompts"]}
    out["decode_tokens_per_s"] = decode
    out["prefill_tokens_per_s"] = prefill
    out["baseline_errors"] = {name: r["error"] for name, r in backends.items() if r and "error" in r}
    out["resize"] = {
        k: (None if v is None else v if "error" in v else dict(v, ms_per_execute=median(v["ms_per_execute"])))
        for k, v in w["resize"].items()
    }
    out["cpu_split_ms"] = w["split"]
    out["concurrency_tokens_per_s"] = {
        mode: {str(n): dict(r, tokens_per_s=median(r["tokens_per_s"])) for n, r in rows.items()}
        for mode, rows in w["concurrency"].items()
    }
    if "streaming" in w:
        out["streaming"] = w["streaming"]
    if "profile" in w:
        prof = dict(w["profile"])
        prof.pop("trace", None)
        out["profile"] = prof
    out["raw"] = {"wgpu": {k: w[k] for k in ("decode", "prefill", "concurrency")}, "baselines": base}
    return _jsonable(out)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    return x


def _fmt(x, digits=1):
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def _ratio(a, b):
    return "n/a" if a is None or b is None or not b else f"{a / b:.2f}x"


def markdown(s):
    m = s["meta"]
    lines = [
        f"# pte-wgpu bench ({'short' if m['short'] else 'full'}, median of {m['runs']} run(s))",
        "",
        f"- device: {m['device']}",
        f"- model: {m['model']}",
        f"- host: {m['host']}; wgpu {m['wgpu']}, torch {m.get('torch', 'n/a')}, executorch {m.get('executorch', 'n/a')}",
        "",
    ]
    names = list(s["decode_tokens_per_s"])
    others = [n for n in names if n != "wgpu"]
    head = "| scenario | " + " | ".join(names) + " | " + " | ".join(f"wgpu / {n}" for n in others) + " |"
    lines += ["## Tokens/s (one session)", "", head, "|" + " --- |" * (1 + len(names) + len(others))]

    def row(label, vals):
        w = vals.get("wgpu")
        return f"| {label} | " + " | ".join(_fmt(vals[n]) for n in names) + " | " + " | ".join(_ratio(w, vals[n]) for n in others) + " |"

    lines.append(row(f"decode ({s['meta']['decode_tokens']} tokens)", s["decode_tokens_per_s"]))
    for pp in s["meta"]["prompts"]:
        lines.append(row(f"prefill {pp}", {n: s["prefill_tokens_per_s"][n][str(pp)] for n in names}))
    for name, err in s["baseline_errors"].items():
        lines.append(f"\n{name}: n/a ({err.splitlines()[0][:200]})")
    lines += ["", "## Resize overhead", "", "| variant | ms / execute | hook calls / execute | resize events / execute |", "| --- | --- | --- | --- |"]
    for k, v in s["resize"].items():
        if v is None or "error" in v:
            lines.append(f"| {k} | n/a | n/a | n/a |")
        else:
            lines.append(f"| {k} | {_fmt(v['ms_per_execute'], 3)} | {_fmt(v['hook_calls_per_execute'])} | {_fmt(v['resize_events_per_execute'], 2)} |")
    lines += [
        "",
        "## CPU time per execute (ms; readback wait is time awaiting the map, not CPU)",
        "",
        "| step | " + " | ".join(SPLIT_PARTS) + " | other | execute |",
        "|" + " --- |" * (len(SPLIT_PARTS) + 3),
    ]
    for label, r in s["cpu_split_ms"].items():
        lines.append(f"| {label} | " + " | ".join(_fmt(r[p], 3) for p in SPLIT_PARTS + ("other", "execute")) + " |")
    lines += ["", "## Concurrency: aggregate decode tokens/s", "", "| sessions | batched | unbatched | batched / unbatched | submits / execute (batched) |", "| --- | --- | --- | --- | --- |"]
    c = s["concurrency_tokens_per_s"]
    for n in c["batched"]:
        b, u = c["batched"][n], c["unbatched"][n]
        lines.append(f"| {n} | {_fmt(b['tokens_per_s'])} | {_fmt(u['tokens_per_s'])} | {_ratio(b['tokens_per_s'], u['tokens_per_s'])} | {_fmt(b['submits_per_execute'], 2)} |")
    prof = s.get("profile")
    if prof:
        lines += ["", "## GPU profile (timestamp queries, one compute pass per dispatch)", ""]
        if not prof["supported"]:
            lines.append(prof["note"])
        else:
            lines.append(f"Timestamps in {prof['units']}; profiled steps run one pass per dispatch, so use shares, not totals.")
            for phase, rows in prof["ops"].items():
                lines += [
                    "", f"### {phase}", "",
                    "| op | dispatches | total µs | mean µs | share | GB/s (bound tensors) |",
                    "| --- | --- | --- | --- | --- | --- |",
                ]
                for r in rows[:25]:
                    lines.append(
                        f"| {r['op']} | {r['count']} | {r['total_us']:.1f} | {r['mean_us']:.2f} | {100 * r['share']:.1f}% "
                        f"| {r['gb_per_s']:.1f} |"
                    )
    if s.get("streaming"):
        from .bench_streaming import markdown_lines

        lines += markdown_lines(s["streaming"])
    return "\n".join(lines) + "\n"


def plots(s, out_dir, log):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("--plots: matplotlib is not installed (pip install matplotlib); no plots written")
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    c = s["concurrency_tokens_per_s"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, rows in c.items():
        ns = [int(n) for n in rows]
        ax.plot(ns, [rows[str(n)]["tokens_per_s"] for n in ns], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sessions")
    ax.set_ylabel("aggregate decode tokens/s")
    ax.set_title(s["meta"]["device"][:60], fontsize=8)
    ax.legend()
    fig.tight_layout()
    path = out_dir / "concurrency.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    prof = s.get("profile")
    if prof and prof.get("supported"):
        for phase, rows in prof["ops"].items():
            rows = rows[:20]
            if not rows:
                continue
            fig, ax = plt.subplots(figsize=(7, 0.3 * len(rows) + 1.2))
            ax.barh([r["op"] for r in rows][::-1], [r["total_us"] for r in rows][::-1])
            ax.set_xlabel(f"GPU µs ({phase}, one pass per dispatch)")
            fig.tight_layout()
            path = out_dir / f"ops_{phase}.png"
            fig.savefig(path, dpi=120)
            plt.close(fig)
            written.append(path)
    return written


# --- command ----------------------------------------------------------------------------------
def add_arguments(p):
    p.add_argument("pte", nargs="?", help="a Llama .pte (Vulkan delegate, dynamic); siblings named as in FILES are used too")
    p.add_argument("--models", metavar="DIR", help="a directory with llama_vulkan.pte [, llama_vulkan_static.pte, llama_xnnpack.pte, program.pt2]")
    p.add_argument("--short", action="store_true", help="1 run and tiny sizes (a smoke test; numbers are not meaningful)")
    p.add_argument("--runs", type=int, help="runs per measurement (the median is reported); default 5, 1 with --short")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the markdown tables here too (they are always printed)")
    p.add_argument("--trace", metavar="FILE", help="profile with GPU timestamps: a Chrome/Perfetto trace here, a per-op table in the outputs")
    p.add_argument("--plots", metavar="DIR", help="PNG plots (needs matplotlib)")
    p.add_argument(
        "--cache-dir",
        default=os.environ.get("PTE_WGPU_BENCH_CACHE") or str(Path.home() / ".cache" / "pte-wgpu" / "bench"),
        help="where the default tiny Llama is exported (default $PTE_WGPU_BENCH_CACHE or ~/.cache/pte-wgpu/bench)",
    )
    p.add_argument(
        "--exports", default="vulkan,static,xnnpack",
        help="which default models to export when missing (comma list of vulkan,static,xnnpack; vulkan is always needed)",
    )
    p.add_argument("--no-baselines", action="store_true", help="skip torch eager and the ExecuTorch runtime")
    p.add_argument("--no-streaming", action="store_true", help="skip the streaming-kernel bandwidth scenario (bench_streaming.py)")


def _versions():
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("wgpu", "torch", "executorch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "n/a"
    return out


def run(args):
    log = lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    p = dict(SHORT if args.short else FULL)
    if args.runs:
        p["runs"] = args.runs
    # before any adapter is requested in this process: resolves then come out in ns
    from .profile import enable_timestamp_normalization

    units = enable_timestamp_normalization()
    if "vulkan" not in args.exports.split(","):
        args.exports = "vulkan," + args.exports
    models, export_seconds = find_models(args, p["llama"], log)
    if not models.get("vulkan") or not Path(models["vulkan"]).exists():
        raise SystemExit("bench: no Vulkan .pte to run")
    t0 = time.perf_counter()
    w = anyio.run(wgpu_scenarios, models, p, log, units if args.trace else None)
    if not args.no_streaming:
        from . import bench_streaming as bs

        w["streaming"] = anyio.run(bs.measure, bs.SHORT if args.short else bs.FULL, p["runs"], units, log)
    baselines = {"eager": {"cpu": {"error": "skipped (--no-baselines)"}}, "xnnpack": {"error": "skipped (--no-baselines)"}}
    if not args.no_baselines:
        vocab = w["model"]["vocab"]
        baselines = {
            "eager": eager_baseline(models, p, w["prompts"], w["decode_tokens"], vocab, log),
            "xnnpack": xnnpack_baseline(models, p, w["prompts"], w["decode_tokens"], vocab, log),
        }
    versions = _versions()
    meta = dict(
        short=bool(args.short), runs=p["runs"], device=w["device"], device_features=w["device_features"],
        model=dict(w["model"], file=str(models["vulkan"]), config=p["llama"] if not (args.pte or args.models) else None),
        prompts=w["prompts"], decode_tokens=w["decode_tokens"], prompt0=p["prompt0"], sessions=list(p["sessions"]),
        host=f"{platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()})",
        bench_seconds=time.perf_counter() - t0, export_seconds=export_seconds, **versions,
    )
    summary = summarize({"meta": meta, "models": models, "wgpu": w, "baselines": baselines})
    md = markdown(summary)
    print(md)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(md)
    if args.trace:
        trace = w.get("profile", {}).get("trace") or {"traceEvents": [], "otherData": {"note": "no timestamp-query on this adapter"}}
        Path(args.trace).write_text(json.dumps(trace))
    if args.plots:
        for path in plots(summary, args.plots, log):
            log(f"wrote {path}")
    return 0
