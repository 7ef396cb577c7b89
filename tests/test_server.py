"""The OpenAI-compatible server with real clients (httpx and the openai package) on loopback."""

import json
import socket

import anyio
import httpx
import pytest

import async_runtime as ar
from async_runtime.llm.server import create_app, serve

from .test_llama import recorded

pytestmark = pytest.mark.usefixtures("adapter")


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255 and id 256 as the end of a turn: the tiny Llama's 257."""

    stop_ids = {256}

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", "replace")

    def chat(self, messages):
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"
        return self.encode(text)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def server(tmp_path_factory):
    """(base url, model) of a server running on loopback for the test's duration."""
    pte, _ = recorded("fp32", tmp_path_factory)
    async with await ar.load(pte) as model:
        app = create_app(model, ByteTokenizer(), model_name="tiny", max_sessions=4, max_waiting=4, max_tokens=8)
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
            yield url, model
            stop.set()


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
