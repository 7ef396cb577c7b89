"""Host work of the serving path: the OpenAI-compatible server over HTTP against the engine alone.

    python -m async_runtime.tools.bench.serving MODEL.pte --tokenizer TOKENIZER.json [--streams 8,32,64]
        [--requests 4] [--max-tokens 64] [--prompt TEXT] [--no-stream] [--rounds 3] [--sampling default,chat]
        [--profile] [--json FILE]

`--tokenizer bytes` (the default) stands for a byte-level BPE of 256 byte tokens and one end token
(the tiny Llama test export's vocabulary of 257), run by the `tokenizers` package like a real one.

For each number of streams N, in one process and one model (loaded with `max_batch` >= N), in
alternating order for `--rounds` rounds:

- engine: N tasks each run `--requests` requests one after the other through
  `LocalEngine.stream` (a session each, the text pieces, stop strings, detokenization);
- server: `create_app` over the same model served by hypercorn on loopback, and N clients (httpx,
  in a child process so that their CPU time is not the server's) each posting `--requests`
  `/v1/completions` one after the other, streaming (reading every SSE event) unless `--no-stream`.

Every request is greedy with `ignore_eos`, so each generates `--max-tokens` tokens (or fills the
context). `--sampling` adds server runs of sampled requests in the same rounds (`default`: the
server's defaults, temperature 1; `chat`: temperature 0.8, top_p 0.95; a seed each), reported
with their ratio to the greedy server runs of the same rounds. Reported per run: tokens/s (tokens generated over the wall time of the run), the CPU
time of the event loop's thread per token (`time.thread_time`: the host work of the loop, without
the GPU driver's threads or the client's process), and tokens per GPU pass (how full the batches
were: `statistics().submits` counts a burst's passes). The figures to improve are the
server/engine ratios, taken from the same round. `--profile` adds one profiled engine run and one
profiled server run per N (cProfile of the loop thread, CPU time): the loop's CPU time per token
split by component, each built-in function counted with the component of its busiest caller.
"""

import argparse
import cProfile
import json
import os
import pstats
import socket
import statistics
import sys
import time

import anyio

PROMPT = "The history of the world"  # 5 tokens of SmolLM2's tokenizer
SAMPLING = {"greedy": {"temperature": 0}, "default": {}, "chat": {"temperature": 0.8, "top_p": 0.95}}  # request bodies' settings


def byte_tokenizer():
    """A `Tokenizer` over 256 byte tokens (GPT-2's byte-to-character map) and "<|end|>" as id 256."""
    from ...llm.tokenizer import Tokenizer, _build

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    tokens = [chars[b] for b in range(256)] + ["<|end|>"]
    return Tokenizer(_build(tokens, [], [256], False), eos_id=256)


def load_tokenizer(spec):
    from ...llm.tokenizer import Tokenizer

    return byte_tokenizer() if spec == "bytes" else Tokenizer.load(spec)


def settings_for(max_tokens):
    return dict(max_new_tokens=max_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=None, ignore_eos=True)


async def engine_run(engine, prompt, streams, requests, max_tokens):
    """(tokens, seconds, loop CPU seconds) of `streams` tasks running `requests` requests each."""
    tokens = 0

    async def client():
        nonlocal tokens
        for _ in range(requests):
            async for batch in engine.stream(prompt, settings_for(max_tokens), []):
                pass
            tokens += batch[-1].tokens

    cpu, t = time.thread_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(streams):
            tg.start_soon(client)
    return tokens, time.perf_counter() - t, time.thread_time() - cpu


def client_command(url, streams, requests, max_tokens, prompt, stream=True, sampling="greedy"):
    """The command line of a child process running `clients` against `url`."""
    return [sys.executable, "-m", "async_runtime.tools.bench.serving", "--client", url, "--streams", str(streams), "--requests", str(requests),
            "--max-tokens", str(max_tokens), "--prompt", prompt, "--sampling", sampling, *([] if stream else ["--no-stream"])]


def client_report(stdout):
    """The clients' report ({"seconds", "events", ...}) from their output; raises if a stream failed."""
    report = json.loads(stdout)
    if report["errors"]:
        raise RuntimeError(f"{report['errors']} streams failed: {report['first_error']}")
    return report


async def server_run(url, metrics, streams, requests, max_tokens, prompt, stream=True, profiler=None, sampling="greedy"):
    """(tokens, seconds, loop CPU seconds) of the child process's clients against the server."""
    generated = "pte_wgpu:generation_tokens_total"
    before = metrics.registry.get_sample_value(generated)
    cpu = time.thread_time()
    if profiler:
        profiler.enable()
    result = await anyio.run_process(client_command(url, streams, requests, max_tokens, prompt, stream, sampling), check=True)
    if profiler:
        profiler.disable()
    cpu = time.thread_time() - cpu
    report = client_report(result.stdout)
    return metrics.registry.get_sample_value(generated) - before, report["seconds"], cpu


async def clients(url, streams, requests, max_tokens, prompt, stream, sampling="greedy"):
    """The child process: N clients (streaming, or not); prints {"seconds", "events", "errors", ...}."""
    import httpx

    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream, **SAMPLING[sampling]}
    seeds = iter(range(1 << 30))
    events, errors, first_error = 0, 0, None
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        with anyio.fail_after(60):  # the server may be starting
            while True:
                try:
                    if (await client.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    await anyio.sleep(0.05)

        async def one():
            nonlocal events, errors, first_error
            for _ in range(requests):
                try:
                    request = body if sampling == "greedy" else dict(body, seed=next(seeds))
                    if not stream:
                        r = await client.post("/v1/completions", json=request)
                        r.raise_for_status()
                        events += len(r.json()["choices"])
                        continue
                    async with client.stream("POST", "/v1/completions", json=request) as r:
                        r.raise_for_status()
                        done = False
                        async for line in r.aiter_lines():
                            if line.startswith("data: {"):
                                json.loads(line[6:])
                                events += 1
                            done = done or line == "data: [DONE]"
                        if not done:
                            raise RuntimeError("the stream ended without [DONE]")
                except Exception as e:
                    errors += 1
                    first_error = first_error or f"{type(e).__name__}: {e}"

        t = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(streams):
                tg.start_soon(one)
        seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds, "events": events, "errors": errors, "first_error": first_error}))


COMPONENTS = (  # (component, path fragments of its modules), first match wins
    ("engine (llm/engine, generate)", ("llm/engine.py", "llm/generate.py")),
    ("detokenize", ("llm/tokenizer.py", "tokenizers")),
    ("handler, JSON, SSE (llm/server)", ("llm/server.py", "json/")),
    ("metrics, middleware, log", ("llm/metrics.py", "llm/middleware.py", "prometheus_client", "logging/")),
    ("HTTP (hypercorn, h11, starlette)", ("hypercorn", "h11", "starlette")),
    ("runtime (sessions, batching, GPU)", ("async_runtime/", "resize/", "kernels/", "wgpu", "numpy")),
    ("event loop (asyncio, anyio)", ("asyncio/", "anyio/", "trio/", "selectors", "socket", "sniffio")),
)


def component_split(stats):
    """{component: seconds of own time}; built-ins go with the component that called them most."""
    def component(key):
        filename = key[0].replace(os.sep, "/") if key[0] != "~" else key[2]
        for name, parts in COMPONENTS:
            if any(p in filename for p in parts):
                return name
        return "other"

    def owner(key):
        for _ in range(8):  # a built-in called by built-ins: follow the busiest callers up
            callers = stats.stats[key][4]
            if key[0] != "~" or not callers:
                break
            key = max(callers, key=lambda c: callers[c][2])
        return key

    split = {}
    for key, (_, _, own, _, _) in stats.stats.items():
        name = component(owner(key))
        split[name] = split.get(name, 0.0) + own
    return split


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def measure(args):
    from ... import load
    from ...llm.engine import LocalEngine
    from ...llm.server import create_app, serve

    tokenizer = load_tokenizer(args.tokenizer)
    prompt = tokenizer.encode(args.prompt)
    streams = [int(n) for n in args.streams.split(",")]
    results = {}
    async with await load(args.pte, max_batch=max(max(streams), 32)) as model:
        for n in streams:
            engine = LocalEngine(model, tokenizer, max_sessions=n, max_waiting=n)
            app = create_app(model, tokenizer, max_sessions=n, max_waiting=n, max_tokens=args.max_tokens)
            port, stop = free_port(), anyio.Event()
            url = f"http://127.0.0.1:{port}"
            rows = {"engine": [], "server": [], **{f"server_{mode}": [] for mode in args.sampling}}
            async with anyio.create_task_group() as tg:
                tg.start_soon(serve, app, "127.0.0.1", port, stop.wait)
                await server_run(url, app.metrics, min(n, 4), 1, args.max_tokens, args.prompt, args.stream)  # up, warm
                await engine_run(engine, prompt, min(n, 4), 1, args.max_tokens)
                for r in range(args.rounds):
                    order = list(rows) if r % 2 == 0 else list(rows)[::-1]
                    for kind in order:
                        submits = model.statistics().submits
                        if kind == "engine":
                            run = await engine_run(engine, prompt, n, args.requests, args.max_tokens)
                        else:
                            mode = kind.removeprefix("server_") if kind != "server" else "greedy"
                            run = await server_run(url, app.metrics, n, args.requests, args.max_tokens, args.prompt, args.stream,
                                                   sampling=mode)
                        rows[kind].append((*run, model.statistics().submits - submits))
                profile = {}
                if args.profile:
                    for kind in ("engine", "server"):
                        profiler = cProfile.Profile(time.thread_time)  # CPU time of the loop thread, not waits
                        if kind == "engine":
                            profiler.enable()
                            tokens, _, _ = await engine_run(engine, prompt, n, args.requests, args.max_tokens)
                            profiler.disable()
                        else:
                            tokens, _, _ = await server_run(url, app.metrics, n, args.requests, args.max_tokens,
                                                            args.prompt, args.stream, profiler)
                        stats = pstats.Stats(profiler)
                        split = component_split(stats)
                        profile[kind] = {k: round(v / tokens * 1e6, 1) for k, v in sorted(split.items(), key=lambda kv: -kv[1])}
                        profile[kind]["total"] = round(sum(split.values()) / tokens * 1e6, 1)
                        if args.profile_dump:
                            stats.dump_stats(f"{args.profile_dump}_{kind}_{n}.prof")
                stop.set()
            results[n] = summarize(rows, profile)
            print(f"{n} streams: {json.dumps(results[n])}", flush=True)
    return results


def summarize(rows, profile):
    rate = {k: [t / s for t, s, _, _ in v] for k, v in rows.items()}
    cpu = {k: [c / t * 1e6 for t, _, c, _ in v] for k, v in rows.items()}
    batching = {k: [t / n for t, _, _, n in v] for k, v in rows.items()}
    out = {
        "engine_tokens_per_s": round(statistics.median(rate["engine"])),
        "server_tokens_per_s": round(statistics.median(rate["server"])),
        "server_over_engine": round(statistics.median(s / e for s, e in zip(rate["server"], rate["engine"])), 3),
        "engine_loop_cpu_us_per_token": round(statistics.median(cpu["engine"]), 1),
        "server_loop_cpu_us_per_token": round(statistics.median(cpu["server"]), 1),
        "engine_tokens_per_pass": round(statistics.median(batching["engine"]), 1),
        "server_tokens_per_pass": round(statistics.median(batching["server"]), 1),
        "server_loop_cpu_rounds": [round(c, 1) for c in cpu["server"]],
        "engine_loop_cpu_rounds": [round(c, 1) for c in cpu["engine"]],
    }
    for kind in rows:
        if kind.startswith("server_"):
            out[f"{kind}_tokens_per_s"] = round(statistics.median(rate[kind]))
            out[f"{kind.removeprefix('server_')}_over_greedy"] = round(statistics.median(
                s / g for s, g in zip(rate[kind], rate["server"])), 3)
    if profile:
        out["profile_us_per_token"] = profile
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m async_runtime.tools.bench.serving", description=__doc__.split("\n")[0])
    p.add_argument("pte", nargs="?")
    p.add_argument("--tokenizer", default="bytes", help="a tokenizer.json (Tokenizer.save's), or 'bytes'")
    p.add_argument("--streams", default="8,32,64")
    p.add_argument("--requests", type=int, default=4, help="requests each stream makes, one after the other")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--no-stream", dest="stream", action="store_false", help="the clients ask for whole answers")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sampling", default="", help="sampled server runs beside the greedy ones: default, chat (comma-separated)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-dump", help="also write each profile to PREFIX_<engine|server>_<N>.prof")
    p.add_argument("--json")
    p.add_argument("--client", help=argparse.SUPPRESS)  # the child process's role: the server's url
    args = p.parse_args(argv)
    if args.client:
        return anyio.run(clients, args.client, int(args.streams), args.requests, args.max_tokens, args.prompt, args.stream,
                         args.sampling or "greedy")
    if not args.pte:
        p.error("the .pte to serve is needed")
    args.sampling = [mode for mode in args.sampling.split(",") if mode]
    if any(mode not in SAMPLING or mode == "greedy" for mode in args.sampling):
        p.error(f"--sampling takes {', '.join(m for m in SAMPLING if m != 'greedy')}")
    results = anyio.run(measure, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
