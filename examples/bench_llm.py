"""LLM timings side by side in one run: pte-wgpu on a Llama-style `.pte` against a plain torch eager
Llama of the same shape and weights (CUDA when available), and with `--hf` HF transformers'
LlamaForCausalLM (eager), as the H100 numbers in BENCHMARKS.md.

    python examples/bench_llm.py model.pte --params model.json [--runs 5] [--hf] [--json out.json]
        [--peers PEERS_DIR [--peer-kits llamacpp,ort] [--peer-out DIR]]

Decode rows: a host loop of `execute` per token (`decode_tok_s`, `sessions_N_*`), and, where the
model has GPU bursts, greedy decoding with the GPU picking every token (`bursts_N_tok_s`:
`session.greedy`, the path of `ar.generate` at temperature 0), which the peer table uses.
`--peers` also runs the peer runtimes' kits (llama.cpp Vulkan, ORT WebGPU; async_runtime/tools/bench/peers.py) in the
same call, after ours, and prints one table of the rows they share.

`--params` is the params.json of the export (examples/export_bench_model.py writes it); the torch
model is built from it with the same tiled weights (see export_bench_model.synthetic weights: one
1 MiB random block, seed 0). Medians of `--runs` runs.
"""

import argparse
import json
import statistics
import time

import anyio
import numpy as np

import async_runtime as ar

BLOCK_FLOATS = (1 << 20) // 4


ONE_STREAM_RUNS = 7


def median_rate(samples):
    return statistics.median(samples)


class LoadPhases:
    """`ar.load`'s progress callback that keeps when each phase ended and how many bytes it moved."""

    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.seconds, self.totals = {}, {}

    def __call__(self, phase, done, total):
        now = time.perf_counter()
        if done == 0:
            self.last = now  # a phase's clock starts at its first report
        self.seconds[phase], self.totals[phase] = now - self.last, total

    def rows(self):
        """Seconds per phase and in all; the upload's GB/s (weights made into buffers and queued)."""
        rows = {f"load_{phase.replace('-', '_')}_s": s for phase, s in self.seconds.items()}
        rows["load_s"] = time.perf_counter() - self.start
        if self.seconds.get("upload"):
            rows["load_upload_gb_s"] = self.totals["upload"] / self.seconds["upload"] / 1e9
        return rows


async def bench_wgpu(path, args):
    out = {}
    most = max(32, *args.sessions)  # every session in one ragged pass
    phases = LoadPhases()
    model = await ar.load(path, max_batch=most, progress=phases, precision=args.precision, batch_invariant=not args.batch_variant)
    out |= phases.rows()
    async with model, await ar.load(path, batch_submits=False, precision=args.precision) as unbatched:
        out["device"] = model.device_info.name
        out["precision"], out["model_memory_bytes"], out["batch_invariant"] = model.precision, model.memory(), model.batch_invariant
        out["batching"], out["gpu_sampling"] = f"{model.batching} {model.batching_note}".strip(), model.gpu_sampling
        max_step = model.inputs[0].max_shape[1]
        context = ar.context_length(model)
        rng = np.random.default_rng(0)
        vocab = model.outputs[0].max_shape[-1]
        if args.generate_only:
            return out | await bench_generate(model, args, vocab)

        async def prompt(session, start=8):
            await session.execute(rng.integers(0, vocab, (1, start)), np.array([0]))

        async def decode(session, steps, start=8):
            for p in range(start, start + steps):
                await session.execute(np.array([[p % vocab]]), np.array([p]))

        rates = []
        for _ in range(args.runs):
            async with model.session() as s:
                await s.execute(rng.integers(0, vocab, (1, 8)), np.array([0]))
                t = time.perf_counter()
                for p in range(8, 8 + args.decode_steps):
                    await s.execute(np.array([[p % vocab]]), np.array([p]))
                rates.append(args.decode_steps / (time.perf_counter() - t))
        out["decode_tok_s"] = median_rate(rates)
        st = model.statistics()
        out["dispatches_per_step"] = st.dispatches / max(st.executes, 1)
        for n in sorted({min(n, max_step, context) for n in (32, 128, 512, 2048)}):  # 2047: the export's max
            rates = []
            async with model.session() as s:
                for _ in range(args.runs + 1):
                    t = time.perf_counter()
                    await s.execute(rng.integers(0, vocab, (1, n)), np.array([0]))
                    rates.append(n / (time.perf_counter() - t))
            out[f"prefill_{n}_tok_s"] = median_rate(rates[1:])
        for n in args.sessions:
            for label, m in (("batched", model), ("unbatched", unbatched))[: 1 if args.batched_only else 2]:
                rates = []
                for _ in range(max(1, args.runs // 2)):
                    sessions = [await m.open_session() for _ in range(n)]
                    async with anyio.create_task_group() as tg:  # every prompt first, untimed, as torch's batch
                        for s in sessions:
                            tg.start_soon(prompt, s)
                    before = m.statistics()
                    t = time.perf_counter()
                    async with anyio.create_task_group() as tg:
                        for s in sessions:
                            tg.start_soon(decode, s, args.concurrent_steps)
                    dt = time.perf_counter() - t
                    after = m.statistics()
                    rates.append(n * args.concurrent_steps / dt)
                    for s in sessions:
                        await s.aclose()
                out[f"sessions_{n}_{label}_tok_s"] = median_rate(rates)
                out[f"sessions_{n}_{label}_steps_per_submit"] = (after.executes - before.executes) / max(
                    after.submits - before.submits, 1)
        if model.gpu_sampling:  # greedy decoding with the GPU picking each token, bursts of passes
            for n in sorted({1, *args.sessions}):
                rates = []
                # one stream: a run is 64 steps of ~1 ms on an H100, and runs moved 10-20% (the first of a call
                # lowest): the median of at least ONE_STREAM_RUNS
                for _ in range(max(ONE_STREAM_RUNS, 2 * args.runs) if n == 1 else max(1, args.runs // 2)):
                    sessions = [await model.open_session() for _ in range(n)]
                    async with anyio.create_task_group() as tg:
                        for s in sessions:
                            tg.start_soon(prompt, s)
                    t = time.perf_counter()
                    async with anyio.create_task_group() as tg:
                        for s in sessions:
                            tg.start_soon(greedy, s, args.concurrent_steps)
                    rates.append(n * args.concurrent_steps / (time.perf_counter() - t))
                    for s in sessions:
                        await s.aclose()
                out[f"bursts_{n}_tok_s"] = median_rate(rates)
        if args.generate:
            out.update(await bench_generate(model, args, vocab))
    return out


SAMPLED = dict(temperature=0.8, top_p=0.95)  # what chat clients send


async def bench_generate(model, args, vocab):
    """`ar.generate` as a user runs it, greedy and sampled (SAMPLED, a seed each) in alternate runs:
    N sessions opened, an 8-token prompt each, `--generate-tokens` new tokens, the wall time of
    the whole (prompt and set-up included). Rows generate_{greedy,sampled}_N_tok_s and their
    ratio sampled_over_greedy_N, the median of the runs' ratios; first_wave_N_tok_s, the first
    greedy wave of N sessions the model serves, and first_over_steady_N, its ratio to the greedy
    median."""
    out, rng = {}, np.random.default_rng(1)
    steps = args.generate_tokens

    async def one(settings, seed):
        async with model.session() as s:
            async for _ in ar.generate(s, rng.integers(0, vocab, 8).tolist(), max_new_tokens=steps, seed=seed, **settings):
                pass

    for n in sorted({1, *args.sessions}):
        rates = {"greedy": [], "sampled": []}
        t = time.perf_counter()
        async with anyio.create_task_group() as tg:  # the first time the model serves n sessions at once
            for i in range(n):
                tg.start_soon(one, {}, i)
        first = n * steps / (time.perf_counter() - t)
        for run in range(2 * args.runs if n == 1 else args.runs):
            for label in ("greedy", "sampled") if run % 2 == 0 else ("sampled", "greedy"):
                t = time.perf_counter()
                async with anyio.create_task_group() as tg:
                    for i in range(n):
                        tg.start_soon(one, SAMPLED if label == "sampled" else {}, run * n + i)
                rates[label].append(n * steps / (time.perf_counter() - t))
        for label, r in rates.items():
            out[f"generate_{label}_{n}_tok_s"] = median_rate(r)
        out[f"sampled_over_greedy_{n}"] = statistics.median(s / g for s, g in zip(rates["sampled"], rates["greedy"]))
        out[f"first_wave_{n}_tok_s"] = first
        out[f"first_over_steady_{n}"] = first / out[f"generate_greedy_{n}_tok_s"]
    return out


async def greedy(session, steps, start=8):
    await session.greedy(np.array([[start]]), np.array([start]), n=steps)


def torch_llama(params, device):
    """A plain eager Llama (RMSNorm, GQA attention with a KV cache, SwiGLU), weights tiled from the
    same 1 MiB block as the export."""
    import torch
    import torch.nn.functional as F

    dim, n_layers, n_heads = params["dim"], params["n_layers"], params["n_heads"]
    n_kv, vocab, hidden = params["n_kv_heads"], params["vocab_size"], params["hidden_dim"]
    head = dim // n_heads
    block = torch.randn(BLOCK_FLOATS, generator=torch.Generator().manual_seed(0)) * 0.02

    def w(*shape):
        n = int(np.prod(shape))
        return block.repeat(-(-n // BLOCK_FLOATS))[:n].reshape(shape).to(device)

    emb = w(vocab, dim)
    layers = [dict(wq=w(dim, dim), wk=w(n_kv * head, dim), wv=w(n_kv * head, dim), wo=w(dim, dim),
                   w1=w(hidden, dim), w2=w(dim, hidden), w3=w(hidden, dim)) for _ in range(n_layers)]
    theta = params.get("rope_theta", 10000.0)
    freqs = 1.0 / theta ** (torch.arange(0, head, 2, device=device).float() / head)

    def rms(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)

    def rope(x, pos):
        angles = pos[:, None].float() * freqs[None]
        cos, sin = angles.cos()[None, :, None], angles.sin()[None, :, None]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)

    def forward(tokens, start, cache):
        b, s = tokens.shape
        pos = torch.arange(start, start + s, device=device)
        x = emb[tokens]
        for i, L in enumerate(layers):
            h = rms(x)
            q = rope((h @ L["wq"].T).view(b, s, n_heads, head), pos)
            k = rope((h @ L["wk"].T).view(b, s, n_kv, head), pos)
            v = (h @ L["wv"].T).view(b, s, n_kv, head)
            kc, vc = cache[i]
            kc[:, start:start + s], vc[:, start:start + s] = k, v
            keys = kc[:, : start + s].repeat_interleave(n_heads // n_kv, 2).transpose(1, 2)
            vals = vc[:, : start + s].repeat_interleave(n_heads // n_kv, 2).transpose(1, 2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, is_causal=s > 1)
            x = x + a.transpose(1, 2).reshape(b, s, dim) @ L["wo"].T
            h = rms(x)
            x = x + (F.silu(h @ L["w1"].T) * (h @ L["w3"].T)) @ L["w2"].T
        return rms(x[:, -1]) @ emb.T

    def new_cache(batch, context):
        return [(torch.zeros(batch, context, n_kv, head, device=device),
                 torch.zeros(batch, context, n_kv, head, device=device)) for _ in range(n_layers)]

    return forward, new_cache


def time_baseline(args, device, vocab, begin, step, prefill):
    """A torch baseline's scenarios: `begin(batch)` runs an 8-token prompt and returns the decode
    state, `step(state, tokens, pos)` one decode step -> (state, next tokens), and `prefill(n)` a
    thunk that runs an n-token prompt and returns its last logits (set up outside the timing)."""
    import torch

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    out = {}
    with torch.no_grad():
        for batch, key in ((1, "decode_tok_s"), (16, "batch16_decode_tok_s")):
            rates = []
            for _ in range(args.runs):
                state = begin(batch)
                sync()
                t = time.perf_counter()
                tok = torch.zeros(batch, 1, dtype=torch.long, device=device)
                for p in range(8, 8 + args.decode_steps):
                    state, tok = step(state, tok, p)
                    tok.cpu()  # each token read back, as a generation loop does
                rates.append(batch * args.decode_steps / (time.perf_counter() - t))
            out[key] = median_rate(rates)
        for n in (32, 128, 512, 2048):
            rates = []
            for _ in range(args.runs + 1):
                run = prefill(n)
                sync()
                t = time.perf_counter()
                run().cpu()
                rates.append(n / (time.perf_counter() - t))
            out[f"prefill_{n}_tok_s"] = median_rate(rates[1:])
    return out


def bench_torch(params, args, context):
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    forward, new_cache = torch_llama(params, device)
    vocab = params["vocab_size"]

    def begin(batch):
        cache = new_cache(batch, context)
        forward(torch.randint(0, vocab, (batch, 8), device=device), 0, cache)
        return cache

    def step(cache, tok, pos):
        return cache, forward(tok, pos, cache).argmax(-1, keepdim=True)

    def prefill(n):
        cache = new_cache(1, context)
        return lambda: forward(torch.randint(0, vocab, (1, n), device=device), 0, cache)

    out = {"torch_device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    return out | time_baseline(args, device, vocab, begin, step, prefill)


def hf_llama(params, device):
    """HF transformers' LlamaForCausalLM of the same shape, with the same tiled weight block (q and
    k rows not permuted for HF's rotary layout: the timing is the same), eager, its default
    attention (sdpa): the torch baseline BENCHMARKS.md's LLM rows compare against."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=params["vocab_size"], hidden_size=params["dim"], intermediate_size=params["hidden_dim"],
        num_hidden_layers=params["n_layers"], num_attention_heads=params["n_heads"],
        num_key_value_heads=params["n_kv_heads"], rms_norm_eps=params.get("norm_eps", 1e-5),
        rope_theta=params.get("rope_theta", 10000.0), max_position_embeddings=2048, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg)
    block = torch.randn(BLOCK_FLOATS, generator=torch.Generator().manual_seed(0)) * 0.02
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(block.repeat(-(-p.numel() // BLOCK_FLOATS))[: p.numel()].reshape(p.shape))
    return model.to(device).eval()


def bench_hf(params, args):
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = hf_llama(params, device)
    vocab = params["vocab_size"]

    def begin(batch):
        return model(torch.randint(0, vocab, (batch, 8), device=device), use_cache=True).past_key_values

    def step(past, tok, pos):
        o = model(tok, past_key_values=past, use_cache=True)
        return o.past_key_values, o.logits[:, -1].argmax(-1, keepdim=True)

    def prefill(n):
        return lambda: model(torch.randint(0, vocab, (1, n), device=device), use_cache=True, logits_to_keep=1).logits

    out = {"attention": model.config._attn_implementation}
    return out | time_baseline(args, device, vocab, begin, step, prefill)


def our_rows(w):
    """Our figures under the rows the peers report (the export's longest prompt is 2,047 tokens)."""
    rows = {"decode_1": w.get("bursts_1_tok_s", w.get("decode_tok_s")), "prefill_512": w.get("prefill_512_tok_s"),
            "prefill_2048": w.get("prefill_2048_tok_s", w.get("prefill_2047_tok_s"))}
    for n in (16, 32, 64):
        rows[f"decode_{n}"] = w.get(f"bursts_{n}_tok_s", w.get(f"sessions_{n}_batched_tok_s"))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pte")
    p.add_argument("--params", required=True)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--concurrent-steps", type=int, default=64)  # decode steps timed, as torch's batch
    p.add_argument("--sessions", default="1,2,4,8,16,32")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--hf", action="store_true", help="also time HF transformers' LlamaForCausalLM (eager)")
    p.add_argument("--batched-only", action="store_true", help="skip the one-pass-per-session comparison")
    p.add_argument("--peers", help="the folder holding the peer kits (llamacpp/, ort/): run them too")
    p.add_argument("--peer-kits", default="llamacpp,ort")
    p.add_argument("--peer-out", default="peer_results", help="where the kits write their raw output")
    p.add_argument("--generate", action="store_true", help="also time ar.generate greedy against sampled (SAMPLED)")
    p.add_argument("--generate-only", action="store_true", help="time only ar.generate, greedy against sampled")
    p.add_argument("--generate-tokens", type=int, default=128, help="new tokens a generation")
    p.add_argument("--precision", default="auto", choices=ar.PRECISIONS, help="load()'s precision")
    p.add_argument("--batch-variant", action="store_true", help="load(batch_invariant=False): tensor cores for passes of fewer rows")
    p.add_argument("--json")
    args = p.parse_args(argv)
    args.sessions = [int(s) for s in args.sessions.split(",")]
    with open(args.params) as f:
        params = json.load(f)
    results = {"wgpu": anyio.run(bench_wgpu, args.pte, args)}
    if not args.no_torch:
        results["torch"] = bench_torch(params, args, context=2048)
    if args.hf:
        results["hf_eager"] = bench_hf(params, args)
    if args.peers:
        from async_runtime.tools.bench import peers

        results["peers"] = peers.bench_peers(args.peers, args.peer_out, args.peer_kits.split(","))
    print(json.dumps(results, indent=1))
    if args.peers:
        print(peers.markdown(our_rows(results["wgpu"]), results["peers"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
