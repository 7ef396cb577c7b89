"""ExecuTorch's own Llama export (KV cache, sdpa_with_kv_cache, dynamic shapes) against the eager
exported program: a prompt, then greedy decode steps, logits compared at every step.

Grouped-query attention (one KV head), odd sizes (head count 5, vocab 257), several layers; fp32
and the two 4-bit modes. The long scenario's prompt is more than half the context, so the first
decode step after it needs no room for a second prompt (the upstream SymInt-ordering hazard).
With PTE_WGPU_EXPORT_DIR set, the export and the reference's logits are stored there, so the
same test runs on a machine without ExecuTorch.
"""

import os
from pathlib import Path

import anyio
import numpy as np
import pytest

import async_runtime as ar

pytestmark = pytest.mark.usefixtures("adapter")

CONTEXT = 48
CONFIGS = {
    "fp32": dict(dim=80, n_heads=5, n_kv_heads=1, n_layers=2, vocab_size=257),
    "4w": dict(dim=96, n_heads=3, n_kv_heads=1, n_layers=2, vocab_size=260, qmode="4w"),
    "8da4w": dict(dim=96, n_heads=3, n_kv_heads=1, n_layers=2, vocab_size=260, qmode="8da4w"),
}
SCENARIOS = {"short": (7, 32), "long": (30, 12)}  # prompt length, decode steps
_CACHE = {}


def recorded(name, tmp_path_factory):
    """(pte bytes, {scenario: (token ids fed, logits per step)}) from the eager reference."""
    if name in _CACHE:
        return _CACHE[name]
    store = Path(os.environ["PTE_WGPU_EXPORT_DIR"]) / f"llama_{name}" if os.environ.get("PTE_WGPU_EXPORT_DIR") else None
    if store is not None and store.with_suffix(".npz").exists():
        data = np.load(store.with_suffix(".npz"))
        runs = {s: (data[f"{s}_ids"], list(data[f"{s}_logits"])) for s in SCENARIOS}
        _CACHE[name] = (store.with_suffix(".pte").read_bytes(), runs)
        return _CACHE[name]
    from .llama import export_llama

    path, ref = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, **CONFIGS[name])
    runs = {}
    vocab = CONFIGS[name]["vocab_size"]
    for s, (prompt_len, steps) in SCENARIOS.items():
        ref.reset()
        prompt = np.random.default_rng(prompt_len).integers(0, vocab, (1, prompt_len))
        ids, logits = ref.greedy(prompt, steps)
        runs[s] = (np.concatenate([prompt[0], ids]), logits)
    pte = Path(path).read_bytes()
    if store is not None:
        store.with_suffix(".pte").write_bytes(pte)
        arrays = {f"{s}_ids": ids for s, (ids, _) in runs.items()}
        arrays.update({f"{s}_logits": np.stack(lg) for s, (_, lg) in runs.items()})
        np.savez(store.with_suffix(".npz"), **arrays)
    _CACHE[name] = (pte, runs)
    return _CACHE[name]


async def generate_and_check(session, ids, logits, prompt_len):
    """Feed the prompt, then each generated token; our argmax must pick the reference's token."""
    steps = [(ids[None, :prompt_len], 0)] + [(ids[None, p : p + 1], p) for p in range(prompt_len, len(ids))]
    for k, ((tokens, pos), want) in enumerate(zip(steps, logits)):
        (got,) = await session.execute(tokens.astype(np.int64), np.array([pos], np.int64))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-3, err_msg=f"step {k} (position {pos})")
        if k + 1 < len(steps):
            assert int(got.argmax()) == int(steps[k + 1][0][0, 0]) or k == 0 and prompt_len == 0


@pytest.mark.parametrize("name", list(CONFIGS))
async def test_llama_matches_eager_prompt_then_decode(name, tmp_path_factory):
    pte, runs = recorded(name, tmp_path_factory)
    async with await ar.load(pte) as model:
        assert model.inputs[0].max_shape == (1, CONTEXT - 1)
        ids, logits = runs["short"]
        await generate_and_check(model, ids, logits, SCENARIOS["short"][0])


async def test_two_sessions_keep_their_own_kv_caches(tmp_path_factory):
    """Two streams at once, one with a prompt longer than half the context: each matches eager."""
    pte, runs = recorded("fp32", tmp_path_factory)
    async with await ar.load(pte) as model:
        async with model.session() as a, model.session() as b, anyio.create_task_group() as tg:
            for session, scenario in ((a, "short"), (b, "long")):
                ids, logits = runs[scenario]
                tg.start_soon(generate_and_check, session, ids, logits, SCENARIOS[scenario][0])
        assert a.memory() > 0 and a.memory() == b.memory()


async def test_positions_past_the_context_are_an_input_error(tmp_path_factory):
    pte, runs = recorded("fp32", tmp_path_factory)
    async with await ar.load(pte) as model:
        ids, logits = runs["short"]
        with pytest.raises(ar.InputError, match="past the context|do not fit the KV cache"):
            await model.execute(np.ones((1, 5), np.int64), np.array([CONTEXT - 2], np.int64))
        await generate_and_check(model, ids, logits, SCENARIOS["short"][0])  # and the model still works
