"""Eight decode streams of one Llama `.pte` at once: each prints its progress, then the aggregate
tokens/s with cross-session batched submits on and off.

    python examples/streams.py model.pte [--streams 8] [--tokens 32]

Any ExecuTorch Llama export works (tokens [1, S] and input_pos [1] in, logits out), for example
examples/export_smollm2.py's or a tiny one from tests/llama.py. Greedy decoding from a random
prompt per stream; the streams share the model's weights, pipelines and submits.
"""

import argparse
import time

import anyio
import numpy as np

import async_runtime as ar


async def stream(model, index, args, done):
    vocab = model.outputs[0].max_shape[-1]
    prompt = np.random.default_rng(index).integers(0, vocab, 5).tolist()
    async with model.session() as session:
        n = 0
        async for token in ar.generate(session, prompt, max_new_tokens=args.tokens):
            n += 1
            if n % max(1, args.tokens // 4) == 0 or n == args.tokens:
                print(f"  stream {index}: {n}/{args.tokens} tokens (last {token})", flush=True)
    done.append(n)


async def run(path, args, batch_submits):
    async with await ar.load(path, batch_submits=batch_submits) as model:
        done = []
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(args.streams):
                tg.start_soon(stream, model, i, args, done)
        seconds = time.perf_counter() - t0
        stats = model.statistics()
        print(f"batched submits {'on ' if batch_submits else 'off'}: {sum(done)} tokens from {args.streams} streams in "
              f"{seconds:.2f} s = {sum(done) / seconds:.1f} tokens/s aggregate, "
              f"{stats.executes / stats.submits:.2f} steps per submit ({model.device_info.name})")


async def main(args):
    for batch_submits in (True, False):
        await run(args.pte, args, batch_submits)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pte")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    anyio.run(main, p.parse_args())
