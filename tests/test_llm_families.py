"""The LLM families ExecuTorch's `export_llm` builds, beyond SmolLM2's graph: tiny random-weight
configs with each family's switches (Llama 3's scaled RoPE, Qwen2.5's q/k/v bias, Qwen3's q/k norm
and head_dim apart from dim / heads, Phi-4-mini's partial rotary, Hugging Face's RoPE layout,
LFM2's short-convolution and Qwen3.5's linear-attention layers), fp32 and 4-bit, against
ExecuTorch's eager program on the same weights; and what ExecuTorch leaves outside the Vulkan
delegate still runs ragged, with continuous batching and GPU sampling."""

import anyio
import numpy as np
import pytest

import async_runtime as ar

from .llama import export_llama, start_export
from .test_llama import CONFIGS, generate_and_check

pytestmark = pytest.mark.usefixtures("adapter")

CONTEXT = 40
TINY = dict(dim=64, n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=260)
FAMILIES = {  # name -> the ModelArgs switches of the family, as ExecuTorch's configs of it set them
    "llama3_2": dict(use_scaled_rope=True, rope_scale_factor=32, rope_theta=500000.0),
    "qwen2_5": dict(attention_qkv_bias=True, rope_theta=1000000.0, use_hf_rope=True),
    "qwen3": dict(use_qk_norm=True, qk_norm_before_rope=True, head_dim=24, rope_theta=1000000.0, use_hf_rope=True),
    "phi_4_mini": dict(partial_rotary_factor=0.75, use_hf_rope=True, rope_theta=10000.0),
}
EXPORTS = [(family, qmode) for family in FAMILIES for qmode in (None, "4w")]
HYBRIDS = {  # name -> ModelArgs switches as ExecuTorch's configs set them: a layer with a recurrent state, then
    # attention (Qwen3.5's gated, its norms with a unit offset)
    "lfm2": (("layer_types", ("conv", "full_attention")), ("hidden_dim", 128)),
    "qwen3_5": (("layer_types", ("linear_attention", "full_attention")), ("hidden_dim", 128), ("linear_num_key_heads", 2),
                ("linear_num_value_heads", 4), ("linear_key_head_dim", 16), ("linear_value_head_dim", 16), ("use_q_gate", True),
                ("rms_norm_add_unit_offset", True), ("partial_rotary_factor", 0.25), ("use_qk_norm", True), ("qk_norm_before_rope", True),
                ("use_hf_rope", True), ("head_dim", 32), ("rope_theta", 10000000.0)),
}
HYBRID_EXPORTS = [(family, qmode) for family in HYBRIDS for qmode in (None, "4w")]


def start_exports(tmp_path_factory):
    """Every family's exports, side by side with the tests before them (niced)."""
    for family, qmode in EXPORTS:
        start_export(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, qmode=qmode, nice=5,
                     model_args=tuple(FAMILIES[family].items()), **TINY)
    for family, qmode in HYBRID_EXPORTS:
        start_export(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, qmode=qmode, nice=5, model_args=HYBRIDS[family], **TINY)
    start_export(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, nice=5, embedding_quantize=EMBEDDING_QUANTIZE, **TINY)


async def generate_together(model, prompts, n):
    """Greedy generations of `prompts` (lists of ids), `n` tokens each, as concurrent sessions
    (their steps share ragged passes)."""
    got = [None] * len(prompts)

    async def run(i):
        async with model.session() as s:
            got[i] = [t async for t in ar.generate(s, prompts[i], max_new_tokens=n)]

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(run, i)
    return got


def eager_greedy(ref, prompts, n):
    """ExecuTorch's eager program's greedy ids for each of `prompts`."""
    want = []
    for prompt in prompts:
        ref.reset()
        want.append([int(t) for t in ref.greedy(np.array([prompt]), n)[0]])
    return want


@pytest.mark.parametrize("family, qmode", EXPORTS, ids=[f"{f}-{q or 'fp32'}" for f, q in EXPORTS])
async def test_a_family_matches_executorchs_eager_program(family, qmode, tmp_path_factory, load_pte):
    """Logits at every step of a prompt and its greedy decode within 2e-4 of eager's (4-bit: of
    eager's own 4-bit program); the model batches ragged with GPU sampling, and three prompts
    generated together get eager's tokens."""
    path, ref = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, qmode=qmode,
                             model_args=tuple(FAMILIES[family].items()), **TINY)
    model = await load_pte(path)
    assert model.batching == "ragged" and model.gpu_sampling, model.batching_note
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, TINY["vocab_size"], (1, n)) for n in (9, 4, 13)]
    want = []
    for prompt in prompts:
        ref.reset()
        want.append(ref.greedy(prompt, 10))
    ids, logits = want[0]
    async with model.session() as s:
        await generate_and_check(s, np.concatenate([prompts[0][0], ids]), logits, prompts[0].shape[1])
    got = await generate_together(model, [p[0].tolist() for p in prompts], 10)  # one ragged pass for the three
    assert got == [ids for ids, _ in want]


@pytest.mark.parametrize(("family", "qmode", "kernels"), [("qwen2_5", "4w", "gpu"), ("qwen2_5", None, "cpu"), ("phi_4_mini", "4w", "cpu"), ("phi_4_mini", None, "gpu")])
async def test_a_hugging_face_rope_joins_the_q_k_v_products(tmp_path_factory, load_pte, monkeypatch, family, qmode, kernels):
    """Qwen2.5's and Phi-4-mini's exports slice the rotary tables in each layer: a ragged pass
    gathers their rows at the pass's positions once for every layer, and each layer's rotate-half
    RoPE (of whole heads, of 12 of 16 dims) joins the q/k/v group before it (biased or not; q's and
    k's weight rows paired at load), which rotates q and k and stores k and v in the KV caches that
    attention then reads without updating them: logits bitwise those of the group and the RoPE
    apart, at a prompt's rows and at decode steps, whether the group's epilogue rotates (GPU
    kernels) or the paired RoPE's own dispatch (CPU adapters' kernels)."""
    from pte_wgpu.kernels import fusion

    monkeypatch.setenv("PTE_WGPU_KERNELS", kernels)
    path, _ = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, qmode=qmode, model_args=tuple(FAMILIES[family].items()), **TINY)
    joined = await load_pte(path)
    with monkeypatch.context() as m:
        m.setattr(fusion, "_fuse_rope_into_groups", lambda graph, limit=None: 0)
        apart = await load_pte(path)
    names, layers = [name for name, _ in joined.graph.calls], TINY["n_layers"]
    assert joined.batching == "ragged" and names.count("aten.embedding.default") == 3, names  # the tokens' rows, cos's, sin's
    group = f"pte_wgpu.rms_{'q4_' if qmode else ''}linear_{'bias_' if family == 'qwen2_5' else ''}group_rope_hf"
    assert names.count(group) == names.count("pte_wgpu.ragged_sdpa_cached") == layers and "pte_wgpu.rope_hf_into_cache" not in names, names
    assert [name for name, _ in apart.graph.calls].count("pte_wgpu.rope_hf_into_cache") == layers
    tokens = np.random.default_rng(7).integers(0, TINY["vocab_size"], (1, 17))
    logits = []
    for model in (joined, apart):
        async with model.session() as s:
            got = [await s.execute(tokens[:, :13], np.array([0]))]
            for pos in range(13, 17):
                got.append(await s.execute(tokens[:, pos : pos + 1], np.array([pos])))
        logits.append(got)
    for step, (a, b) in enumerate(zip(*logits)):
        np.testing.assert_array_equal(a[0], b[0], err_msg=f"step {step}")


async def test_qwen3s_q_and_k_norms_and_rope_run_as_one_dispatch(tmp_path_factory, load_pte, monkeypatch):
    """Qwen3's RMS norms of q's and k's heads, one after the other in its export, and the
    rotate-half RoPE after them run as one `pte_wgpu.rms_norm_pair_rope_hf_into_cache` a layer
    (without a ragged pass the two norms as one `pte_wgpu.rms_norm_pair`): logits bitwise those
    of the norms' and the RoPE's own dispatches, at a prompt's rows and at decode steps."""
    from pte_wgpu.kernels import fusion

    path, _ = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, qmode="4w", model_args=tuple(FAMILIES["qwen3"].items()), **TINY)
    joined = await load_pte(path)
    with monkeypatch.context() as m:
        m.setattr(fusion, "_fuse_norms_into_rope", lambda graph: 0)
        paired = await load_pte(path)
        m.setattr(fusion, "_pair_norms", lambda graph: 0)
        apart = await load_pte(path)
    layers, models = TINY["n_layers"], (joined, paired, apart)
    names = [[name for name, _ in model.graph.calls] for model in models]
    assert names[0].count("pte_wgpu.rms_norm_pair_rope_hf_into_cache") == layers and "pte_wgpu.rope_hf_into_cache" not in names[0], names[0]
    assert names[1].count("pte_wgpu.rms_norm_pair") == names[1].count("pte_wgpu.rope_hf_into_cache") == layers, names[1]
    assert names[2].count("et_vk.rms_norm.default") == names[1].count("et_vk.rms_norm.default") + 2 * layers
    tokens = np.random.default_rng(5).integers(0, TINY["vocab_size"], (1, 17))
    logits = []
    for model in models:
        async with model.session() as s:
            got = [await s.execute(tokens[:, :13], np.array([0]))]
            for pos in range(13, 17):
                got.append(await s.execute(tokens[:, pos : pos + 1], np.array([pos])))
        logits.append(got)
    for other in logits[1:]:
        for step, (a, b) in enumerate(zip(logits[0], other)):
            np.testing.assert_array_equal(a[0], b[0], err_msg=f"step {step}")


@pytest.fixture(scope="module")
def portable_embedding(tmp_path_factory):
    """A tiny Llama whose token embedding ExecuTorch runs with its portable kernel (as it does
    with a Llama 3's 128k-token embedding, past the Vulkan partitioner's buffer limit)."""
    return export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, embedding_outside=True, **CONFIGS["fp32"])


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "weights_in_parts"])
async def test_an_embedding_outside_the_delegate_batches_ragged(portable_embedding, load_pte, monkeypatch, cut):
    """The portable embedding's model batches ragged with GPU sampling and eager's tokens. `cut`:
    tables and linear weights past one binding are read in parts of rows, the lookups from their
    parts and the linears joined by aten.cat (as a 128k-vocab fp32 embedding and LM head past
    2 GiB would); here every one past 40 KB, the embedding and the LM head among them."""
    import async_runtime.model

    real = async_runtime.model.split_constants
    if cut:
        monkeypatch.setattr(async_runtime.model, "split_constants", lambda graph, limit: real(graph, 40_000))
    path, ref = portable_embedding
    model = await load_pte(path)
    names = {name for name, _ in model.graph.calls}
    assert ("aten::embedding.out" in names) != cut == ("pte_wgpu.embedding_parts" in names) == ("aten.cat.default" in names)
    assert model.batching == "ragged" and model.gpu_sampling, model.batching_note
    vocab = CONFIGS["fp32"]["vocab_size"]
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, vocab, n).tolist() for n in (5, 1, 11, 7)]
    assert await generate_together(model, prompts, 12) == eager_greedy(ref, prompts, 12)


EMBEDDING_QUANTIZE = "8,32"  # export_llm's embedding_quantize: int8 rows, a scale every 32 values


async def test_a_quantized_embedding_batches_ragged(tmp_path_factory, load_pte):
    """export_llm's 8-bit embedding (`quantization.embedding_quantize`), which ExecuTorch leaves to
    its portable kernel outside the delegate: the model batches ragged with GPU sampling, and four
    prompts generated together get the eager program's tokens."""
    path, ref = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, embedding_quantize=EMBEDDING_QUANTIZE, **TINY)
    model = await load_pte(path)
    assert "quantized_decomposed::embedding_byte.dtype_out" in {name for name, _ in model.graph.calls}
    assert model.batching == "ragged" and model.gpu_sampling, model.batching_note
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, TINY["vocab_size"], n).tolist() for n in (6, 1, 12, 3)]
    assert await generate_together(model, prompts, 10) == eager_greedy(ref, prompts, 10)


@pytest.mark.parametrize("family, qmode", HYBRID_EXPORTS, ids=[f"{f}-{q or 'fp32'}" for f, q in HYBRID_EXPORTS])
async def test_a_hybrid_family_carries_its_recurrent_state_as_eager_does(family, qmode, tmp_path_factory, load_pte):
    """ExecuTorch 1.5.1 lowers these states so that no call would see the last one's (LFM2's
    short-convolution state: a delegate output the program never passes on; Qwen3.5's convolution
    and delta-rule states: read through a delegate constant of their initial value); linking
    restores what the model does. Logits at every step within 2e-4 of eager's; concurrent
    sessions each carry their own states in one ragged pass, a slot of each state's pool a
    session; a session's next sequence starts them afresh, and a generation that would continue
    elsewhere than where the last one stopped is refused."""
    path, ref = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, qmode=qmode, model_args=HYBRIDS[family], **TINY)
    model = await load_pte(path)
    assert model.recurrent_states and model.batching == "ragged" and model.gpu_sampling, model.batching_note
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, TINY["vocab_size"], n).tolist() for n in (7, 1, 13, 2)]
    ref.reset()
    ids, logits = ref.greedy(np.array([prompts[0]]), 10)
    async with model.session() as s:
        await generate_and_check(s, np.array(prompts[0] + ids), logits, len(prompts[0]))
    want = eager_greedy(ref, prompts, 10)
    assert await generate_together(model, prompts, 10) == want
    async with model.session() as s:
        for prompt, tokens in zip(prompts[:2], want[:2]):  # two sequences, one after the other
            assert [t async for t in ar.generate(s, prompt, max_new_tokens=10)] == tokens
        with pytest.raises(ar.InputError, match=f"starts at position 0 or continues at position {len(prompts[1]) + 9}, where"):
            ar.generate(s, [3], start=2)
        more = [t async for t in ar.generate(s, [want[1][-1], 5], max_new_tokens=4, start=s.sequence_end)]
    ref.reset()
    ref.greedy(np.array([prompts[1]]), 9)  # the same sequence, then its continuation
    ahead, _ = ref.greedy_from(np.array([[want[1][-1], 5]]), len(prompts[1]) + 9, 4)
    assert more == ahead


@pytest.mark.parametrize("family", HYBRIDS)
async def test_recurrent_states_carry_across_chunks_and_pools(family, tmp_path_factory, load_pte):
    """The recurrent states in the ragged pass (LFM2's short convolutions; Qwen3.5's, and its delta
    rules). With 5 rows a pass, prompts are cut into chunks that share passes with other sessions'
    decodes, each chunk's windows and recurrences starting from the states the last one left; 7
    sessions outgrow the states' first pool (the slots held copied into a larger one). Every
    session gets eager's tokens. A step elsewhere than at position 0 or where its session stopped
    is refused, and the session goes on from where it was."""
    path, ref = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, model_args=HYBRIDS[family], **TINY)
    model = await load_pte(path, token_budget=5)
    assert model.batching == "ragged" and model.gpu_sampling, model.batching_note
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, TINY["vocab_size"], n).tolist() for n in (11, 1, 6, 17, 3, 2, 9)]
    assert await generate_together(model, prompts, 8) == eager_greedy(ref, prompts, 8)
    ref.reset()
    first = ref.step(np.array([prompts[3]]), 0)[0]
    then = ref.step(np.array([[7, 8]]), len(prompts[3]))[0]
    async with model.session() as s:
        (logits,) = await s.execute(np.array([prompts[3]]), np.array([0]))
        np.testing.assert_allclose(logits[0], first, atol=2e-4)
        with pytest.raises(ar.InputError, match=f"starts at position 0 or continues at position {len(prompts[3])}"):
            await s.execute(np.array([[7, 8]]), np.array([len(prompts[3]) - 1]))
        (logits,) = await s.execute(np.array([[7, 8]]), np.array([len(prompts[3])]))
        np.testing.assert_allclose(logits[0], then, atol=2e-4)
