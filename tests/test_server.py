"""The OpenAI-compatible server with real clients (httpx and the openai package) on loopback."""

import json
import logging
import socket
from contextlib import aclosing, asynccontextmanager

import anyio
import httpx
import pytest

import async_runtime as ar
from async_runtime.llm.engine import Piece, text_pieces
from async_runtime.llm.server import create_app, serve
from async_runtime.tools.cli import main as cli

from .byte_tokenizer import ByteTokenizer
from .test_llama import recorded

pytestmark = pytest.mark.usefixtures("adapter")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@asynccontextmanager
async def running(app):
    """The base url of `app` served on loopback until the block ends."""
    port = free_port()
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, app, "127.0.0.1", port, stop.wait)
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as client:
            with anyio.fail_after(20):
                while True:
                    try:
                        if (await client.get(url + "/health")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await anyio.sleep(0.05)
        yield url
        stop.set()


@pytest.fixture
async def model(tmp_path_factory):
    pte, _ = recorded("fp32", tmp_path_factory)
    async with await ar.load(pte) as model:
        yield model


def tiny_app(model, **options):
    return create_app(model, ByteTokenizer(), model_name="tiny", max_sessions=4, max_waiting=4, max_tokens=8, **options)


@pytest.fixture
async def server(model):
    """(base url, model) of a server running on loopback for the test's duration."""
    async with running(tiny_app(model)) as url:
        yield url, model


async def scrape(client):
    """{(name, labels as a sorted tuple): value} from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    r = await client.get("/metrics")
    assert r.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


async def test_health_models_and_a_completion(server):
    url, model = server
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        assert (await client.get("/v1/models")).json()["data"][0]["id"] == "tiny"
        r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 5, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "text_completion" and body["usage"]["prompt_tokens"] == 5
        assert body["choices"][0]["finish_reason"] in ("length", "stop")


async def test_openai_client_streams_8_chats_at_once(server):
    from openai import AsyncOpenAI

    url, model = server
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    results = {}

    async def chat(i):
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"question {i}"}], stream=True,
            max_tokens=6, temperature=0,
        )
        chunks = [c async for c in stream]
        results[i] = chunks

    async with anyio.create_task_group() as tg:  # 4 generate at once, 4 wait their turn
        for i in range(8):
            tg.start_soon(chat, i)
    assert sorted(results) == list(range(8))
    for chunks in results.values():
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    await client.close()
    assert len(model._sessions) == 1  # only the default session is left open


async def test_bad_requests_get_400_with_a_message(server):
    url, _ = server
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        r = await client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        r = await client.post("/v1/chat/completions", json={"messages": "hi"})
        assert r.status_code == 400 and "'messages'" in r.json()["error"]["message"]
        r = await client.post("/v1/completions", json={"prompt": "x", "temperature": "hot"})
        assert r.status_code == 400 and "'temperature'" in r.json()["error"]["message"]
        r = await client.post("/v1/completions", json={"prompt": "x" * 60})
        assert r.status_code == 400 and "context holds 48" in r.json()["error"]["message"]


async def test_sampling_parameters_reach_the_gpu_sampler(server):
    """A seeded request is repeatable; logit_bias and the penalties take effect; what the API
    allows and the server does not give is a 400 naming it."""
    url, model = server
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        async def text(**body):
            r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 8, "ignore_eos": True, **body})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        seeded = [await text(temperature=0.9, top_p=0.95, seed=s) for s in (7, 7, 8)]
        assert seeded[0] == seeded[1] != seeded[2]
        assert await text(logit_bias={str(ord("z")): 100}) == "z" * 8  # the server's default: temperature 1
        assert len(set(await text(temperature=0, frequency_penalty=2.0, logit_bias={str(t): -100 for t in range(128, 257)}))) > 1
        await text(min_p=0.1, top_k=20, presence_penalty=-1.5, repetition_penalty=1.3, seed=3)
        await text(repeat_penalty=1.1, n=1, logprobs=None)
        for body, words in [({"n": 2}, "'n' other than 1"), ({"best_of": 3}, "'best_of' other than 1"),
                            ({"logprobs": 1}, "'logprobs'"), ({"top_logprobs": 2}, "'top_logprobs'"),
                            ({"logit_bias": {"abc": 1}}, "'logit_bias' key 'abc'"), ({"logit_bias": {"300": 1}}, "ids run from 0 to 256"),
                            ({"logit_bias": {"5": 101}}, "from -100 to 100"), ({"logit_bias": [1, 2]}, "must be an object"),
                            ({"presence_penalty": 3}, "'presence_penalty' must be between -2.0 and 2.0"),
                            ({"min_p": 2}, "'min_p'"), ({"repetition_penalty": 0}, "'repetition_penalty'")]:
            r = await client.post("/v1/completions", json={"prompt": "x", **body})
            assert r.status_code == 400 and words in r.json()["error"]["message"], (body, r.text)
        r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "logprobs": True})
        assert r.status_code == 400 and "'logprobs'" in r.json()["error"]["message"]
        r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "logprobs": False, "max_tokens": 2})
        assert r.status_code == 200


async def test_overload_gets_429(server):
    url, _ = server
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        statuses = []

        async def post():
            r = await client.post("/v1/completions", json={"prompt": "load", "max_tokens": 8})
            statuses.append(r.status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(16):  # 4 running + 4 waiting, the rest are turned away
                tg.start_soon(post)
        assert 429 in statuses and 200 in statuses
        metrics = await scrape(client)
        assert metrics[("pte_wgpu:http_responses_total", (("path", "/v1/completions"), ("status", "429")))] == statuses.count(429)
        assert metrics[("pte_wgpu:num_requests_running", ())] == 0


async def test_a_client_that_disconnects_frees_its_session(server):
    url, model = server
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        body = {"messages": [{"role": "user", "content": "a long answer"}], "stream": True, "max_tokens": 30}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            got = 0
            async for line in lines:
                if line.startswith("data: {"):
                    json.loads(line[6:])
                    got += 1
                if got == 2:
                    break  # leave mid-stream: the connection closes
        with anyio.fail_after(10):
            while len(model._sessions) > 1:
                await anyio.sleep(0.02)
        r = await client.post("/v1/completions", json={"prompt": "still here", "max_tokens": 3})
        assert r.status_code == 200


async def test_metrics_follow_a_stream_and_count_its_tokens(server, monkeypatch):
    from async_runtime.llm import engine

    url, model = server
    scraped, text_pieces = anyio.Event(), engine.text_pieces

    async def held_after_the_first_burst(*args):
        """The stream's tokens wait for the scrape after the first burst: a burst may hold them all."""
        async with aclosing(text_pieces(*args)) as batches:
            async for batch in batches:
                yield batch
                await scraped.wait()

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 5, "temperature": 0})
        first = r.json()["usage"]
        monkeypatch.setattr(engine, "text_pieces", held_after_the_first_burst)
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 30, "temperature": 0}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.aiter_lines()
            async for line in lines:
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    break  # one token is out: the request holds its slot now
            during = await scrape(client)
            scraped.set()
            rest = [line async for line in lines]
        assert rest[-2:] == ["data: [DONE]", ""]
        with anyio.fail_after(10):
            while (after := await scrape(client))[("pte_wgpu:kv_slots_used", ())]:
                await anyio.sleep(0.02)
    assert during[("pte_wgpu:num_requests_running", ())] == 1 and during[("pte_wgpu:kv_slots_used", ())] == 1
    assert during[("pte_wgpu:gpu_memory_bytes", (("part", "sessions"),))] > 0
    assert during[("pte_wgpu:kv_blocks_used", ())] == 1 and after[("pte_wgpu:kv_blocks_used", ())] == 0
    assert during[("pte_wgpu:kv_cache_usage_perc", ())] == 1 / during[("pte_wgpu:kv_blocks", ())]
    assert during[("pte_wgpu:gpu_memory_bytes", (("part", "model"),))] == model.memory()
    assert after[("pte_wgpu:gpu_memory_bytes", (("part", "sessions"),))] == 0
    chat_prompt = len(ByteTokenizer().chat([{"role": "user", "content": "hi"}]))
    assert after[("pte_wgpu:prompt_tokens_total", ())] == first["prompt_tokens"] + chat_prompt
    assert after[("pte_wgpu:generation_tokens_total", ())] > first["completion_tokens"] == 5
    assert after[("pte_wgpu:prefix_cache_queries_total", ())] >= first["prompt_tokens"] + chat_prompt
    assert after[("pte_wgpu:time_to_first_token_seconds_count", ())] == 2
    assert after[("pte_wgpu:request_success_total", (("finished_reason", "length"),))] == 2
    assert after[("pte_wgpu:e2e_request_latency_seconds_count", ())] == 2
    assert after[("pte_wgpu:gpu_submits_total", ())] == model.statistics().submits > 0


async def test_an_api_key_is_required_on_v1_and_nowhere_else(model):
    from openai import AsyncOpenAI, AuthenticationError

    async with running(tiny_app(model, api_key="s3cret")) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
        r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 401 and "missing API key" in r.json()["error"]["message"]
        assert r.headers["www-authenticate"] == "Bearer"
        r = await client.get("/v1/models", headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"] == {"message": "invalid API key", "type": "authentication_error"}
        assert (await client.get("/health")).status_code == 200 and (await client.get("/metrics")).status_code == 200
        async with AsyncOpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0) as bad:
            with pytest.raises(AuthenticationError):
                await bad.models.list()
        good = AsyncOpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0, timeout=60)
        answer = await good.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=0)
        assert answer.usage.completion_tokens == 2
        await good.close()


async def test_a_body_over_the_limit_gets_413_and_the_server_goes_on(model):
    async with running(tiny_app(model, max_body_bytes=200)) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
        r = await client.post("/v1/completions", json={"prompt": "x" * 300})
        assert r.status_code == 413 and "limit of 200 bytes" in r.json()["error"]["message"]

        async def chunked():  # no content-length: the limit is counted as the body comes
            for _ in range(5):
                yield b"x" * 60

        r = await client.post("/v1/completions", content=chunked(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        r = await client.post("/v1/completions", json={"prompt": "fits", "max_tokens": 2})
        assert r.status_code == 200
        metrics = await scrape(client)
        assert metrics[("pte_wgpu:http_responses_total", (("path", "/v1/completions"), ("status", "413")))] == 2


async def test_one_json_log_line_per_request(server, caplog):
    url, _ = server
    caplog.set_level(logging.INFO, logger="pte_wgpu.requests")
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4, "temperature": 0},
                              headers={"x-request-id": "req-42"})
        assert r.headers["x-request-id"] == "req-42" and r.json()["id"] == "cmpl-req-42"
        await client.post("/v1/completions", json={"prompt": 3})

    def lines():  # a line is written once its response is sent: it may come just after the client's answer
        return [json.loads(r.getMessage()) for r in caplog.records if r.name == "pte_wgpu.requests" and "/v1/" in r.getMessage()]

    with anyio.fail_after(5):
        while len(lines()) < 2:
            await anyio.sleep(0.01)
    done, bad = lines()
    assert done["request_id"] == "req-42" and done["method"] == "POST" and done["status"] == 200
    assert (done["prompt_tokens"], done["completion_tokens"], done["finish_reason"]) == (5, 4, "length")
    assert 0 < done["ttft_s"] <= done["duration_s"]
    assert bad["status"] == 400 and bad["ttft_s"] is None and len(bad["request_id"]) == 24


def test_the_cli_refuses_an_open_port_without_a_key(capsys, monkeypatch):
    monkeypatch.delenv("PTE_WGPU_API_KEY", raising=False)
    assert cli(["serve", "missing.pte", "--host", "0.0.0.0"]) == 2
    assert "refusing to serve on 0.0.0.0 without an API key" in capsys.readouterr().err


def test_the_cli_loads_at_the_precision_it_is_given(capsys, monkeypatch):
    """`serve --precision f16-sums` and `--batch-variant` reach load(); a precision load() has not
    is refused by name."""
    from async_runtime.llm.tokenizer import Tokenizer

    asked = []

    async def load(pte, **kwargs):
        asked.append(kwargs)
        raise RuntimeError("loaded no further")

    monkeypatch.setattr(ar, "load", load)
    monkeypatch.setattr(Tokenizer, "for_model", staticmethod(lambda pte: ByteTokenizer()))
    with pytest.raises(RuntimeError, match="loaded no further"):
        cli(["serve", "some.pte", "--precision", "f16-sums"])
    with pytest.raises(RuntimeError, match="loaded no further"):
        cli(["serve", "some.pte", "--batch-variant"])
    assert asked == [{"precision": "f16-sums", "batch_invariant": True}, {"precision": "auto", "batch_invariant": False}]
    with pytest.raises(SystemExit):
        cli(["serve", "some.pte", "--precision", "f16"])
    assert "invalid choice: 'f16'" in capsys.readouterr().err


async def test_a_lost_device_ends_the_stream_and_fails_the_health_check(model):
    async with running(tiny_app(model)) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 30}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            events = []
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    if len(events) == 1:
                        # mid-stream, at the role's chunk: by the first text's, the tiny model's two
                        # remaining bursts may already be read back, and the stream then ends well
                        model.device.destroy()
        assert "the GPU device was lost" in events[-1]["error"]["message"]
        r = await client.get("/health")  # what a Ray replica's check_health reports too: it gets replaced
        assert r.status_code == 503 and r.json()["status"] == "unhealthy"
        r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 503 and "the GPU device was lost" in r.json()["error"]["message"]


class EveryTokenStops(ByteTokenizer):
    stop_ids = set(range(257))


async def test_ignore_eos_generates_max_tokens_past_stop_tokens(model):
    app = create_app(model, EveryTokenStops(), model_name="tiny", max_sessions=4, max_waiting=4, max_tokens=8)
    async with running(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
        body = {"prompt": "hello", "max_tokens": 7, "temperature": 0}
        stopped = (await client.post("/v1/completions", json=body)).json()
        assert stopped["choices"][0]["finish_reason"] == "stop" and stopped["usage"]["completion_tokens"] <= 1
        r = await client.post("/v1/completions", json=dict(body, ignore_eos=True))
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 7 and r.json()["choices"][0]["finish_reason"] == "length"
        r = await client.post("/v1/completions", json=dict(body, ignore_eos="yes"))
        assert r.status_code == 400 and "ignore_eos" in r.text


def pieces_token_by_token(tokenizer, ids, stop_strings):
    """The pieces of decoding all the ids at every token and cutting at the first stop string."""
    pieces, sent = [], ""
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k])
        if text.endswith("\ufffd"):
            continue
        cut = min((text.find(s) for s in stop_strings if s in text), default=-1)
        if cut >= 0:
            return pieces + [Piece(text[len(sent):cut], "stop", k)]
        if text[len(sent):]:
            pieces.append(Piece(text[len(sent):], None, k))
            sent = text
    return pieces + [Piece("", "length", len(ids))]


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.9, top_p=0.95, seed=11)], ids=["greedy", "sampled"])
async def test_text_pieces_come_a_burst_at_a_time_as_token_by_token(model, sampling):
    """Stop strings cut a burst's text where a token-by-token loop would, sampled as greedy."""
    tokenizer = ByteTokenizer()
    prompt = tokenizer.encode("hello")
    settings = dict(max_new_tokens=40, ignore_eos=True, **sampling)
    async with model.session() as session:
        ids = [t async for t in ar.generate(session, prompt, max_new_tokens=40, **sampling)]
    text = tokenizer.decode(ids)
    for stop_strings in ([], [text[20:22], "never"], [text[3:5]]):
        async with model.session() as session:
            batches = [b async for b in text_pieces(session, tokenizer, prompt, settings, stop_strings)]
        pieces = [p for b in batches for p in b]
        assert pieces == pieces_token_by_token(tokenizer, ids, stop_strings)
        burst = lambda tokens: 0 if tokens == 1 else 1 + (tokens - 2) // 16  # the first token, then bursts of 16
        assert model.gpu_sampling and all(len({burst(p.tokens) for p in batch}) == 1 for batch in batches)
        assert max(len(batch) for batch in batches) > 1  # a list holds a burst's pieces
