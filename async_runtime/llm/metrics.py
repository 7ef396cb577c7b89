"""Prometheus metrics of the server, named like vLLM's (`vllm:num_requests_running` is
`pte_wgpu:num_requests_running` here), and the per-request record they and the request log read.

Each app has its own registry, so several servers in one process (the tests) do not collide.
Gauges are read from the engine when Prometheus scrapes; counters and histograms move as requests do.
"""

import time
import uuid
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.responses import Response

PREFIX = "pte_wgpu:"
# The runtime's own counters (model.statistics()) exported as pte_wgpu:gpu_<name>_total.
RUNTIME_COUNTERS = ("executes", "submits", "dispatches", "readbacks", "bytes_up", "bytes_down")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass
class RequestRecord:
    """What one request did, for the metrics and its log line; the handler fills it in."""

    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    started: float = field(default_factory=time.perf_counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft: float | None = None
    finish_reason: str | None = None
    metrics: "ServerMetrics | None" = None

    def prompt(self, n):
        self.prompt_tokens = n
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(n)

    def generated(self, tokens):
        """`tokens` generated so far (it only grows)."""
        if tokens > self.completion_tokens:
            if self.ttft is None:
                self.ttft = time.perf_counter() - self.started
                if self.metrics is not None:
                    self.metrics.ttft.observe(self.ttft)
            if self.metrics is not None:
                self.metrics.generation_tokens.inc(tokens - self.completion_tokens)
            self.completion_tokens = tokens


class _EngineCollector:
    """Gauges and counters read from the engine at scrape time."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        e = self.engine
        for name, doc, value in (
            ("num_requests_running", "Requests generating (each holds a KV-cache slot).", e.running()),
            ("num_requests_waiting", "Requests waiting for a slot.", e.waiting()),
            ("kv_slots_used", "KV-cache slots held by requests.", e.running()),
            ("kv_slots_max", "KV-cache slots requests may hold at once.", e.capacity),
        ):
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)
        memory = GaugeMetricFamily(PREFIX + "gpu_memory_bytes", "GPU memory of the model (shared) and of the requests' sessions.",
                                   labels=["part"])
        for part, size in e.gpu_memory().items():
            memory.add_metric([part], size)
        yield memory
        stats = e.statistics()
        if stats.kv_blocks:
            yield GaugeMetricFamily(PREFIX + "kv_cache_usage_perc", "Fraction of the KV-cache blocks held by sessions.",
                                    value=stats.kv_blocks_used / stats.kv_blocks)
            for name, doc in (("kv_blocks_used", "KV-cache blocks held by sessions."),
                              ("kv_blocks_cached", "KV-cache blocks held by none, kept for the prompts they start."),
                              ("kv_blocks", "KV-cache blocks in all.")):
                yield GaugeMetricFamily(PREFIX + name, doc, value=getattr(stats, name))
            yield CounterMetricFamily(PREFIX + "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", value=stats.prefix_cache_queries)
            yield CounterMetricFamily(PREFIX + "prefix_cache_hits", "Prompt tokens found in the prefix cache.", value=stats.prefix_cache_hits)
        for name in RUNTIME_COUNTERS:
            yield CounterMetricFamily(PREFIX + f"gpu_{name}", f"The runtime's {name} since load.", value=getattr(stats, name))


class ServerMetrics:
    def __init__(self, engine, paths):
        self.paths = set(paths)  # the routes' paths; any other path is counted as "other"
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens prefilled.", registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated.", registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "From the request's arrival to its first token.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(PREFIX + "time_per_output_token_seconds", "Mean time per token after the first, per request.",
                              buckets=TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "From the request's arrival to its last byte.",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.finished = Counter(PREFIX + "request_success", "Generations that finished, by reason.",
                                ["finished_reason"], registry=r)
        self.responses = Counter(PREFIX + "http_responses", "HTTP responses by path and status (429s: the server was full).",
                                 ["path", "status"], registry=r)
        r.register(_EngineCollector(engine))

    def finished_request(self, record, path, status, duration):
        self.responses.labels(path if path in self.paths else "other", str(status)).inc()
        if record.finish_reason is None:
            return
        self.finished.labels(record.finish_reason).inc()
        self.e2e.observe(duration)
        if record.completion_tokens > 1 and record.ttft is not None:
            self.tpot.observe((duration - record.ttft) / (record.completion_tokens - 1))

    async def endpoint(self, request):
        return Response(generate_latest(self.registry), media_type="text/plain; version=0.0.4; charset=utf-8")
