"""Sampled generation through the public API on a batching model: the GPU picks every token, in
bursts; a seeded request gets the same tokens alone and beside 15 others (asyncio and trio);
the first token follows the softmax of the model's own logits; greedy requests beside sampled
ones keep the host loop's tokens; bad settings fail the request alone."""

import anyio
import numpy as np
import pytest

import async_runtime as ar
from async_runtime.errors import InputError
from async_runtime.sampling import Sampling

from .gpu_waits import record_gpu_waits_on_this_thread
from .test_llama import CONFIGS, recorded
from .test_sampling import chi_square

pytestmark = pytest.mark.usefixtures("adapter")

VOCAB = CONFIGS["fp32"]["vocab_size"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return recorded("fp32", tmp_path_factory)[0]


SETTINGS = [
    dict(temperature=0.8, top_p=0.95),
    dict(temperature=1.0),
    dict(temperature=0.6, top_k=9),
    dict(temperature=1.2, top_k=40, top_p=0.9, min_p=0.02),
    dict(temperature=0.0),
    dict(temperature=0.9, presence_penalty=0.6, frequency_penalty=0.4, repetition_penalty=1.2, logit_bias={5: 2.0, 6: -50}),
    dict(temperature=0.0, frequency_penalty=1.5),
    dict(temperature=0.7, top_p=0.5),
]


async def _generate(model, prompt, settings, seed, n=20):
    async with model.session() as s:
        return [t async for t in ar.generate(s, prompt, max_new_tokens=n, seed=seed, **settings)]


async def test_a_seeded_request_gets_the_same_tokens_alone_and_in_a_batch(llama, load_pte, monkeypatch):
    """Sixteen requests of one-token prompts (so every pass has at most 16 rows, where each row's
    logits are bitwise what it gets alone), every setting twice with other seeds. The event loop's
    thread calls nothing that waits for the GPU while they run (ragged passes, bursts, readbacks)."""
    waits = record_gpu_waits_on_this_thread(monkeypatch)
    model = await load_pte(llama)
    assert model.gpu_sampling
    plans = [(int(p), SETTINGS[i % len(SETTINGS)], 1000 + i) for i, p in enumerate(np.random.default_rng(4).integers(0, VOCAB, 16))]
    alone = [await _generate(model, [p], s, seed) for p, s, seed in plans]
    together = [None] * len(plans)

    async def run(i):
        together[i] = await _generate(model, [plans[i][0]], plans[i][1], plans[i][2])

    before = model.statistics()
    async with anyio.create_task_group() as tg:
        for i in range(len(plans)):
            tg.start_soon(run, i)
    after = model.statistics()
    assert together == alone
    assert waits == [], f"the event loop's thread waited for the GPU in {sorted(set(waits))}"
    assert after.readbacks - before.readbacks < 16 * 20 / 4  # bursts: a readback serves many tokens
    assert len({tuple(t) for t in alone}) == len(alone)
    again = await _generate(model, [plans[0][0]], plans[0][1], plans[0][2] + 1)
    assert again != alone[0]  # another seed, another generation


async def test_greedy_requests_beside_sampled_ones_keep_the_host_loops_tokens(llama, load_pte):
    model = await load_pte(llama)
    prompt = [3, 141, 59, 26]
    want = []
    async with model.session() as s:  # the host loop
        (logits,) = await s.execute(np.array([prompt]), np.array([0]))
        for pos in range(len(prompt), len(prompt) + 15):
            want.append(int(logits.argmax()))
            (logits,) = await s.execute(np.array([[want[-1]]]), np.array([pos]))
    got = {}

    async def run(key, settings, seed):
        got[key] = await _generate(model, prompt, settings, seed, n=15)

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(run, i, SETTINGS[i % 4], i)
        tg.start_soon(run, "greedy", {}, None)
    assert got["greedy"] == want


async def test_the_first_token_follows_the_models_softmax(llama, load_pte):
    """The first token of 600 seeds against `Sampling.probabilities` of the logits that execute
    gives for the prompt: within the cuts only, and a chi-square within about 4 deviations."""
    model = await load_pte(llama, max_batch=64)
    prompt = [7, 77, 177]
    settings = dict(temperature=1.5, top_p=0.9, top_k=60)
    async with model.session() as s:
        (logits,) = await s.execute(np.array([prompt]), np.array([0]))
    firsts = []
    limit = anyio.Semaphore(64)

    async def first(seed):
        async with limit:
            firsts.append((await _generate(model, prompt, settings, seed, n=1))[0])

    async with anyio.create_task_group() as tg:
        for seed in range(600):
            tg.start_soon(first, seed)
    probs = Sampling(**settings).probabilities(logits[0])
    counts = np.bincount(firsts, minlength=VOCAB)
    assert counts[probs == 0].sum() == 0
    stat, dof = chi_square(counts, probs)
    assert dof >= 4 and stat < dof + 6 * np.sqrt(2 * dof), (stat, dof)


async def test_logit_bias_and_penalties_steer_the_tokens(llama, load_pte):
    model = await load_pte(llama)
    forced = await _generate(model, [1, 2], dict(temperature=1.0, logit_bias={42: 100}), 0, n=8)
    assert forced == [42] * 8
    banned = await _generate(model, [1, 2], dict(temperature=0.0, logit_bias={t: -100 for t in range(0, VOCAB, 2)}), 0, n=12)
    assert all(t % 2 for t in banned)
    # a frequency penalty past every logit gap: no token twice while others are left
    fresh = await _generate(model, [1, 2], dict(temperature=0.0, frequency_penalty=1000.0), 0, n=30)
    assert len(set(fresh)) == 30


async def test_bad_settings_fail_the_request_and_nothing_else(llama, load_pte):
    model = await load_pte(llama)
    want = await _generate(model, [9], dict(temperature=0.5), 3)
    async with model.session() as s:
        with pytest.raises(InputError, match="top_p 1.5"):
            ar.generate(s, [9], top_p=1.5)
        with pytest.raises(InputError, match=f"outside the vocabulary of {VOCAB}"):
            ar.generate(s, [9], logit_bias={VOCAB: 1.0})
        with pytest.raises(InputError, match="n >= 1"):
            await s.pick(np.array([[9]]), np.array([0]), n=0, sampling=Sampling(temperature=1.0))
        assert [t async for t in ar.generate(s, [9], max_new_tokens=20, temperature=0.5, seed=3)] == want


async def test_a_model_without_gpu_sampling_samples_on_the_host(llama, load_pte):
    """One pass a session (no ragged batch): the host loop chooses with `Sampling.pick`, seeded
    and with the same settings; the GPU path refuses what it cannot do there."""
    model = await load_pte(llama, batch_submits=False)
    assert not model.gpu_sampling
    settings = dict(temperature=0.9, top_k=30, top_p=0.9, repetition_penalty=1.1)
    first, second = [await _generate(model, [4, 5], settings, 21, n=12) for _ in range(2)]
    assert first == second and all(0 <= t < VOCAB for t in first)
    assert len(set(await _generate(model, [4, 5], dict(temperature=0.0, frequency_penalty=1000.0), 0, n=25))) == 25
