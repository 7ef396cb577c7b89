"""Baselines run in the same call: torch eager on the exported program and ExecuTorch's XNNPACK runtime."""


import anyio
import numpy as np

from .measure import LlamaStream, decode_rate, prefill_rates

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
