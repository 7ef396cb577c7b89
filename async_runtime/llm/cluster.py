"""The server on a Ray Serve cluster: `python -m async_runtime serve model.pte --replicas N`.

Two deployments. `ModelReplica`s each load the model on one WebGPU adapter and generate; one
`Ingress` serves the same routes as the single server (server.py, over `ClusterEngine`): it parses
requests, relays each generation's pieces from a replica, and keeps the API key, the body limit,
the request log and /metrics in one place for the whole cluster.

Routing: a replica takes at most `max_sessions` requests at once (`max_ongoing_requests`): that is
its batch, the sessions that decode together in one ragged pass; a request past it would only wait
inside the replica, where a less loaded replica could have taken it. The ingress sends a request to
Ray only while the replicas have a free slot (`SlotGate`); the others wait at the ingress in
arrival order and go the moment a generation ends, and one past `max_waiting` gets the same 429 as
one server. Left in Ray's own queue, a waiting request retries with a backoff growing to 0.5 s and
in no particular order: on two H200s, one replica of 32 slots served 64 streams at 1,582 tokens/s
against 2,706 for 32 streams, its slots idle between a generation's end and the next request. (Ray's
`max_queued_requests` is not used either: it also counts requests still being assigned.) With
autoscaling, Ray Serve adds replicas when the replicas' ongoing requests pass
`target_ongoing_requests` = 3/4 of `max_sessions`: it does not see the requests waiting at the
ingress, so it must scale while batches fill, before a line forms.

Ray hides GPUs from each other with CUDA_VISIBLE_DEVICES, which Vulkan ignores: a replica opens
the adapter with the index of the GPU Ray assigned it (`gpu:<id>`, device.py), so two replicas
never share a GPU. Without GPUs, replicas take a CPU each and run on lavapipe.
"""

import asyncio
import os
import time
from collections import deque
from contextlib import aclosing

import anyio

import ray
from ray import serve

from .. import load
from ..kv_blocks import OutOfBlocks
from ..stats import Statistics
from .engine import ADMITTED, Busy, GenerationFailed, LocalEngine, Piece, busy_message
from .middleware import log_requests_to_stderr
from .server import build_app

APP_NAME = "pte-wgpu"
REPORT_EVERY_S = 2.0  # how often a replica sends its GPU memory and counters to the ingress
REPORT_STALE_S = 10.0  # a replica silent for this long is left out of /metrics


def replica_adapter():
    """The adapter selector for this replica: the GPU Ray assigned, else the default adapter."""
    ids = ray.get_gpu_ids()
    return f"gpu:{int(ids[0])}" if ids else None


class ModelReplica:
    """One model on one adapter; `generate` streams `ADMITTED` as a tuple, then each list of
    `Piece`s as a list of tuples (one Ray item a burst)."""

    async def __init__(self, pte, tokenizer, max_sessions, precision="auto", batch_invariant=True):
        self.model = await load(pte, device=replica_adapter(), precision=precision, batch_invariant=batch_invariant)
        self.engine = LocalEngine(self.model, tokenizer, max_sessions, max_waiting=max_sessions)
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._reporting = asyncio.get_running_loop().create_task(self._report_to_ingress())  # Serve runs asyncio

    def describe(self):
        return {"context": self.engine.context, "vocab": self.engine.vocab, "device": self.engine.device_name,
                "capacity": self.engine.capacity}

    def check_health(self):
        """Ray Serve calls it every `health_check_period_s`: a lost device replaces the replica."""
        self.engine.check_health()

    def report(self):
        """This replica's GPU memory and runtime counters, for the ingress's /metrics."""
        return {"memory": self.engine.gpu_memory(), "statistics": self.engine.statistics()}

    async def _report_to_ingress(self):
        ingress = serve.get_deployment_handle(Ingress.__name__, APP_NAME)
        while True:
            try:
                await ingress.report.remote(self.replica_id, self.report())
            except Exception:  # the ingress is starting or restarting: the next report will do
                pass
            await asyncio.sleep(REPORT_EVERY_S)

    async def generate(self, prompt, settings, stop_strings):
        # Ray throws CancelledError in at our `yield` when the client leaves: aclosing passes it on,
        # so the slot and the session are freed now, not when the inner generator is collected.
        async with aclosing(self.engine.stream(prompt, settings, stop_strings)) as pieces:
            yield tuple(await anext(pieces))  # ADMITTED
            async for batch in pieces:
                yield [tuple(piece) for piece in batch]


def _as_busy_or_failed(error, busy):
    """The exception the HTTP layer understands for an error that came through Ray."""
    if isinstance(error, Busy):
        return Busy(busy)
    if isinstance(error, OutOfBlocks):  # longer than a replica's whole KV-cache pool: the server's 400
        cause = getattr(error, "cause", None) or error
        return OutOfBlocks(cause.needed, cause.free, str(cause))
    if isinstance(error, GenerationFailed):  # the replica's own message, without Ray's traceback
        return GenerationFailed(str(getattr(error, "cause", None) or error).splitlines()[-1])
    return GenerationFailed(f"the replica serving this request failed ({type(error).__name__}); "
                            "other replicas keep serving, try again")


class SlotGate:
    """First-come admission to the replicas' slots, whose number `capacity()` may change
    (autoscaling): `acquire` returns once a slot is this request's, `release` hands it to the
    longest-waiting request."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.taken = 0
        self._line = deque()  # anyio.Events of the waiting requests, first come first

    def waiting(self):
        return len(self._line)

    async def acquire(self):
        if not self._line and self.taken < self.capacity():
            self.taken += 1
            return
        turn = anyio.Event()
        self._line.append(turn)
        try:
            await turn.wait()
        except BaseException:  # cancelled while waiting, or just after its slot was handed over
            if turn.is_set():
                self.release()
            else:
                self._line.remove(turn)
            raise

    def release(self):
        self.taken -= 1
        self.admit()

    def admit(self):
        """Hands free slots to waiting requests; call it when the capacity grows too."""
        while self._line and self.taken < self.capacity():
            self.taken += 1
            self._line.popleft().set()


class ClusterEngine:
    """The engine interface (engine.py) over the replicas' handle."""

    def __init__(self, handle, description, replicas, max_waiting):
        self.handle = handle
        self.replicas = replicas  # deployed (autoscaling: the minimum); more count once they report
        self.max_waiting = max_waiting
        self.context = description["context"]
        self.vocab = description["vocab"]
        self.device_name = description["device"]
        self.replica_capacity = description["capacity"]
        self.reports = {}  # replica id -> (monotonic time, report)
        self._slots = SlotGate(lambda: self.capacity)

    def running(self):
        """Requests holding a replica's slot (generating, or on their way to the replica)."""
        return self._slots.taken

    def waiting(self):
        return self._slots.waiting()

    def add_report(self, replica_id, report):
        self.reports[replica_id] = (time.monotonic(), report)
        self._slots.admit()  # a replica that reports for the first time brings its slots

    @property
    def capacity(self):
        """KV-cache slots of the replicas: those deployed, or those that reported lately if more."""
        return self.replica_capacity * max(self.replicas, len(self._fresh_reports()))

    def check_health(self):
        pass  # the replicas' health is Ray Serve's to check (ModelReplica.check_health)

    def _fresh_reports(self):
        now = time.monotonic()
        return [r for t, r in self.reports.values() if now - t < REPORT_STALE_S]

    def gpu_memory(self):
        reports = self._fresh_reports()
        return {part: sum(r["memory"][part] for r in reports) for part in ("model", "sessions")}

    def statistics(self):
        reports = self._fresh_reports()
        return Statistics(**{k: sum(getattr(r["statistics"], k) for r in reports) for k in Statistics.__dataclass_fields__})

    async def stream(self, prompt, settings, stop_strings):
        if self.running() + self.waiting() >= self.capacity + self.max_waiting:
            raise Busy(busy_message(self.running(), self.waiting()))
        await self._slots.acquire()
        try:
            response = self.handle.options(stream=True).generate.remote(prompt, settings, stop_strings)
            ended = False  # the replica's stream ended (its last piece, or an error): nothing to cancel
            try:
                try:
                    await anext(response)  # the replica's ADMITTED
                except Exception as e:
                    ended = True
                    raise _as_busy_or_failed(e, busy_message(self.running() - 1, self.waiting())) from e
                try:
                    yield ADMITTED
                    async for item in response:
                        yield [Piece(*piece) for piece in item]
                    ended = True
                except Exception as e:
                    ended = True
                    raise _as_busy_or_failed(e, "") from e
            finally:
                if not ended:
                    response.cancel()  # the client left: the replica stops generating and frees the slot
        finally:
            self._slots.release()


class Ingress:
    """The routes of server.py over `ClusterEngine`; replicas push their `report()` here. One
    replica of it, so its count of running and waiting requests, and its line, are the cluster's."""

    async def __init__(self, replicas, tokenizer, options, deployed, max_waiting):
        self.options = options
        self.engine = ClusterEngine(replicas, await replicas.describe.remote(), deployed, max_waiting)
        self.tokenizer = tokenizer
        log_requests_to_stderr()

    def __serve_build_asgi_app__(self):
        return build_app(self.engine, self.tokenizer, **self.options)

    def report(self, replica_id, report):
        self.engine.add_report(replica_id, report)


def application(pte, tokenizer, *, replicas=1, min_replicas=1, max_replicas=None, use_gpus=None,
                max_sessions=8, max_waiting=32, model_name="model", precision="auto", batch_invariant=True, **app_options):
    """The Ray Serve application: `serve.run(application(...), name=APP_NAME)`.

    `replicas` fixed, or autoscaling between `min_replicas` and `max_replicas`. `use_gpus`: one
    GPU per replica (default: when the cluster has GPUs), else one CPU (lavapipe). The `.pte` path
    must exist on every node that runs a replica; `precision` and `batch_invariant` are each
    replica's `load()`'s.
    `app_options` are `build_app`'s."""
    if use_gpus is None:
        use_gpus = ray.cluster_resources().get("GPU", 0) >= 1
    scaling = (dict(autoscaling_config={"min_replicas": min_replicas, "max_replicas": max_replicas,
                                        "target_ongoing_requests": max(1, max_sessions * 3 // 4)})
               if max_replicas else dict(num_replicas=replicas))
    model = serve.deployment(
        ModelReplica,
        name=ModelReplica.__name__,
        # wgpu-py 0.32 awaits its promises with the event loop's library by module name, and
        # Ray's default uvloop is not one it knows: replicas run asyncio's own loop.
        ray_actor_options={"num_gpus" if use_gpus else "num_cpus": 1, "runtime_env": {"env_vars": {"RAY_USE_UVLOOP": "0"}}},
        max_ongoing_requests=max_sessions,
        health_check_period_s=5,
        graceful_shutdown_timeout_s=5,
        **scaling,
    ).bind(os.fspath(pte), tokenizer, max_sessions, precision, batch_invariant)
    ingress = serve.deployment(
        serve.ingress()(Ingress),
        name=Ingress.__name__,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=100_000,  # it only relays; the replicas' limits are the ones that count
        graceful_shutdown_timeout_s=5,
    )
    return ingress.bind(model, tokenizer, dict(app_options, model_name=model_name), min_replicas if max_replicas else replicas,
                        max_waiting)
