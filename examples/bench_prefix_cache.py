"""Time to first token with the prefix cache: requests of one system prompt and a user message of
their own, one at a time, as a chat server sees them.

    python examples/bench_prefix_cache.py MODEL.pte [--system 1024] [--user 32] [--requests 6]

Prints the first request's time to first token (its system prompt computed), the median of the
later ones' (its whole blocks shared from the cache), their ratio, and the median of requests
whose system prompt is new each time (nothing to share); then checks that a cached request's
greedy tokens are those of the same prompt on a model that has seen nothing before.
"""

import argparse
import statistics
import time

import anyio
import numpy as np

import async_runtime as ar


async def first_token(model, prompt, tokens=1):
    """(seconds to the first token, the first `tokens` greedy tokens) of `prompt` on a new session."""
    t0, got, first = time.perf_counter(), [], None
    async with model.session() as s:
        async for token in ar.generate(s, prompt.tolist(), max_new_tokens=tokens):
            first = first or time.perf_counter() - t0
            got.append(token)
    return first, got


async def main(args):
    rng = np.random.default_rng(0)
    async with await ar.load(args.pte) as model:
        vocab = model.outputs[0].max_shape[-1]
        system = rng.integers(0, vocab, args.system)
        users = [rng.integers(0, vocab, args.user) for _ in range(args.requests)]
        await first_token(model, rng.integers(0, vocab, args.system + args.user))  # warm: shapes of a long prompt
        shared = [(await first_token(model, np.concatenate([system, u])))[0] for u in users]
        fresh = [(await first_token(model, rng.integers(0, vocab, args.system + args.user)))[0] for _ in users]
        _, cached_tokens = await first_token(model, np.concatenate([system, users[-1]]), 8)
        stats = model.statistics()
    async with await ar.load(args.pte) as model:
        _, uncached_tokens = await first_token(model, np.concatenate([system, users[-1]]), 8)
    later = statistics.median(shared[1:])
    print(f"{model.device_info.name}: system prompt {args.system} tokens, user message {args.user}")
    print(f"time to first token: first request {shared[0] * 1e3:.1f} ms, later ones {later * 1e3:.1f} ms (median), "
          f"{shared[0] / later:.1f}x; with a new system prompt each {statistics.median(fresh) * 1e3:.1f} ms")
    print(f"prefix cache: {stats.prefix_cache_hits} of {stats.prefix_cache_queries} prompt tokens found")
    print(f"greedy tokens cached {cached_tokens}, on a fresh model {uncached_tokens}: {'same' if cached_tokens == uncached_tokens else 'DIFFERENT'}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pte")
    p.add_argument("--system", type=int, default=1024)
    p.add_argument("--user", type=int, default=32)
    p.add_argument("--requests", type=int, default=6)
    anyio.run(main, p.parse_args())
