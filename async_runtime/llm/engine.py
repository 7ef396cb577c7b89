"""What the HTTP layer asks of a generator of text: admission (or `Busy`), then pieces of text.

`LocalEngine` runs on a model in this process: at most `max_sessions` requests generate at once,
each in its own session with the KV-cache blocks of its whole length set aside before it starts;
at most `max_waiting` more wait, for a session or for blocks while the model's pool is full.
The cluster's engine (`cluster.py`) has the same interface over Ray Serve replicas.

An engine's `stream(prompt, settings, stop_strings)` is an async generator: its first item is
`ADMITTED` once the request holds a slot (or it raises `Busy`, or `OutOfBlocks` for a request
longer than the whole pool, first), then lists of `Piece`s, a
list for the tokens that came together (a burst), so the layers above write, send and
count once a burst rather than once a token. A failure of the device or of a replica after
admission is `GenerationFailed`.
"""

from contextlib import aclosing, contextmanager
from typing import NamedTuple

import anyio

from ..errors import BrokenResourceError
from ..kv_blocks import OutOfBlocks
from .generate import MAX_NEW_TOKENS, context_length, generate


class Busy(Exception):
    """Every slot is taken and the waiting line is full: 429."""


class GenerationFailed(Exception):
    """The generation broke after it started (a lost device, a dead replica): 500, or an error event."""


class Piece(NamedTuple):
    text: str  # the new text (may be empty: an unfinished UTF-8 sequence, or the final piece)
    finish: str | None  # "stop" or "length" on the last piece
    tokens: int  # tokens generated so far


ADMITTED = Piece("", None, 0)


def busy_message(running, waiting):
    return f"the server is busy: {running} requests are generating and {waiting} are waiting; try again later"


class Slots:
    """At most `running` requests generate at once; at most `waiting` more wait their turn, for a
    slot or, holding one, for KV-cache blocks (`waiting_for_blocks`)."""

    def __init__(self, running, waiting):
        self.semaphore = anyio.Semaphore(running)
        self.running = running
        self.max_waiting = waiting
        self.waiting = 0
        self.blocked = 0  # of those waiting, the ones that hold a slot

    @property
    def in_use(self):
        return self.running - self.semaphore.value - self.blocked

    @contextmanager
    def waiting_for_blocks(self):
        """A request that holds a slot waits in the line while the pool has no room for it; Busy
        if the line is full."""
        if self.waiting >= self.max_waiting:
            raise Busy(busy_message(self.in_use - 1, self.waiting))  # not counting itself
        self.waiting += 1
        self.blocked += 1
        try:
            yield
        finally:
            self.waiting -= 1
            self.blocked -= 1

    def full(self):
        return self.semaphore.value == 0 and self.waiting >= self.max_waiting

    async def __aenter__(self):
        try:
            self.semaphore.acquire_nowait()
            return
        except anyio.WouldBlock:
            pass
        if self.full():
            raise Busy(busy_message(self.in_use, self.waiting))
        self.waiting += 1
        try:
            await self.semaphore.acquire()
        finally:
            self.waiting -= 1

    async def __aexit__(self, *exc):
        self.semaphore.release()


class Detokenizer:
    """`tokenizer.decode(ids)` of a growing list of ids without decoding them all every time.

    The text is that of the ids up to an anchor (kept) and the decode of the ids after it, which
    starts CONTEXT ids before the anchor for decoders whose text for a token depends on the one
    before (a SentencePiece space); the anchor moves every REANCHOR ids to where the text ends on
    a whole character. When the text of the context ids is not where their decode with the new
    ids starts, all the ids are decoded."""

    CONTEXT, REANCHOR = 4, 16

    def __init__(self, tokenizer):
        self.decode = tokenizer.decode
        self.ids = []
        self.anchor = self.start = 0  # start: the first context id, anchor - CONTEXT
        self.text = ""  # the decode of ids[:anchor]
        self.head = ""  # the decode of ids[start:anchor]

    def add(self, token):
        """The text of all the ids so far, `token` included; it ends with U+FFFD while the last
        character is unfinished."""
        self.ids.append(token)
        tail = self.decode(self.ids[self.start:])
        text = self.text + tail[len(self.head):] if tail.startswith(self.head) else self.decode(self.ids)
        if len(self.ids) - self.anchor >= self.REANCHOR and not text.endswith("\ufffd"):
            self.anchor, self.text = len(self.ids), text
            self.start = max(0, self.anchor - self.CONTEXT)
            self.head = self.decode(self.ids[self.start:self.anchor])
        return text


async def text_pieces(session, tokenizer, prompt, settings, stop_strings):
    """Lists of `Piece`s as tokens come, with the tokenizer's stop tokens and the stop strings cut:
    one list for the tokens that came together (a burst)."""
    sent, batch = "", []
    settings = dict(settings)
    stop_ids = () if settings.pop("ignore_eos", False) else tokenizer.stop_ids
    longest_stop = max((len(s) for s in stop_strings), default=0)
    text = Detokenizer(tokenizer)
    gen = generate(session, prompt, stop=stop_ids, **settings)
    async for token in gen:
        if token in stop_ids:
            break
        new = text.add(token)
        if not new.endswith("\ufffd"):  # else an unfinished UTF-8 sequence: wait for its next byte
            # a stop string not found in `sent` ends past its start; the first one found is the cut
            start = max(0, len(sent) - longest_stop + 1)
            cut = min((i for i in (new.find(s, start) for s in stop_strings if s) if i >= 0), default=-1)
            if cut >= 0:
                batch.append(Piece(new[len(sent):cut], "stop", gen.stats.generated_tokens))
                yield batch
                return
            if new[len(sent):]:
                batch.append(Piece(new[len(sent):], None, gen.stats.generated_tokens))
                sent = new
        if batch and not gen.ready:
            yield batch
            batch = []
    batch.append(Piece("", gen.stats.finish_reason or "length", gen.stats.generated_tokens))
    yield batch


class LocalEngine:
    def __init__(self, model, tokenizer, max_sessions=8, max_waiting=32):
        self.model = model
        self.tokenizer = tokenizer
        self.slots = Slots(max_sessions, max_waiting)
        self.context = context_length(model)
        self.vocab = model.outputs[0].max_shape[-1]
        self.device_name = model.device_info.name
        self.sessions = set()  # the open sessions of requests, each holding a KV-cache slot
        self.device_lost = None  # the BrokenResourceError that a generation met, if any

    @property
    def capacity(self):
        return self.slots.running

    def running(self):
        return self.slots.in_use

    def waiting(self):
        return self.slots.waiting

    def check_health(self):
        """Raises BrokenResourceError once the device is lost (a replica's health check)."""
        if self.device_lost is not None:
            raise BrokenResourceError(f"the GPU device was lost: {self.device_lost}")
        self.model._check_open()

    def gpu_memory(self):
        """{"model": bytes shared by all sessions, "sessions": bytes the requests' sessions own}."""
        return {"model": self.model.memory(), "sessions": sum(s.memory() for s in list(self.sessions))}

    def statistics(self):
        return self.model.statistics()

    async def stream(self, prompt, settings, stop_strings):
        async with self.slots:
            try:
                self.check_health()
            except BrokenResourceError as e:
                raise GenerationFailed(str(e)) from e
            try:
                async with self.model.session() as session:
                    await self._reserve(session, prompt, len(prompt) + settings.get("max_new_tokens", MAX_NEW_TOKENS))
                    yield ADMITTED
                    self.sessions.add(session)
                    try:
                        async with aclosing(text_pieces(session, self.tokenizer, prompt, settings, stop_strings)) as pieces:
                            async for batch in pieces:
                                yield batch
                    finally:
                        self.sessions.discard(session)
            except BrokenResourceError as e:
                self.device_lost = e
                raise GenerationFailed(f"the GPU device was lost: {e}") from e

    async def _reserve(self, session, prompt, positions):
        """Set aside the KV-cache blocks of the whole generation (a batching model's session;
        `generate` then finds them set aside) but those of the prompt's cached prefix, which it
        shares; waiting in the line while the pool is full."""
        reserve = getattr(session, "reserve", None)
        if reserve is None:
            return
        positions = min(self.context, positions)
        try:
            await reserve(positions, wait=False, prompt=prompt)
        except OutOfBlocks as e:
            if e.needed > self.model.statistics().kv_blocks:
                raise
            with self.slots.waiting_for_blocks():
                await reserve(positions, prompt=prompt)
