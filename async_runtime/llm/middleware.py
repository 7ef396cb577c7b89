"""What stands in front of the routes (pure ASGI, so streaming and cancellation pass through):
a request id and its `RequestRecord`, the API key, the body size limit, and one JSON log line
per request on the `pte_wgpu.requests` logger."""

import hmac
import json
import logging
import time

from .metrics import RequestRecord

log = logging.getLogger("pte_wgpu.requests")
RECORD_KEY = "pte_wgpu.record"  # where the handler finds the request's RequestRecord in the ASGI scope
OPEN_PATHS = ("/health", "/metrics")  # probes and scrapers need no key


def log_requests_to_stderr():
    """The request log's JSON lines, one per line on stderr (once per process)."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


async def _send_error(send, status, message, kind, headers=()):
    body = json.dumps({"error": {"message": message, "type": kind}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    def __init__(self, app, *, api_key=None, max_body_bytes=1 << 20, metrics=None):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        record = RequestRecord(metrics=self.metrics)
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        if given and len(given) <= 128 and given.isprintable():
            record.request_id = given
        scope[RECORD_KEY] = record
        status = None

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", record.request_id.encode())]}
            await send(message)

        try:
            rejection = self._reject(scope["path"], headers)
            if rejection is None and scope["method"] in ("POST", "PUT", "PATCH"):
                receive, rejection = await self._read_body(headers, receive)
            if rejection is not None:
                await _send_error(send_and_note, *rejection)
            else:
                await self.app(scope, receive, send_and_note)
        finally:
            self._finished(scope, record, status)

    def _reject(self, path, headers):
        """(status, message, type[, headers]) when the request has no valid key; None otherwise."""
        if self.api_key is None or path in OPEN_PATHS:
            return None
        scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer" or not key:
            return 401, "missing API key: send 'Authorization: Bearer <key>'", "authentication_error", [(b"www-authenticate", b"Bearer")]
        if not hmac.compare_digest(key.strip(), self.api_key):
            return 401, "invalid API key", "authentication_error", [(b"www-authenticate", b"Bearer")]
        return None

    async def _read_body(self, headers, receive):
        """Reads the whole body (at most max_body_bytes) and gives the app a receive that
        replays it, then passes through (for the disconnect that a stream listens for)."""
        too_large = (413, f"the request body is larger than the limit of {self.max_body_bytes} bytes", "invalid_request_error")
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return receive, too_large
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return receive, (400, "the client left before sending its body", "invalid_request_error")
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return receive, too_large
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay, None

    def _finished(self, scope, record, status):
        duration = time.perf_counter() - record.started
        status = status or 499  # the client left before any response started
        if self.metrics is not None:
            self.metrics.finished_request(record, scope["path"], status, duration)
        log.info(json.dumps({
            "request_id": record.request_id, "method": scope["method"], "path": scope["path"], "status": status,
            "prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens,
            "finish_reason": record.finish_reason,
            "ttft_s": None if record.ttft is None else round(record.ttft, 6), "duration_s": round(duration, 6),
        }))
