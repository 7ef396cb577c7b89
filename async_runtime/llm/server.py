"""An OpenAI-compatible server: `python -m async_runtime serve model.pte --tokenizer tokenizer.json`.

ASGI on Starlette, served by hypercorn on asyncio or trio. Every request gets its own session;
concurrent requests share the model and the scheduler's batched submits. At most `max_sessions`
generate at once, at most `max_waiting` more wait for a slot, and past that a request gets 429.
A client that disconnects cancels its generation, and its session is freed at once.

The tokenizer is any object with `encode(text) -> ids`, `decode(ids) -> str`,
`chat(messages) -> ids` (the chat template with the assistant's turn opened) and `stop_ids`.
"""

import json
import time
import uuid

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..errors import InputError
from .generate import context_length, generate


class RequestError(ValueError):
    """A bad request: 400 with this message."""


class Busy(Exception):
    """Every slot is taken and the waiting line is full: 429."""


def _error(status, message, kind="invalid_request_error"):
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


class Slots:
    """At most `running` requests generate at once; at most `waiting` more wait their turn."""

    def __init__(self, running, waiting):
        self.semaphore = anyio.Semaphore(running)
        self.running = running
        self.max_waiting = waiting
        self.waiting = 0

    def full(self):
        return self.semaphore.value == 0 and self.waiting >= self.max_waiting

    def busy_message(self):
        return (f"the server is busy: {self.running} requests are generating and {self.waiting} are waiting; "
                "try again later")

    async def __aenter__(self):
        try:
            self.semaphore.acquire_nowait()
            return
        except anyio.WouldBlock:
            pass
        if self.full():
            raise Busy(self.busy_message())
        self.waiting += 1
        try:
            await self.semaphore.acquire()
        finally:
            self.waiting -= 1

    async def __aexit__(self, *exc):
        self.semaphore.release()


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


def create_app(model, tokenizer, *, model_name="model", max_sessions=8, max_waiting=32, max_tokens=256):
    slots = Slots(max_sessions, max_waiting)
    context = context_length(model)

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
        settings = dict(
            max_new_tokens=_number(body, "max_tokens", max_tokens, int, 1, context),
            temperature=_number(body, "temperature", 1.0, float, 0.0, 100.0),
            top_p=_number(body, "top_p", 1.0, float, 1e-9, 1.0),
            top_k=_number(body, "top_k", 0, int, 0, 1 << 20),
            seed=_number(body, "seed", None, int),
        )
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("'stream' must be true or false")
        return prompt, settings, [stop] if isinstance(stop, str) else (stop or []), stream

    async def tokens_as_text(session, prompt, settings, stop_strings):
        """(text delta, finish reason or None) as tokens come, with stop strings cut."""
        ids, sent = [], ""
        gen = generate(session, prompt, stop=tokenizer.stop_ids, **settings)
        async for token in gen:
            if token in tokenizer.stop_ids:
                break
            ids.append(token)
            text = tokenizer.decode(ids)
            if text.endswith("\ufffd"):
                continue  # an unfinished UTF-8 sequence: wait for its next byte
            cut = min((text.find(s) for s in stop_strings if s and s in text), default=-1)
            if cut >= 0:
                if text[len(sent):cut]:
                    yield text[len(sent):cut], None
                yield "", "stop"
                return
            if text[len(sent):]:
                yield text[len(sent):], None
                sent = text
        yield "", gen.stats.finish_reason or "length"

    async def run(request, chat):
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the body is not valid JSON")
        try:
            prompt, settings, stop_strings, stream = parse(body, chat)
        except (RequestError, InputError) as e:
            return _error(400, str(e))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def choice(delta, finish, streaming):
            if chat:
                key = "delta" if streaming else "message"
                content = {"content": delta} if streaming else {"role": "assistant", "content": delta}
                return {"index": 0, key: content, "finish_reason": finish}
            return {"index": 0, "text": delta, "finish_reason": finish, "logprobs": None}

        if not stream:
            try:
                async with slots, model.session() as session:
                    parts, finish = [], None
                    async for delta, finish in tokens_as_text(session, prompt, settings, stop_strings):
                        parts.append(delta)
            except Busy as e:
                return _error(429, str(e), "server_busy")
            text = "".join(parts)
            return JSONResponse({
                "id": rid, "object": kind, "created": created, "model": model_name,
                "choices": [choice(text, finish, False)],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokenizer.encode(text)) if text else 0,
                          "total_tokens": len(prompt) + (len(tokenizer.encode(text)) if text else 0)},
            })

        if slots.full():
            return _error(429, slots.busy_message(), "server_busy")

        async def events():
            # Starlette cancels this generator when the client disconnects: the session closes.
            chunk_kind = "chat.completion.chunk" if chat else "text_completion"
            try:
                await slots.__aenter__()
            except Busy as e:
                yield _sse({"error": {"message": str(e), "type": "server_busy"}})
                return
            async with model.session() as session:
                if chat:
                    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                    yield _sse({"id": rid, "object": chunk_kind, "created": created, "model": model_name, "choices": [first]})
                try:
                    async for delta, finish in tokens_as_text(session, prompt, settings, stop_strings):
                        yield _sse({"id": rid, "object": chunk_kind, "created": created, "model": model_name,
                                    "choices": [choice(delta, finish, True)]})
                finally:
                    await slots.__aexit__()
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def completions(request):
        return await run(request, chat=False)

    async def chat_completions(request):
        return await run(request, chat=True)

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "pte-wgpu"}]})

    async def health(request):
        return JSONResponse({"status": "ok", "device": model.device_info.name, "sessions_waiting": slots.waiting,
                             "sessions_free": slots.semaphore.value})

    return Starlette(routes=[
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ])


def _sse(obj):
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


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
