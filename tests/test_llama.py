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
# storage buffers of the normalizing q/k/v group that takes the RoPE (a lean epilogue, which stores
# neither the products nor rotated k)
ROPE_GROUP_BUFFERS = {"fp32": 13, "4w": 16}
_CACHE = {}


def _store(name):
    """Where PTE_WGPU_EXPORT_DIR keeps llama_`name` (an export's files), or None without it."""
    return Path(os.environ["PTE_WGPU_EXPORT_DIR"]) / f"llama_{name}" if os.environ.get("PTE_WGPU_EXPORT_DIR") else None


FIRST_NEEDED = ("fp32.npz", "8da4w.npz")  # test_batching, the fourth file, waits for these


def start_exports(tmp_path_factory):
    """Start the exports that this file, test_batching and test_server use and that are not
    stored, so they run side by side and alongside the tests before them; those not in
    FIRST_NEEDED niced (5: less than the lowerings needed last, tests/conftest.py), so that
    those come first."""
    from .llama import start_export

    wanted = [(f"{name}.npz", config, True) for name, config in CONFIGS.items()]
    wanted.append(("fp32_static.pte", CONFIGS["fp32"], False))
    for stored_as, config, dynamic in wanted:
        if _store(stored_as) is None or not _store(stored_as).exists():
            start_export(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, dynamic=dynamic,
                         nice=0 if stored_as in FIRST_NEEDED else 5, **config)


def recorded(name, tmp_path_factory, config=None):
    """(pte bytes, {scenario: (token ids fed, logits per step)}) from the eager reference;
    `config` (default CONFIGS[name]) is the export's, for configs of other files."""
    config = config or CONFIGS[name]
    if name in _CACHE:
        return _CACHE[name]
    store = _store(name)
    if store is not None and store.with_suffix(".npz").exists():
        data = np.load(store.with_suffix(".npz"))
        runs = {s: (data[f"{s}_ids"], list(data[f"{s}_logits"])) for s in SCENARIOS}
        _CACHE[name] = (store.with_suffix(".pte").read_bytes(), runs)
        return _CACHE[name]
    from .llama import export_llama

    path, ref = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, **config)
    runs = {}
    vocab = config["vocab_size"]
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


async def generate_and_check(session, ids, logits, prompt_len, atol=2e-4, rtol=1e-3):
    """Feed the prompt, then each generated token; our argmax must pick the reference's token and
    the logits match the reference's within atol, rtol at every step."""
    steps = [(ids[None, :prompt_len], 0)] + [(ids[None, p : p + 1], p) for p in range(prompt_len, len(ids))]
    for k, ((tokens, pos), want) in enumerate(zip(steps, logits)):
        (got,) = await session.execute(tokens.astype(np.int64), np.array([pos], np.int64))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=f"step {k} (position {pos})")
        if k + 1 < len(steps):
            assert int(got.argmax()) == int(steps[k + 1][0][0, 0]) or k == 0 and prompt_len == 0


@pytest.mark.parametrize("name", list(CONFIGS))
async def test_llama_matches_eager_prompt_then_decode(name, tmp_path_factory, load_pte, kernel_variants):
    """With both variant sets (on CPU adapters with subgroups: the fused products' subgroup GEMV
    normalizing its one row itself, and their 8-row form reading the normalized prompt rows)."""
    pte, runs = recorded(name, tmp_path_factory)
    model = await load_pte(pte)
    assert model.inputs[0].max_shape == (1, CONTEXT - 1)
    # per layer: the SiLU gate; with fp32 and 4-bit linears also SwiGLU, q/k/v as one group, two
    # residual adds, the two RMS norms before the group and SwiGLU, and the group taking the RoPE
    # where the device lets its kernel bind enough storage buffers; and RoPE writes the KV cache;
    # with 8da4w, the choose_qparams of k, v and up (each the same as q's or gate's) and, where
    # the device has no int8 matrices, the 4 left becoming quantized rows, the two norms joining
    # them in place of the products, and the products fused as the 4-bit ones (the head's input
    # quantized too, the last norm joining it); else the two residual adds
    rope = model.device_info.max_storage_buffers >= ROPE_GROUP_BUFFERS.get(name, 0)
    layers, head = CONFIGS[name]["n_layers"], 0
    per_layer = 8 + rope
    if CONFIGS[name].get("qmode") == "8da4w":
        per_layer, head = (7, 0) if model.int8_matrices else (per_layer - 2 + 3 + 4 + 2, 2)
    assert model.fused == layers * per_layer + head
    ids, logits = runs["short"]
    await generate_and_check(model, ids, logits, SCENARIOS["short"][0])


# head dim 128 in groups of 4 query heads a key-value head (Llama-3.1-8B's): the split-K decode kernel's
# workgroup takes 4 heads' q, 128 vec4s for its 64 invocations
HEAD_DIM_128 = dict(dim=512, n_heads=4, n_kv_heads=1, n_layers=1, vocab_size=257)


async def test_a_llama_of_head_dim_128_matches_eager(tmp_path_factory, load_pte, kernel_variants):
    pte, runs = recorded("fp32_head_dim_128", tmp_path_factory, HEAD_DIM_128)
    model = await load_pte(pte)
    for scenario, (prompt_len, _) in SCENARIOS.items():
        ids, logits = runs[scenario]
        async with model.session() as s:
            await generate_and_check(s, ids, logits, prompt_len)


async def test_workgroups_merged_apart_match_eager(tmp_path_factory, load_pte, monkeypatch):
    """Split-K attention's splits and the sampler's slices merged by dispatches of their own (where
    storage barriers order only a workgroup's own accesses: async_runtime/backend.py, Dawn's
    compiler): logits against eager at every step, and a greedy burst picks eager's tokens."""
    import async_runtime.backend as backend

    monkeypatch.setattr(backend, "MERGE_APART", True)
    monkeypatch.setenv("PTE_WGPU_KERNELS", "gpu")
    pte, runs = recorded("fp32", tmp_path_factory)
    model = await load_pte(pte)
    assert model.batching == "ragged" and model.gpu_sampling
    assert not any("arrivals" in (d.shader or "") for d in model.graph.dispatches)  # no merge by the last to arrive
    ids, logits = runs["long"]
    prompt = SCENARIOS["long"][0]
    await generate_and_check(model, ids, logits, prompt)
    async with await model.open_session() as session:
        got = await session.greedy(ids[None, :prompt].astype(np.int64), np.array([0]), n=len(ids) - prompt)
    assert got.tolist() == ids[prompt:].tolist()


async def test_static_export_fuses_through_squeezes_and_matches_eager(tmp_path_factory, load_pte):
    """The same model exported without dynamic shapes ([1, 1] tokens: the prompt goes in one token
    a step) wraps its linears in squeeze/unsqueeze copies; the fusions look through them, and
    its logits are the dynamic export's reference (same weights)."""
    store = _store("fp32_static.pte")
    if store is not None and store.exists():
        pte = store.read_bytes()
    else:
        from .llama import export_llama

        path, _ = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, dynamic=False, **CONFIGS["fp32"])
        pte = Path(path).read_bytes()
        if store is not None:
            store.write_bytes(pte)
    _, runs = recorded("fp32", tmp_path_factory)
    model = await load_pte(pte)
    assert model.inputs[0].max_shape == (1, 1)
    names = {name for name, _ in model.graph.calls}
    assert {"pte_wgpu.rms_linear_group", "pte_wgpu.rms_linear_silu_mul", "pte_wgpu.linear_residual"} <= names
    assert "aten.linear.default" in names and sum(name == "aten.linear.default" for name, _ in model.graph.calls) == 1
    ids, logits = runs["short"]
    prompt_len = SCENARIOS["short"][0]
    for p in range(len(ids)):
        (got,) = await model.execute(ids[None, p : p + 1].astype(np.int64), np.array([p], np.int64))
        if p >= prompt_len - 1:
            want = logits[p - prompt_len + 1]
            np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-3, err_msg=f"position {p}")


async def test_two_sessions_keep_their_own_kv_caches(tmp_path_factory, load_pte):
    """Two streams at once, one with a prompt longer than half the context: each matches eager."""
    pte, runs = recorded("fp32", tmp_path_factory)
    model = await load_pte(pte)
    async with model.session() as a, model.session() as b:
        async with anyio.create_task_group() as tg:
            for session, scenario in ((a, "short"), (b, "long")):
                ids, logits = runs[scenario]
                tg.start_soon(generate_and_check, session, ids, logits, SCENARIOS[scenario][0])
        assert a.memory() > 0 and a.memory() == b.memory()  # the whole context: one KV-cache block each
    assert a.memory() == b.memory() == 0 or model.batching != "ragged"  # closed, they hold none


async def test_positions_past_the_context_are_an_input_error(tmp_path_factory, load_pte):
    pte, runs = recorded("fp32", tmp_path_factory)
    model = await load_pte(pte)
    ids, logits = runs["short"]
    with pytest.raises(ar.InputError, match="past the context|do not fit the KV cache"):
        await model.execute(np.ones((1, 5), np.int64), np.array([CONTEXT - 2], np.int64))
    await generate_and_check(model, ids, logits, SCENARIOS["short"][0])  # and the model still works


async def test_generate_gives_the_reference_greedy_tokens(tmp_path_factory, load_pte):
    pte, runs = recorded("fp32", tmp_path_factory)
    ids, _ = runs["short"]
    prompt_len, steps = SCENARIOS["short"]
    model = await load_pte(pte)
    assert ar.context_length(model) == CONTEXT
    stream = ar.generate(model.session(), ids[:prompt_len], max_new_tokens=steps)
    tokens = [t async for t in stream]
    assert tokens == list(ids[prompt_len:])
    assert stream.stats.finish_reason == "length" and stream.stats.generated_tokens == steps
    assert stream.position == prompt_len + steps - 1  # the last token is not fed back


async def test_sampling_is_seeded_and_bounded_by_the_context(tmp_path_factory, load_pte):
    pte, runs = recorded("fp32", tmp_path_factory)
    ids, _ = runs["short"]
    prompt = list(ids[:7])
    model = await load_pte(pte)

    async def sample(**kw):
        return [t async for t in ar.generate(model.session(), prompt, max_new_tokens=8, **kw)]

    a = await sample(temperature=1.3, top_k=20, seed=4)
    assert a == await sample(temperature=1.3, top_k=20, seed=4)
    assert await sample(temperature=5.0, top_k=1) == list(ids[7:15])  # top-k 1 is greedy
    assert await sample(temperature=2.0, top_p=1e-9) == list(ids[7:15])  # so is a tiny top-p
    stop = int(ids[9])
    stream = ar.generate(model.session(), prompt, max_new_tokens=8, stop=[stop])
    assert [t async for t in stream] == list(ids[7:10]) and stream.stats.finish_reason == "stop"
    # the context is full after CONTEXT positions: generation ends there with "length"
    stream = ar.generate(model.session(), list(ids), max_new_tokens=100)  # 39 tokens
    assert len([t async for t in stream]) == CONTEXT - len(ids) + 1
    assert stream.stats.finish_reason == "length"
    with pytest.raises(ar.InputError, match="does not fit the context of 48"):
        ar.generate(model.session(), [1] * 49)
    with pytest.raises(ar.InputError, match="bad sampling"):
        ar.generate(model.session(), prompt, top_p=0)


def test_the_export_announces_each_stage_in_order(tmp_path_factory):
    """The export subprocess (async_runtime.llm.export_driver) prints a line as each stage starts,
    including each partition's Vulkan lowering: what examples/export_smollm2.py shows."""
    pytest.importorskip("executorch")
    from async_runtime.llm.export_driver import PREPROCESS_STAGE, STAGE_MARK, STAGES

    from .llama import export_llama

    _, ref = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, **CONFIGS["fp32"])  # cached
    announced = [line[len(STAGE_MARK):] for line in ref.export_log.splitlines() if line.startswith(STAGE_MARK)]
    partitions = [s for s in announced if s.startswith(PREPROCESS_STAGE.split("{")[0])]
    assert partitions and partitions[0] == PREPROCESS_STAGE.format(1), announced
    assert [s for s in announced if s not in partitions] == [stage for _, stage in STAGES], announced
    to_backend = announced.index("partitioning for Vulkan")
    assert all(to_backend < announced.index(p) < announced.index("saving") for p in partitions), announced
