"""How many conversations run together in a fixed KV-cache memory: `--conversations` generations
of `--length` tokens in all (a prompt of `--prompt` tokens, the rest generated), all started at
once on a model whose paged pool holds `--kv-positions` positions.

    python examples/bench_capacity.py MODEL.pte [--kv-positions 32768] [--conversations 56] [--length 512]

Prints the most generations that were producing tokens at the same moment, the pool's most used
blocks, and the aggregate speed. With whole-context caches the same memory holds
kv_positions / context conversations.
"""

import argparse
import time

import anyio
import numpy as np

import async_runtime as ar


async def main(args):
    rng = np.random.default_rng(0)
    async with await ar.load(args.pte, max_batch=args.max_batch, kv_positions=args.kv_positions) as model:
        if model.batching != "ragged":
            raise SystemExit(f"{args.pte}: the model does not batch ({model.batching}), so it has no paged pool")
        vocab = model.outputs[0].max_shape[-1]
        blocks = model.statistics().kv_blocks
        live, peak_live, peak_blocks, tokens = 0, 0, 0, 0

        async def conversation():
            nonlocal live, peak_live, peak_blocks, tokens
            prompt = rng.integers(0, vocab, args.prompt).tolist()
            async with model.session() as s:
                started = False
                async for _ in ar.generate(s, prompt, max_new_tokens=args.length - args.prompt):
                    if not started:
                        started, live = True, live + 1
                        peak_live = max(peak_live, live)
                    tokens += 1
                    peak_blocks = max(peak_blocks, model.statistics().kv_blocks_used)
                live -= 1

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(args.conversations):
                tg.start_soon(conversation)
        wall = time.perf_counter() - t0
        context = ar.context_length(model)
    print(f"{model.device_info.name}: pool of {blocks} blocks ({args.kv_positions} positions), context {context}")
    print(f"{args.conversations} conversations of {args.length} tokens ({args.prompt} prompt): at most {peak_live} "
          f"generating at once (whole-context caches in the same memory: {args.kv_positions // context}), "
          f"at most {peak_blocks} blocks used; {tokens} tokens in {wall:.1f} s, {tokens / wall:.0f} tokens/s")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pte")
    p.add_argument("--kv-positions", type=int, default=32768)
    p.add_argument("--conversations", type=int, default=56)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--max-batch", type=int, default=64)
    anyio.run(main, p.parse_args())
