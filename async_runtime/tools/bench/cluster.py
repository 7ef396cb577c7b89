"""Aggregate decode tokens/s of the server on Ray Serve, one replica against several, in one call.

    python -m async_runtime.tools.bench.cluster MODEL.pte --tokenizer TOKENIZER.json [--replicas 1,2]
        [--streams 32,64] [--requests 4] [--max-tokens 64] [--max-sessions 32] [--rounds 3] [--json FILE]

For each replica count R, `python -m async_runtime serve MODEL --replicas R` runs as a child
process (a Ray cluster of its own; R = 0 is the single server without Ray), and for each number of
streams N, the serving bench's clients (`tools/bench/serving.py`, in a process of their own) open
N streams, each posting `--requests` streamed `/v1/completions` one after the other (greedy,
`ignore_eos`: `--max-tokens` tokens each). Tokens/s is the tokens generated over the wall time of a
round; the median of `--rounds` rounds is reported, and the ratio of each replica count to one.

What to expect: with S = `--max-sessions` per replica, R replicas can at most reach R times one
replica's tokens/s at the same per-replica batch. At N = S streams, R replicas split the streams
into smaller batches (N / R each), whose GPU throughput is lower than a full batch's: the bound of
the ratio there is R * T(N / R) / T(N), with T one GPU's tokens/s at a batch size, not R.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

from .serving import client_command, client_report, free_port

HEALTH_WAIT_S = 600  # a Ray cluster starts, then every replica loads the model


def client_round(url, streams, requests, max_tokens, prompt):
    """(tokens, seconds) of one round of the serving bench's clients against `url`."""
    result = subprocess.run(client_command(url, streams, requests, max_tokens, prompt), check=True, capture_output=True, text=True)
    return streams * requests * max_tokens, client_report(result.stdout)["seconds"]


def wait_healthy(url, server):
    import httpx

    deadline = time.monotonic() + HEALTH_WAIT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise TimeoutError(f"the server was not healthy within {HEALTH_WAIT_S} s")


def measure(args, replicas):
    """{streams: [tokens/s of each round]} for one server with `replicas` (0: no Ray)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "async_runtime", "serve", args.pte, "--tokenizer", args.tokenizer, "--port", str(port),
               "--max-sessions", str(args.max_sessions), "--max-waiting", str(4 * max(args.streams)),
               *(["--replicas", str(replicas)] if replicas else [])]
    with open(f"{args.logs}_{replicas}.log", "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, server)
            client_round(url, min(args.streams), 1, args.max_tokens, args.prompt)  # every replica warm
            rates = {n: [] for n in args.streams}
            for _ in range(args.rounds):
                for n in args.streams:
                    tokens, seconds = client_round(url, n, args.requests, args.max_tokens, args.prompt)
                    rates[n].append(tokens / seconds)
                    print(f"replicas={replicas} streams={n}: {tokens / seconds:.0f} tokens/s", flush=True)
            return rates
        finally:
            server.terminate()
            try:
                server.wait(120)
            except subprocess.TimeoutExpired:
                server.kill()
            if replicas:
                subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m async_runtime.tools.bench.cluster", description=__doc__.split("\n")[0])
    p.add_argument("pte")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--replicas", type=lambda v: [int(r) for r in v.split(",")], default=[1, 2], help="0: one server, no Ray")
    p.add_argument("--streams", type=lambda v: [int(n) for n in v.split(",")], default=[32, 64])
    p.add_argument("--requests", type=int, default=4, help="requests each stream makes, one after the other")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-sessions", type=int, default=32, help="each replica's batch")
    p.add_argument("--prompt", default="The history of the world")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--logs", default="cluster_bench", help="each server's output goes to PREFIX_<replicas>.log")
    p.add_argument("--json")
    args = p.parse_args(argv)
    rows = {r: measure(args, r) for r in args.replicas}
    medians = {r: {n: statistics.median(v) for n, v in rates.items()} for r, rates in rows.items()}
    base = medians.get(1)
    for r, by_n in medians.items():
        for n, rate in by_n.items():
            ratio = f", {rate / base[n]:.2f}x one replica" if base and r != 1 else ""
            print(f"replicas={r} streams={n}: median {rate:.0f} tokens/s{ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "json"}, "rounds": rows, "medians": medians}, f, indent=1)


if __name__ == "__main__":
    main()
