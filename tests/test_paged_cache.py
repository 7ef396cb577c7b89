"""The paged KV cache of a ragged model (async_runtime/batching.py, kernels/attention/kv_cache.py): every
session's keys and values in one pool of blocks of KV_BLOCK positions, allocated at load. A tiny
Llama of 200 positions (four blocks a session at most) in pools of a few blocks: sessions whose
blocks interleave and are reused after others close get, bitwise, the logits of a session with
contiguous caches (a model that does not batch); a step that finds no free block fails alone,
with the numbers, and runs once blocks are freed.
"""

import anyio
import numpy as np
import pytest

import async_runtime as ar
from async_runtime.kv_blocks import OutOfBlocks
from pte_wgpu.kernels.attention.kv_cache import KV_BLOCK
from pte_wgpu.kernels.matmul.routes import BITWISE_ROWS

from .test_batching import _alone, _same

pytestmark = pytest.mark.usefixtures("adapter")

CONTEXT = 200
CONFIG = dict(dim=64, n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=263)


def start_exports(tmp_path_factory):
    """Start this file's export (see tests/conftest.py), niced as test_fp16's."""
    from .llama import start_export

    start_export(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, nice=5, **CONFIG)


@pytest.fixture
def anyio_backend():
    """The pool's books are the same whatever the loop (the batching tests run both)."""
    return "asyncio"


@pytest.fixture(scope="module")
def pte(tmp_path_factory):
    from .llama import export_llama

    path, _ = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, **CONFIG)
    return path


async def _reference(pte, plans, prompts):
    """What each (prompt, decode steps) gets alone, from contiguous caches."""
    async with await ar.load(pte, batch_submits=False) as ref:
        assert ref.batching == "off"
        return [await _alone(ref, p, d, BITWISE_ROWS) for p, (_, d) in zip(prompts, plans)]


@pytest.mark.anyio
async def test_sessions_in_interleaved_and_reused_blocks_get_what_they_get_alone(pte):
    """Five sessions in a pool of 10 blocks: two long ones grow block by block while a short one
    takes a block between theirs and closes, and two later ones take it and the rest."""
    rng = np.random.default_rng(3)
    plans = [(97, 60), (131, 40), (5, 3), (61, 9), (2, 70)]  # prompt, decode steps: 3, 3, 1, 2 and 2 blocks
    prompts = [rng.integers(0, CONFIG["vocab_size"], n) for n, _ in plans]
    want = await _reference(pte, plans, prompts)
    async with await ar.load(pte, token_budget=BITWISE_ROWS, kv_positions=10 * KV_BLOCK) as model:
        assert model.batching == "ragged"
        got = [None] * len(plans)
        first_done = anyio.Event()

        async def run(i):
            if i >= 3:  # after the short one closed: they take its block
                await first_done.wait()
            got[i] = await _alone(model, prompts[i], plans[i][1], BITWISE_ROWS)
            if i == 2:
                first_done.set()

        async with anyio.create_task_group() as tg:
            for i in range(len(plans)):
                tg.start_soon(run, i)
        held = model._batcher.blocks.stats()
        assert held["used"] == 0 and held["free"] + held["cached"] == 10  # every block came back
    for i, (n, d) in enumerate(plans):
        _same(got[i], want[i], f"session {i} (prompt {n}, {d} decode steps)")


@pytest.mark.anyio
async def test_splits_merged_apart_give_what_the_last_to_arrive_gives(pte, monkeypatch):
    """GPU split-K attention over up to three splits of 64 keys, merged by a second dispatch (where
    storage barriers order only a workgroup's own accesses: async_runtime/backend.py, Dawn's
    compiler), gives each step's logits bitwise as its last workgroup to arrive merging them."""
    import async_runtime.backend as backend

    monkeypatch.setenv("PTE_WGPU_KERNELS", "gpu")
    rng = np.random.default_rng(6)
    plans = [(97, 40), (131, 20), (3, 2)]
    prompts = [rng.integers(0, CONFIG["vocab_size"], n) for n, _ in plans]
    async with await ar.load(pte, token_budget=BITWISE_ROWS) as model:
        want = [await _alone(model, p, d, BITWISE_ROWS) for p, (_, d) in zip(prompts, plans)]
    monkeypatch.setattr(backend, "MERGE_APART", True)
    async with await ar.load(pte, token_budget=BITWISE_ROWS) as model:
        assert not any("arrivals" in (d.shader or "") for d in model.graph.dispatches)
        got = [await _alone(model, p, d, BITWISE_ROWS) for p, (_, d) in zip(prompts, plans)]
    for i, (n, d) in enumerate(plans):
        _same(got[i], want[i], f"prompt {n}, {d} decode steps")


@pytest.mark.anyio
async def test_a_step_without_free_blocks_fails_alone_and_runs_once_blocks_are_freed(pte):
    rng = np.random.default_rng(4)
    plans = [(100, 28), (9, 4)]
    prompts = [rng.integers(0, CONFIG["vocab_size"], n) for n, _ in plans]
    want = await _reference(pte, plans, prompts)
    async with await ar.load(pte, token_budget=BITWISE_ROWS, kv_positions=2 * KV_BLOCK) as model:
        first = await model.open_session()
        for start in range(0, 100, BITWISE_ROWS):  # its prompt takes both blocks
            (out,) = await first.execute(prompts[0][None, start : start + BITWISE_ROWS], np.array([start]))
        assert first.memory() == 2 * sum(model._batcher.block_bytes.values())
        second = await model.open_session()
        with pytest.raises(ar.MemoryBudgetError, match="needed 1 KV cache blocks, 0 free") as caught:
            await second.execute(prompts[1][None], np.array([0]))
        assert isinstance(caught.value, OutOfBlocks) and second.memory() == 0
        logits, pos = [out], 100
        for _ in range(plans[0][1]):  # the first session decodes on, into its second block
            (out,) = await first.execute(np.array([[int(out.argmax())]]), np.array([pos]))
            logits.append(out)
            pos += 1
        _same(logits, want[0], "the session that holds the blocks")
        with pytest.raises(OutOfBlocks):  # past its second block: no third
            await first.execute(np.array([[int(out.argmax())]]), np.array([pos]))
        assert pos == 2 * KV_BLOCK and first.memory() == 2 * sum(model._batcher.block_bytes.values())
        await first.aclose()
        assert model._batcher.blocks.free_blocks() == 2
        _same(await _alone(model, prompts[1], plans[1][1]), want[1], "a session after the blocks came back")
        await second.aclose()


async def _decode(session, out, pos, steps):
    """Greedy decode steps after logits `out` for position `pos`: their logits."""
    logits = []
    for _ in range(steps):
        (out,) = await session.execute(np.array([[int(out.argmax())]]), np.array([pos]))
        logits.append(out)
        pos += 1
    return logits


@pytest.mark.anyio
async def test_prompts_that_start_alike_share_their_cached_blocks(pte):
    """A 150-token system prompt: the second prompt that starts with it runs only past its whole
    blocks while the first session still holds them, a prompt of exactly those blocks recomputes
    its last position into a copy of the shared block (the first session's own is left alone),
    and a prompt after the first session closed finds its blocks kept. Each gets bitwise what it
    gets alone with contiguous caches."""
    rng = np.random.default_rng(6)
    vocab = CONFIG["vocab_size"]
    system = rng.integers(0, vocab, 150)
    a, b = (np.concatenate([system, rng.integers(0, vocab, n)]) for n in (7, 11))
    c = system[: 2 * KV_BLOCK]
    plans = [(len(a), 6), (len(b), 4), (len(c), 3)]
    want = await _reference(pte, plans, [a, b, c])
    async with await ar.load(pte, token_budget=BITWISE_ROWS, kv_positions=10 * KV_BLOCK) as model:
        async with model.session() as first:
            (out,) = await first.execute(a[None], np.array([0]))
            got_a = [out] + await _decode(first, out, len(a), 3)
            got_c = await _alone(model, c, 3)  # shares a's blocks 0 and 1, writes position 127 into a copy of 1
            stats = model.statistics()
            assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (len(a) + len(c), 2 * KV_BLOCK - 1)
            got_a += await _decode(first, got_a[-1], len(a) + 3, 3)
        got_b = await _alone(model, b, 4)  # a's closed blocks 0 and 1, kept
        stats = model.statistics()
        assert stats.prefix_cache_hits == 2 * KV_BLOCK - 1 + 2 * KV_BLOCK
        assert stats.kv_blocks == 10 and stats.kv_blocks_used == 0 and stats.kv_blocks_cached >= 2
    for what, got, wanted in (("a", got_a, want[0]), ("b", got_b, want[1]), ("c", got_c, want[2])):
        _same(got, wanted, f"prompt {what}")


async def _generated(session, prompt, n, done=None):
    tokens = []
    async for token in ar.generate(session, prompt.tolist(), max_new_tokens=n):
        tokens.append(token)
        if done is not None:
            assert done.is_set(), "a generation ran before the blocks it reserved were free"
    return tokens


@pytest.mark.anyio
async def test_generations_wait_for_the_blocks_they_will_need(pte):
    """Two generations of 2 blocks each in a pool of 3: the second waits until the first ends,
    then both have the tokens they get alone; one longer than the whole pool fails at once."""
    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, CONFIG["vocab_size"], n) for n in (11, 6)]
    async with await ar.load(pte, batch_submits=False) as ref:
        want = [await _generated(ref.session(), p, 100) for p in prompts]
    async with await ar.load(pte, kv_positions=3 * KV_BLOCK) as model:
        got, first_done = [None, None], anyio.Event()

        async def first():
            async with model.session() as s:
                got[0] = await _generated(s, prompts[0], 100)
            first_done.set()

        async def second():
            await anyio.sleep(0.05)  # after the first reserved its blocks
            async with model.session() as s:
                got[1] = await _generated(s, prompts[1], 100, first_done)

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            tg.start_soon(second)
        assert got == want
        async with model.session() as s:
            with pytest.raises(OutOfBlocks, match="200 positions need 4 KV cache blocks; the pool has 3 in all"):
                await _generated(s, prompts[0], 3 * KV_BLOCK)
        async with model.session() as s:  # and the model goes on
            assert await _generated(s, prompts[1], 100) == want[1]


@pytest.mark.anyio
async def test_a_pool_of_four_contexts_serves_twelve_short_conversations_at_once(pte):
    """kv_positions of 4 whole contexts (where 4 whole-context slots would fit): 12 generations of
    64 positions each run together, each with the tokens it gets alone."""
    rng = np.random.default_rng(9)
    prompts = [rng.integers(0, CONFIG["vocab_size"], 4) for _ in range(12)]
    async with await ar.load(pte, batch_submits=False) as ref:
        want = [await _generated(ref.session(), p, 60) for p in prompts]
    async with await ar.load(pte, kv_positions=4 * CONTEXT, max_batch=16) as model:
        assert model.statistics().kv_blocks == 13
        got, peak = [None] * 12, [0]

        async def one(i):
            async with model.session() as s:
                tokens = []
                async for token in ar.generate(s, prompts[i].tolist(), max_new_tokens=60):
                    tokens.append(token)
                    peak[0] = max(peak[0], model.statistics().kv_blocks_used)
                got[i] = tokens

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
    assert peak[0] == 12  # all at once, a block each
    assert got == want


@pytest.mark.anyio
async def test_the_server_under_random_arrivals_cancellations_and_a_shared_system_prompt(pte):
    """12 completions on a 174-byte system prompt (two whole blocks) arrive at random times, 3 of
    their clients leave after the first piece; the pool holds 8 blocks (two requests' worth before
    they share). Every finished one has the text it gets alone, the shared blocks are hits, and
    every block and session comes back."""
    import httpx

    from async_runtime.llm.server import create_app

    from .byte_tokenizer import ByteTokenizer
    from .test_server import running, scrape

    system = "You are a helpful assistant. " * 6
    prompts = [system + f"question {i}?" for i in range(12)]
    leaving = {2, 5, 9}
    rng = np.random.default_rng(10)
    arrivals = rng.uniform(0, 0.5, len(prompts))
    async with await ar.load(pte, token_budget=BITWISE_ROWS, kv_positions=8 * KV_BLOCK) as model:
        app = create_app(model, ByteTokenizer(), model_name="tiny", max_sessions=4, max_waiting=16, max_tokens=8)
        async with running(app) as url, httpx.AsyncClient(base_url=url, timeout=120) as client:

            async def complete(prompt):
                r = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0})
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["text"]

            alone = [await complete(p) for p in prompts]
            got = {}

            async def client_of(i):
                await anyio.sleep(arrivals[i])
                if i not in leaving:
                    got[i] = await complete(prompts[i])
                    return
                body = {"prompt": prompts[i], "max_tokens": 8, "temperature": 0, "stream": True}
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            break  # leave mid-stream: the connection closes

            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(client_of, i)
            with anyio.fail_after(10):
                while len(model._sessions) > 1 or model.statistics().kv_blocks_used:
                    await anyio.sleep(0.02)
            metrics = await scrape(client)
    assert got == {i: alone[i] for i in range(len(prompts)) if i not in leaving}
    assert metrics[("pte_wgpu:prefix_cache_hits_total", ())] >= 2 * KV_BLOCK * (len(prompts) - 1 + len(got))
    assert metrics[("pte_wgpu:kv_blocks_used", ())] == 0 and metrics[("pte_wgpu:kv_blocks_cached", ())] >= 2


@pytest.mark.anyio
async def test_a_reservation_with_its_prompt_sets_aside_only_what_it_does_not_share(pte):
    """A session that sets its blocks aside with the prompt it will start from shares at once the
    whole blocks another live session holds for the same start (a system prompt) and sets aside
    only the rest: admitted where the whole generation's blocks are not free, it gets what it gets
    alone, and the prefix cache counts its hit once; a prompt set aside twice is looked up once."""
    vocab = CONFIG["vocab_size"]
    rng = np.random.default_rng(12)
    system = rng.integers(0, vocab, 2 * KV_BLOCK)
    first, later = (np.concatenate([system, rng.integers(0, vocab, n)]) for n in (9, 5))
    want = (await _reference(pte, [(len(later), 4)], [later]))[0]
    async with await ar.load(pte, token_budget=BITWISE_ROWS, kv_positions=5 * KV_BLOCK) as model:
        async with model.session() as holder, model.session() as s:
            await holder.execute(first[None], np.array([0]))  # 3 blocks held, 2 of them whole
            with pytest.raises(OutOfBlocks):
                await s.reserve(CONTEXT, wait=False)  # 4 blocks, 2 free
            hits = model.statistics().prefix_cache_hits
            await s.reserve(CONTEXT, wait=False, prompt=later)  # the system prompt's 2 shared, 2 set aside
            assert model._batcher.blocks.free_blocks() == 0
            (out,) = await s.execute(later[None], np.array([0]))
            got, pos = [out], len(later)
            for _ in range(4):
                (out,) = await s.execute(np.array([[int(out.argmax())]]), np.array([pos]))
                got.append(out)
                pos += 1
            assert model.statistics().prefix_cache_hits - hits == 2 * KV_BLOCK
        async with model.session() as fresh:  # a prompt nobody holds, set aside twice (the server's, then generate's)
            prompt = rng.integers(0, vocab, 7)
            queries = model.statistics().prefix_cache_queries
            await fresh.reserve(40, prompt=prompt)
            await fresh.reserve(40, prompt=prompt)
            await fresh.execute(prompt[None], np.array([0]))
            assert model.statistics().prefix_cache_queries - queries == len(prompt)  # looked up once
    _same(got, want, "the later prompt")


@pytest.mark.anyio
async def test_requests_waiting_for_blocks_are_in_the_servers_line(pte):
    """While the pool is full, requests that hold a session wait in the `max_waiting` line, not
    as running ones; past that line a request gets 429 though sessions are free, one longer than
    the whole pool gets 400, and once blocks are freed the waiting ones get what they get alone."""
    import httpx

    from async_runtime.llm.server import create_app

    from .byte_tokenizer import ByteTokenizer
    from .test_server import running, scrape

    prompts = [f"question {i}?" for i in range(3)]
    body = dict(max_tokens=8, temperature=0)
    async with await ar.load(pte, token_budget=BITWISE_ROWS, kv_positions=3 * KV_BLOCK) as model:
        app = create_app(model, ByteTokenizer(), model_name="tiny", max_sessions=4, max_waiting=2, max_tokens=8)
        async with running(app) as url, httpx.AsyncClient(base_url=url, timeout=120) as client:

            async def complete(prompt):
                return await client.post("/v1/completions", json={"prompt": prompt, **body})

            alone = [(await complete(p)).json()["choices"][0]["text"] for p in prompts[:2]]
            got = {}
            async with model.session() as holder:
                await holder.reserve(3 * KV_BLOCK)  # the whole pool

                async def waiting(i):
                    got[i] = await complete(prompts[i])

                async with anyio.create_task_group() as tg:
                    for i in range(2):
                        tg.start_soon(waiting, i)
                    with anyio.fail_after(20):
                        while (await scrape(client))[("pte_wgpu:num_requests_waiting", ())] < 2:
                            await anyio.sleep(0.02)
                    metrics = await scrape(client)
                    assert metrics[("pte_wgpu:num_requests_running", ())] == 0
                    busy = await complete(prompts[2])
                    assert busy.status_code == 429, busy.text
                    assert "0 requests are generating and 2 are waiting" in busy.json()["error"]["message"]
                    too_long = await client.post("/v1/completions", json={**body, "prompt": "x" * 150, "max_tokens": 49})
                    assert too_long.status_code == 400, too_long.text
                    assert "199 positions need 4 KV cache blocks; the pool has 3" in too_long.json()["error"]["message"]
                    assert not got
                    await holder.aclose()
        assert [got[i].json()["choices"][0]["text"] for i in range(2)] == alone
        assert model.statistics().kv_blocks_used == 0


@pytest.mark.anyio
async def test_random_steps_rewinds_and_shared_prompts_match_contiguous_caches(pte):
    """Four sessions, one step at a time in random order, against the same steps on a model of
    contiguous caches: prompts from a few shared beginnings (prefix hits, copies of shared blocks),
    decode steps, rewinds to an earlier position with another token (into shared blocks too),
    closes and reopens. A pool of 6 blocks: some steps find none and fail alone, and the session
    goes on from before the positions the step was to write; every logit is bitwise equal."""
    rng = np.random.default_rng(11)
    vocab = CONFIG["vocab_size"]
    beginnings = [rng.integers(0, vocab, n) for n in (70, 130)]
    async with await ar.load(pte, batch_submits=False) as ref, \
            await ar.load(pte, token_budget=BITWISE_ROWS, kv_positions=6 * KV_BLOCK) as model:
        pairs, ends = [[ref.session(), await model.open_session()] for _ in range(4)], [0] * 4
        compared = refused = 0
        for _ in range(160):
            i = int(rng.integers(4))
            ref_s, s = pairs[i]
            roll = rng.random()
            if roll < 0.05:  # close and reopen
                await s.aclose()
                await ref_s.aclose()
                pairs[i], ends[i] = [ref.session(), await model.open_session()], 0
                continue
            if ends[i] == 0 or roll < 0.15:  # a new prompt from position 0
                start = beginnings[int(rng.integers(2))]
                tokens, pos = np.concatenate([start[: int(rng.integers(1, len(start) + 1))], rng.integers(0, vocab, int(rng.integers(1, 9)))]), 0
            elif roll < 0.25:  # rewind: another token at an earlier position
                tokens, pos = rng.integers(0, vocab, 1), int(rng.integers(0, ends[i]))
            else:
                tokens, pos = rng.integers(0, vocab, int(rng.integers(1, 9))), ends[i]
            if pos + len(tokens) > CONTEXT:
                continue
            try:
                (got,) = await s.execute(tokens[None], np.array([pos]))
            except OutOfBlocks:  # the positions it was to overwrite are forgotten
                refused, ends[i] = refused + 1, min(ends[i], pos)
                continue
            for at in range(0, len(tokens), BITWISE_ROWS):  # the rows of a pass the token budget takes
                (want,) = await ref_s.execute(tokens[None, at : at + BITWISE_ROWS], np.array([pos + at]))
            np.testing.assert_array_equal(got, want)
            compared, ends[i] = compared + 1, pos + len(tokens)
        stats = model.statistics()
        model._batcher.blocks._check()
    assert compared > 100 and refused > 0 and stats.prefix_cache_hits > 0


@pytest.mark.anyio
async def test_positions_a_step_skips_read_as_a_new_caches_zeros(pte):
    """A session that jumps past its last position, in a block another session filled before:
    the skipped positions read as zeros, as in a new contiguous cache (not the other's keys)."""
    rng = np.random.default_rng(12)
    prompt, filler = rng.integers(0, CONFIG["vocab_size"], 5), rng.integers(0, CONFIG["vocab_size"], 60)
    async with await ar.load(pte, batch_submits=False) as ref:
        async with ref.session() as s:
            await s.execute(prompt[None], np.array([0]))
            (want,) = await s.execute(np.array([[7]]), np.array([9]))
    async with await ar.load(pte, kv_positions=2 * KV_BLOCK) as model:
        async with model.session() as other:  # fills a block, then gives it back
            await other.execute(filler[None], np.array([0]))
        async with model.session() as s:
            await s.execute(prompt[None], np.array([0]))
            (got,) = await s.execute(np.array([[7]]), np.array([9]))
    np.testing.assert_array_equal(got, want)
