"""The server on Ray Serve: a local Ray cluster of two simulated nodes on loopback, one lavapipe
replica of the tiny Llama on each, real clients through Ray's HTTP proxy."""

import json
import os
import threading
from pathlib import Path

import anyio
import httpx
import pytest

from .byte_tokenizer import ByteTokenizer
from .test_llama import recorded
from .test_server import free_port, model, running, scrape, tiny_app  # noqa: F401 (model is a fixture)

# Ray resolves 127.0.0.1 to the host's address, which the cluster would then use (and this sandbox may not
# reach); set before Ray is imported, this keeps every node, the proxy and the clients on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

pytestmark = pytest.mark.usefixtures("adapter")
REPLICAS, SESSIONS, WAITING = 2, 2, 4  # per replica, and the cluster's waiting line
CHAT = [{"role": "user", "content": "tell me"}]


@pytest.fixture
def anyio_backend():
    """The client side runs on asyncio only: the cluster is the same whatever the test's loop."""
    return "asyncio"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The base url of the cluster's HTTP proxy; Ray and the cluster go away after the module."""
    from ray.cluster_utils import Cluster

    from async_runtime.llm.cluster import APP_NAME, application

    pte = tmp_path_factory.mktemp("cluster") / "tiny.pte"
    pte.write_bytes(recorded("fp32", tmp_path_factory)[0])
    saved = dict(os.environ)
    # Ray's workers import this checkout (not another one installed in the venv) and the tests' tokenizer.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parents[1]), saved.get("PYTHONPATH")]))
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", XDG_RUNTIME_DIR=saved.get("XDG_RUNTIME_DIR", "/tmp"))
    # Serve gives a starting proxy 5 s before it kills and restarts it; on a busy two-core machine a worker
    # process can take longer than that to start, and every restart then dies the same way.
    os.environ.update(RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S="50", RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S="30")
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                          "node_ip_address": "127.0.0.1"})
    nodes.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    # serve.start waits 60 s for the HTTP proxy, a constant of Ray's, not a setting; a busy two-core
    # machine can take longer to start its worker
    from ray.serve._private import api as serve_api

    proxy_wait, serve_api.HTTP_PROXY_TIMEOUT = serve_api.HTTP_PROXY_TIMEOUT, 240
    try:
        ray.init(address=nodes.address, log_to_driver=False)
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        app = application(pte, ByteTokenizer(), replicas=REPLICAS, use_gpus=False, max_sessions=SESSIONS,
                          max_waiting=WAITING, max_tokens=8, model_name="tiny")
        deployed = threading.Thread(target=serve.run, args=(app,), kwargs=dict(name=APP_NAME, route_prefix="/"), daemon=True)
        deployed.start()
        deployed.join(timeout=180)  # Ray retries a failing replica's constructor for a long time
        assert not deployed.is_alive(), "the replicas did not start within 3 minutes (see /tmp/ray/session_latest/logs)"
        yield f"http://127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        nodes.shutdown()
        serve_api.HTTP_PROXY_TIMEOUT = proxy_wait
        os.environ.clear()
        os.environ.update(saved)


async def chat_answers(url, n, max_tokens):
    """{i: (text, finish reason)} of `n` streamed greedy chats at once through the openai client."""
    from openai import AsyncOpenAI

    answers = {}

    async def one(client, i):
        messages = [{"role": "user", "content": f"question {i}"}]
        stream = await client.chat.completions.create(model="tiny", messages=messages, stream=True,
                                                      max_tokens=max_tokens, temperature=0)
        chunks = [c async for c in stream]
        answers[i] = ("".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason)

    async with AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120) as client:
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, client, i)
    return answers


async def test_8_streamed_chats_answer_as_one_local_server_does(cluster, model):
    with anyio.fail_after(120):
        on_cluster = await chat_answers(cluster, 8, 8)  # 4 generate, 4 wait in the ingress's queue
    async with running(tiny_app(model)) as url:
        local = await chat_answers(url, 8, 8)
    assert on_cluster == local
    assert all(finish in ("length", "stop") for _, finish in on_cluster.values())
    async with httpx.AsyncClient(base_url=cluster, timeout=30) as client:
        with anyio.fail_after(30):  # both replicas report their memory to the ingress
            while (await scrape(client))[("pte_wgpu:gpu_memory_bytes", (("part", "model"),))] != REPLICAS * model.memory():
                await anyio.sleep(0.5)
        metrics = await scrape(client)
    assert metrics[("pte_wgpu:time_to_first_token_seconds_count", ())] == 8
    assert metrics[("pte_wgpu:kv_slots_max", ())] == REPLICAS * SESSIONS


async def test_a_full_cluster_answers_429_like_one_server(cluster):
    async with httpx.AsyncClient(base_url=cluster, timeout=120) as client:
        answers = []

        async def post():
            r = await client.post("/v1/completions", json={"prompt": "load", "max_tokens": 8})
            answers.append((r.status_code, r.json() if r.headers.get("content-type") == "application/json" else r.text))

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for _ in range(16):  # 4 generate, 4 wait, the rest are turned away
                    tg.start_soon(post)
    assert {status for status, _ in answers} == {200, 429}, answers
    busy = [body for status, body in answers if status == 429]
    assert busy and any(status == 200 for status, _ in answers)
    assert all(b["error"]["type"] == "server_busy" and b["error"]["message"].startswith("the server is busy: ") for b in busy)


def replica_actors():
    return [a for a in ray.util.list_named_actors(all_namespaces=True) if "ModelReplica" in a["name"]]


async def test_a_killed_replica_ends_its_streams_with_an_error_and_comes_back(cluster):
    async def stream(client, i, events):
        # sampled, so tokens come one a step (greedy decoding delivers a whole GPU burst at once and
        # could finish these streams before the kill lands)
        body = {"messages": CHAT, "stream": True, "max_tokens": 28, "temperature": 0.8, "seed": i}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    events[i].append(json.loads(line[6:]))

    events = {i: [] for i in range(REPLICAS * SESSIONS)}  # every slot of both replicas
    async with httpx.AsyncClient(base_url=cluster, timeout=120) as client:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in events:
                    tg.start_soon(stream, client, i, events)
                while not all(events.values()):
                    await anyio.sleep(0.02)  # every stream is admitted (its first event: the role), the kill lands while they run
                victim = replica_actors()[0]
                await anyio.to_thread.run_sync(lambda: ray.kill(ray.get_actor(victim["name"], victim["namespace"]), no_restart=True))
        failed = [e[-1]["error"]["message"] for e in events.values() if "error" in e[-1]]
        finished = [e for e in events.values() if "error" not in e[-1]]
        assert failed and all("the replica serving this request failed" in m for m in failed)
        assert finished and all(e[-1]["choices"][0]["finish_reason"] for e in finished)  # the other replica went on
        with anyio.fail_after(90):  # Ray Serve replaces the dead replica
            while len(replica_actors()) < REPLICAS or victim in replica_actors():
                await anyio.sleep(0.5)
            while (await client.get("/health")).status_code != 200:
                await anyio.sleep(0.5)
        again = await chat_answers(cluster, REPLICAS * SESSIONS, 4)
        assert len(again) == REPLICAS * SESSIONS and all(finish in ("length", "stop") for _, finish in again.values())


async def test_clients_that_leave_free_their_slots_on_the_replicas(cluster):
    body = {"messages": CHAT, "stream": True, "max_tokens": 28}

    async def leave_after_a_token(client):
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    break  # the connection closes mid-stream

    sessions = ("pte_wgpu:gpu_memory_bytes", (("part", "sessions"),))
    async with httpx.AsyncClient(base_url=cluster, timeout=60) as client:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(REPLICAS * SESSIONS):  # every slot of the cluster: a leaked one would show
                    tg.start_soon(leave_after_a_token, client)
            while (metrics := await scrape(client))[sessions] or metrics[("pte_wgpu:num_requests_running", ())]:
                await anyio.sleep(0.5)  # the replicas report every 2 s
    with anyio.fail_after(30):
        again = await chat_answers(cluster, REPLICAS * SESSIONS, 4)
    assert len(again) == REPLICAS * SESSIONS


async def test_the_ingress_line_admits_first_come_first_and_hands_freed_slots_on():
    from async_runtime.llm.cluster import SlotGate

    capacity = [2]
    gate = SlotGate(lambda: capacity[0])
    await gate.acquire()
    await gate.acquire()
    admitted = []

    async def request(i):
        await gate.acquire()
        admitted.append(i)

    async with anyio.create_task_group() as tg:
        scopes = {}
        for i in range(5):
            scopes[i] = anyio.CancelScope()

            async def waiter(i=i):
                with scopes[i]:
                    await request(i)
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
        assert gate.waiting() == 5 and admitted == []
        scopes[1].cancel()  # leaves the line before its turn
        await anyio.wait_all_tasks_blocked()
        assert gate.waiting() == 4
        gate.release()
        await anyio.wait_all_tasks_blocked()
        assert admitted == [0]
        scopes[2].cancel()  # cancelled, and its slot handed over before it runs: it passes the slot on
        gate.release()
        await anyio.wait_all_tasks_blocked()
        assert admitted == [0, 3] and gate.taken == 2
        capacity[0] = 3  # a replica joins
        gate.admit()
        await anyio.wait_all_tasks_blocked()
        assert admitted == [0, 3, 4] and gate.waiting() == 0 and gate.taken == 3


def test_a_replicas_refusals_reach_the_server_as_its_own_errors():
    """What a replica raises before it admits a request comes through Ray as the exception the HTTP
    layer answers: Busy (429), OutOfBlocks (400, with the replica's message), else GenerationFailed."""
    from ray.exceptions import RayTaskError

    from async_runtime.kv_blocks import OutOfBlocks
    from async_runtime.llm.cluster import _as_busy_or_failed
    from async_runtime.llm.engine import Busy, GenerationFailed

    def through_ray(error):
        return RayTaskError("generate", "Traceback (most recent call last): ...", error).as_instanceof_cause()

    too_long = _as_busy_or_failed(through_ray(OutOfBlocks(4, 3, "199 positions need 4 KV cache blocks; the pool has 3 in all")), "busy")
    assert type(too_long) is OutOfBlocks and (too_long.needed, too_long.free) == (4, 3)
    assert str(too_long) == "199 positions need 4 KV cache blocks; the pool has 3 in all"
    assert str(_as_busy_or_failed(through_ray(Busy("full")), "the cluster is busy")) == "the cluster is busy"
    assert isinstance(_as_busy_or_failed(through_ray(RuntimeError("boom")), "busy"), GenerationFailed)
