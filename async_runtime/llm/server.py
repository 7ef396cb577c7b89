"""An OpenAI-compatible server: `python -m async_runtime serve model.pte --tokenizer tokenizer.json`.

ASGI on Starlette, served by hypercorn on asyncio or trio. Every request gets its own session;
concurrent requests share the model and the scheduler's batched submits. At most `max_sessions`
generate at once, at most `max_waiting` more wait (for a slot, or for KV-cache blocks while a
batching model's pool is full), and past that a request gets 429.
A client that disconnects cancels its generation, and its session is freed at once. Requests
carry OpenAI's and vLLM's sampling settings (temperature 1 by default, top_p, top_k, min_p, seed,
the penalties, logit_bias), which the GPU applies per request in the batch; several choices a
request and log probabilities are refused with a 400.
`/metrics` is Prometheus' (metrics.py); the API key, the body limit and the request log are
middleware.py's. The same routes serve a Ray Serve cluster (cluster.py) over another engine.

The tokenizer is any object with `encode(text) -> ids`, `decode(ids) -> str`,
`chat(messages) -> ids` (the chat template with the assistant's turn opened) and `stop_ids`.
"""

import json
import time
from contextlib import aclosing
from json.encoder import encode_basestring

from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..errors import InputError
from ..kv_blocks import OutOfBlocks
from ..sampling import Sampling
from .engine import Busy, GenerationFailed, LocalEngine
from .metrics import RequestRecord, ServerMetrics
from .middleware import RECORD_KEY, Guard

class RequestError(ValueError):
    """A bad request: 400 with this message."""


def _error(status, message, kind="invalid_request_error"):
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def _number(body, key, default, kind, low=None, high=None):
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and int(value) != value):
        raise RequestError(f"'{key}' must be {'an integer' if kind is int else 'a number'}, not {value!r}")
    value = kind(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise RequestError(f"'{key}' must be between {low} and {high}, not {value}")
    return value


def _logit_bias(value, vocab):
    """OpenAI's `logit_bias`: {token id (a string in JSON): bias in [-100, 100]}."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RequestError("'logit_bias' must be an object mapping token ids to numbers from -100 to 100")
    bias = {}
    for key, number in value.items():
        try:
            token = int(key)
        except ValueError:
            raise RequestError(f"'logit_bias' key {key!r} is not a token id") from None
        if not 0 <= token < vocab:
            raise RequestError(f"'logit_bias' names token {token}; this model's ids run from 0 to {vocab - 1}")
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not -100 <= number <= 100:
            raise RequestError(f"'logit_bias' of token {token} must be a number from -100 to 100, not {number!r}")
        bias[token] = float(number)
    return bias


def refuse_unsupported(body, chat):
    """400 for what the API allows and this server does not give: several choices a request
    (`n`, `best_of`) and log probabilities."""
    for key in ("n", "best_of"):
        if body.get(key) not in (None, 1):
            raise RequestError(f"'{key}' other than 1 is not supported: one choice a request (send several requests, "
                               "each with its own seed)")
    logprobs = body.get("logprobs")
    if (logprobs not in (None, False) if chat else logprobs is not None) or body.get("top_logprobs") not in (None, 0):
        raise RequestError("'logprobs' and 'top_logprobs' are not supported: this server returns tokens' text only")


def create_app(model, tokenizer, *, model_name="model", max_sessions=8, max_waiting=32, max_tokens=256, **options):
    """The app over `model` in this process; `options` are `build_app`'s."""
    return build_app(LocalEngine(model, tokenizer, max_sessions, max_waiting), tokenizer,
                     model_name=model_name, max_tokens=max_tokens, **options)


def build_app(engine, tokenizer, *, model_name="model", max_tokens=256, api_key=None, max_body_bytes=1 << 20):
    """The routes over an engine (engine.py). `api_key`: /v1/ needs `Authorization: Bearer <key>`
    (401 otherwise); a body over `max_body_bytes` gets 413."""
    context = engine.context

    def parse(body, chat):
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            ):
                raise RequestError("'messages' must be a non-empty list of {role, content} objects with string values")
            prompt = tokenizer.chat(messages)
        else:
            text = body.get("prompt")
            if not isinstance(text, str) or not text:
                raise RequestError("'prompt' must be a non-empty string")
            prompt = tokenizer.encode(text)
        if len(prompt) >= context:
            raise RequestError(f"the prompt is {len(prompt)} tokens; this model's context holds {context}")
        stop = body.get("stop")
        if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
            raise RequestError("'stop' must be a string or a list of strings")
        refuse_unsupported(body, chat)
        repetition = "repetition_penalty" if "repetition_penalty" in body else "repeat_penalty"  # vLLM's, llama.cpp's
        sampling = dict(
            temperature=_number(body, "temperature", 1.0, float, 0.0, 100.0),
            top_p=_number(body, "top_p", 1.0, float, 1e-9, 1.0),
            top_k=_number(body, "top_k", 0, int, 0, 1 << 30),
            min_p=_number(body, "min_p", 0.0, float, 0.0, 1.0),
            seed=_number(body, "seed", None, int, -(1 << 63), (1 << 64) - 1),
            presence_penalty=_number(body, "presence_penalty", 0.0, float, -2.0, 2.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0, float, -2.0, 2.0),
            repetition_penalty=_number(body, repetition, 1.0, float, 0.01, 10.0),
            logit_bias=_logit_bias(body.get("logit_bias"), engine.vocab),
        )
        Sampling(**sampling)  # its own checks, before the request takes a slot
        settings = dict(max_new_tokens=_number(body, "max_tokens", max_tokens, int, 1, context), **sampling)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("'stream' must be true or false")
        # vLLM's and llama-server's extension, for benchmarks: generate max_tokens whatever comes
        settings["ignore_eos"] = body.get("ignore_eos", False)
        if not isinstance(settings["ignore_eos"], bool):
            raise RequestError("'ignore_eos' must be true or false")
        return prompt, settings, [stop] if isinstance(stop, str) else (stop or []), stream

    async def run(request, chat):
        record = request.scope.get(RECORD_KEY) or RequestRecord()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the body is not valid JSON")
        try:
            prompt, settings, stop_strings, stream = parse(body, chat)
        except (RequestError, InputError) as e:
            return _error(400, str(e))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{record.request_id}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        chunk_kind = "chat.completion.chunk" if chat else "text_completion"

        def choice(delta, finish, streaming):
            if chat:
                key = "delta" if streaming else "message"
                content = {"content": delta} if streaming else {"role": "assistant", "content": delta}
                return {"index": 0, key: content, "finish_reason": finish}
            return {"index": 0, "text": delta, "finish_reason": finish, "logprobs": None}

        chunk = _chunk_template({"id": rid, "object": chunk_kind, "created": created, "model": model_name,
                                 "choices": [choice(_TEXT, _FINISH, True)]})

        pieces = engine.stream(prompt, settings, stop_strings)
        try:
            await anext(pieces)  # admitted: the request holds a slot
        except Busy as e:
            await pieces.aclose()
            return _error(429, str(e), "server_busy")
        except GenerationFailed as e:
            return _error(503, str(e), "server_error")
        except OutOfBlocks as e:  # longer than the model's whole KV-cache pool
            return _error(400, f"the prompt and max_tokens need more KV cache than this server has: {e}")
        record.prompt(len(prompt))

        if not stream:
            parts = []
            try:
                async with aclosing(pieces):
                    async for batch in pieces:
                        parts += [piece.text for piece in batch]
                        record.generated(batch[-1].tokens)
                        record.finish_reason = batch[-1].finish or record.finish_reason
            except GenerationFailed as e:
                return _error(500, str(e), "server_error")
            text = "".join(parts)
            return JSONResponse({
                "id": rid, "object": kind, "created": created, "model": model_name,
                "choices": [choice(text, record.finish_reason, False)],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": record.completion_tokens,
                          "total_tokens": len(prompt) + record.completion_tokens},
            })

        async def events():
            # Starlette cancels this generator when the client disconnects: the generation stops
            # and its session closes. One write a burst: its pieces' events together; the last
            # burst's with [DONE], once the session is closed.
            last = ""
            async with aclosing(pieces):
                if chat:
                    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                    yield _sse({"id": rid, "object": chunk_kind, "created": created, "model": model_name, "choices": [first]})
                try:
                    async for batch in pieces:
                        record.generated(batch[-1].tokens)
                        record.finish_reason = batch[-1].finish
                        text = "".join([chunk(p.text, p.finish) for p in batch if p.text or p.finish])
                        if record.finish_reason:
                            last = text
                        elif text:
                            yield text
                except GenerationFailed as e:
                    yield _sse({"error": {"message": str(e), "type": "server_error"}})
                    return
            yield last + "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def completions(request):
        return await run(request, chat=False)

    async def chat_completions(request):
        return await run(request, chat=True)

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "pte-wgpu"}]})

    async def health(request):
        try:
            engine.check_health()
        except Exception as e:
            return JSONResponse({"status": "unhealthy", "error": str(e)}, status_code=503)
        return JSONResponse({"status": "ok", "device": engine.device_name, "requests_running": engine.running(),
                             "requests_waiting": engine.waiting()})

    routes = [
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    metrics = ServerMetrics(engine, [r.path for r in routes] + ["/metrics"])
    routes.append(Route("/metrics", metrics.endpoint))
    return Guard(Starlette(routes=routes), api_key=api_key, max_body_bytes=max_body_bytes, metrics=metrics)


def _sse(obj):
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


# Stand-ins for a chunk's text and finish reason in its template (private-use characters, which
# no request id holds: the middleware takes printable ones only).
_TEXT, _FINISH = "\ue000", "\ue001"


def _chunk_template(obj):
    """`(text, finish) -> _sse(obj)` with `_TEXT` and `_FINISH` in `obj` replaced by them: the
    event's bytes as json.dumps writes them, the fixed parts dumped once."""
    parts = _sse(obj).split(f'"{_TEXT}"')
    if len(parts) != 2 or parts[1].count(f'"{_FINISH}"') != 1:
        raise ValueError(f"a stream's ids and model name may not be {_TEXT!r} or {_FINISH!r}")
    before, (between, after) = parts[0], parts[1].split(f'"{_FINISH}"')
    finishes = {f: json.dumps(f) for f in (None, "stop", "length")}

    def chunk(text, finish):  # encode_basestring: what json.dumps(text, ensure_ascii=False) calls
        return f"{before}{encode_basestring(text)}{between}{finishes[finish]}{after}"

    return chunk


async def serve(app, host="127.0.0.1", port=8000, shutdown_trigger=None):
    """Serve `app` with hypercorn on the running backend (asyncio or trio) until
    `shutdown_trigger()` returns (or forever)."""
    import sniffio
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    if sniffio.current_async_library() == "trio":
        from hypercorn.trio import serve as hypercorn_serve
    else:
        from hypercorn.asyncio import serve as hypercorn_serve
    await hypercorn_serve(app, config, **({"shutdown_trigger": shutdown_trigger} if shutdown_trigger else {}))
