"""Greedy decode bursts (async_runtime/bursts.py): the GPU picks each token and feeds it to the
next pass, several passes a submit. The ids must be bitwise those of the host loop (execute, then
`logits.argmax()`), which the reference runs on the same file loaded with `batch_submits=False`.
"""

import asyncio

import anyio
import numpy as np
import pytest

import async_runtime as ar
from async_runtime.errors import InputError
from async_runtime.bursts import BURST_MAX

from .test_llama import CONFIGS, CONTEXT, recorded

pytestmark = pytest.mark.usefixtures("adapter")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return recorded("fp32", tmp_path_factory)[0]


async def _host_loop(model, prompt, n):
    """The ids a host loop picks: the prompt, then n greedy tokens, each fed but the last."""
    async with model.session() as s:
        (logits,) = await s.execute(prompt[None], np.array([0]))
        ids = [int(logits.argmax())]
        for pos in range(len(prompt), len(prompt) + n - 1):
            (logits,) = await s.execute(np.array([[ids[-1]]]), np.array([pos]))
            ids.append(int(logits.argmax()))
    return ids


@pytest.mark.anyio
async def test_bursts_pick_the_host_loops_tokens(llama):
    vocab = CONFIGS["fp32"]["vocab_size"]
    rng = np.random.default_rng(11)
    # prompt length, tokens to pick: one burst, several (beyond BURST_MAX), to the end of the context
    plans = [(5, 3), (1, BURST_MAX + 7), (13, CONTEXT - 13), (2, 1), (7, 19)]
    rng.shuffle(plans)
    prompts = [rng.integers(0, vocab, n).astype(np.int64) for n, _ in plans]
    async with await ar.load(llama, batch_submits=False) as ref:
        want = [await _host_loop(ref, p, k) for p, (_, k) in zip(prompts, plans)]
    async with await ar.load(llama) as model:
        assert model.gpu_sampling
        got = [None] * len(plans)

        async def run(i):
            async with model.session() as s:
                got[i] = (await s.greedy(prompts[i][None], np.array([0]), n=plans[i][1])).tolist()

        before = model.statistics()
        async with anyio.create_task_group() as tg:  # all at once: bursts over several sequences
            for i in range(len(plans)):
                tg.start_soon(run, i)
        after = model.statistics()
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"plan {plans[i]}: burst ids differ from the host loop's"
    picked = sum(k for _, k in plans)
    assert after.readbacks - before.readbacks < picked // 4, "a burst reads back once for several passes"


@pytest.mark.anyio
async def test_a_burst_goes_in_before_the_last_ones_readback(llama):
    """One session alone picking more than a burst: the second burst is submitted before the
    first one's readback (into the other staging buffer) and still picks the host loop's ids."""
    prompt = np.array([3, 1, 4], np.int64)
    n = CONTEXT - len(prompt)  # a burst of BURST_MAX, then one of the rest
    async with await ar.load(llama, batch_submits=False) as ref:
        want = await _host_loop(ref, prompt, n)
    async with await ar.load(llama) as model:
        submitted = []
        submit = model._batcher.bursts.submit
        model._batcher.bursts.submit = lambda seqs, passes, staging=0: submitted.append((passes, staging)) or submit(seqs, passes, staging)
        async with model.session() as s:
            (logits,) = await s.execute(prompt[None], np.array([0]))
            before = model.statistics()
            got = [int(logits.argmax())] + (await s.greedy(np.array([[int(logits.argmax())]]), np.array([len(prompt)]), n=n - 1)).tolist()
            after = model.statistics()
    assert got == want
    assert submitted == [(BURST_MAX, 0), (n - 1 - BURST_MAX, 1)] and after.readbacks - before.readbacks == 2


@pytest.mark.anyio
async def test_generate_streams_the_same_tokens_and_positions(llama):
    vocab = CONFIGS["fp32"]["vocab_size"]
    prompt = np.random.default_rng(3).integers(0, vocab, 9).tolist()
    async with await ar.load(llama, batch_submits=False) as ref, await ar.load(llama) as model:
        async with ref.session() as s:
            free = ar.generate(s, prompt, max_new_tokens=30)
            want = [t async for t in free]
        stop = want[12]  # a stop token inside the first burst of 16 (its first occurrence)
        cut = want.index(stop)
        for m, burst in ((ref, 16), (model, 16), (model, 5), (model, 1)):
            async with m.session() as s:
                g = ar.generate(s, prompt, max_new_tokens=30, burst=burst)
                assert [t async for t in g] == want and g.stats.finish_reason == "length"
                assert g.position == free.position and g.stats.generated_tokens == 30
                g = ar.generate(s, prompt, max_new_tokens=30, stop=[stop], burst=burst)
                assert [t async for t in g] == want[: cut + 1] and g.stats.finish_reason == "stop"
                assert g.position == len(prompt) + cut, "the position is the host loop's after a stop"
                # the conversation goes on from there as it would after the host loop
                (logits,) = await s.execute(np.array([[stop]]), np.array([g.position]))
                assert int(logits.argmax()) == want[cut + 1]


@pytest.mark.anyio
async def test_bad_greedy_calls_change_nothing(llama):
    async with await ar.load(llama) as model, model.session() as s:
        with pytest.raises(InputError, match="n >= 1"):
            await s.greedy(np.array([[1]]), np.array([0]), n=0)
        with pytest.raises(InputError, match=f"do not fit the KV cache of {CONTEXT} positions"):
            await s.greedy(np.array([[1, 2]]), np.array([CONTEXT - 5]), n=5)
        ids = await s.greedy(np.array([[1, 2]]), np.array([0]), n=4)
        async with await ar.load(llama, batch_submits=False) as ref:
            assert ids.tolist() == await _host_loop(ref, np.array([1, 2]), 4)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_native_asyncio_cancel_leaves_every_session_consistent(llama):
    """Task.cancel() from outside anyio (as Ray Serve does when a client leaves) reaches through
    anyio's shield; the cancelled step must still complete, and the others go on exactly."""
    async with await ar.load(llama, batch_submits=False) as ref:
        want = await _host_loop(ref, np.array([3, 1, 4]), 20)
    async with await ar.load(llama) as model:
        sessions = [await model.open_session() for _ in range(3)]
        tasks = [asyncio.ensure_future(s.greedy(np.array([[3, 1, 4]]), np.array([0]), n=20)) for s in sessions]
        for _ in range(3):
            await asyncio.sleep(0)
        tasks[0].cancel()
        with anyio.fail_after(120):  # a lost owner would hang every later step: fail instead
            with pytest.raises(asyncio.CancelledError):
                await tasks[0]
            assert [(await t).tolist() for t in tasks[1:]] == [want, want]
            await sessions[0].aclose()
            async with model.session() as s:  # a new session on the freed slot, and the survivors, still run
                assert (await s.greedy(np.array([[3, 1, 4]]), np.array([0]), n=20)).tolist() == want
            assert (await sessions[1].greedy(np.array([[3, 1, 4]]), np.array([0]), n=20)).tolist() == want
