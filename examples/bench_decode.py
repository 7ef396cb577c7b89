"""One stream's prefill and greedy decode of a Llama-style `.pte`, small enough to run on a CPU
adapter (lavapipe), where examples/bench_llm.py's rows (2,048-token prompts, 32 sessions) take hours.

    python examples/bench_decode.py model.pte [--prompt 64] [--decode 16] [--runs 3] [--json out.json]
        [--xnnpack twin.pte]

Each run opens a fresh session, times one `execute` of a `--prompt`-token prompt (to its logits),
then `session.greedy` of `--decode` tokens after it (the path of `ar.generate` at temperature 0).
Each is timed by wall clock and by the process's CPU time (all its threads: on a CPU adapter, the
driver's workers do the kernels' work), which a machine busy with other work inflates far less.
Prints the load time, the kernel variants and the medians; `--json` writes every sample. To compare
two checkouts on a busy machine, run it from each in turn, several times, and compare medians.
`--xnnpack` runs the same prompt and decode on ExecuTorch's own runtime with the model's XNNPACK
twin (`examples/export_smollm2.py --backend xnnpack`) in the same process afterwards, the host
picking each token, and prints our rates as ratios to it: on a noisy machine the ratio moves less.
"""

import argparse
import json
import statistics
import time

import anyio
import numpy as np

import async_runtime as ar


async def bench(args):
    t = time.perf_counter()
    async with await ar.load(args.pte) as model:
        vocab = model.outputs[0].max_shape[-1]
        out = {"load_s": time.perf_counter() - t, "device": model.device_info.name, "kernels": model.kernels, "vocab": vocab}
        rng = np.random.default_rng(0)
        prefill, decode, prefill_cpu, decode_cpu = [], [], [], []
        for _ in range(args.runs):
            async with model.session() as s:
                tokens = rng.integers(0, vocab, (1, args.prompt))
                t, c = time.perf_counter(), time.process_time()
                (logits,) = await s.execute(tokens, np.array([0]))
                prefill.append(time.perf_counter() - t)
                prefill_cpu.append(time.process_time() - c)
                first = np.array([[int(logits.reshape(-1, vocab)[-1].argmax())]])
                t, c = time.perf_counter(), time.process_time()
                await s.greedy(first, np.array([args.prompt]), n=args.decode)
                decode.append(args.decode / (time.perf_counter() - t))
                decode_cpu.append((time.process_time() - c) / args.decode)
        samples = {"prefill_s": prefill, "prefill_cpu_s": prefill_cpu, "decode_tok_s": decode, "decode_cpu_s_per_tok": decode_cpu}
        out |= samples | {f"{k}_median": statistics.median(v) for k, v in samples.items()}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pte")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens (one prefill step)")
    p.add_argument("--decode", type=int, default=16, help="greedy tokens timed after the prompt")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--xnnpack", metavar="PTE", help="the model's XNNPACK twin: ExecuTorch's runtime as a baseline, same process")
    args = p.parse_args()
    out = anyio.run(bench, args)
    print(
        f"{out['device']} ({out['kernels']} kernels): load {out['load_s']:.1f} s, prefill of {args.prompt} tokens "
        f"{out['prefill_s_median']:.2f} s ({out['prefill_cpu_s_median']:.2f} CPU-s), decode {out['decode_tok_s_median']:.2f} "
        f"tokens/s ({out['decode_cpu_s_per_tok_median']:.3f} CPU-s a token) (medians of {args.runs})"
    )
    if args.xnnpack:
        from async_runtime.tools.bench.baselines import xnnpack_baseline

        base = xnnpack_baseline({"xnnpack": args.xnnpack}, {"prompt0": args.prompt, "runs": args.runs}, [args.prompt], args.decode,
                                out["vocab"], lambda msg: None)
        if "error" in base:
            raise SystemExit(f"the XNNPACK baseline failed: {base['error']}")
        decode, prefill = statistics.median(base["decode"]), args.prompt / statistics.median(base["prefill"][args.prompt])
        out["xnnpack"] = base | {"decode_tok_s_median": decode, "prefill_s_median": prefill}
        print(
            f"ExecuTorch XNNPACK: prefill {prefill:.2f} s, decode {decode:.2f} tokens/s; ours / XNNPACK: decode "
            f"{out['decode_tok_s_median'] / decode:.3f}x, prefill speed {prefill / out['prefill_s_median']:.3f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
