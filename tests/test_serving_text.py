"""The serving path's text without a GPU: incremental detokenization and the SSE chunk template
give exactly what decoding everything and json.dumps give."""

import json

import numpy as np
import pytest

from async_runtime.llm.engine import Detokenizer
from async_runtime.llm.server import _FINISH, _TEXT, _chunk_template, _sse
from async_runtime.tools.bench.serving import byte_tokenizer

from .byte_tokenizer import ByteTokenizer


class LeadingSpaceDropped(ByteTokenizer):
    """A decoder whose text for a token depends on its place (SentencePiece drops the space that
    starts the first token's text)."""

    def decode(self, ids):
        text = super().decode(ids)
        return text[1:] if text.startswith(" ") else text


class RewritesPairs(ByteTokenizer):
    """A decoder that is not a concatenation at all: "ab" reads as "X" wherever it is."""

    def decode(self, ids):
        return super().decode(ids).replace("ab", "X")


def token_streams():
    rng = np.random.default_rng(5)
    utf8 = list("héllo wörld, 中文 and 🙂 ".encode())
    yield "random bytes", [int(i) for i in rng.integers(0, 256, 70)]
    yield "utf-8 text", utf8 * 3
    yield "spaces", list(b" a  b   c ") * 4
    yield "pairs", list(b"aabbab" * 8)
    yield "special", [*utf8[:20], 256, *utf8[20:]]


@pytest.mark.parametrize("tokenizer", [ByteTokenizer(), byte_tokenizer(), LeadingSpaceDropped(), RewritesPairs()],
                         ids=["bytes", "hf-byte-level", "leading-space", "rewrites"])
@pytest.mark.parametrize("name,ids", list(token_streams()), ids=[n for n, _ in token_streams()])
def test_detokenizer_gives_the_decode_of_all_ids_at_every_step(tokenizer, name, ids):
    text = Detokenizer(tokenizer)
    for k, token in enumerate(ids):
        assert text.add(token) == tokenizer.decode(ids[: k + 1]), (name, k)
    assert text.anchor > 0  # the decode did move on past the first ids


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("model", ["tiny", "modèle \"ü\" 中"])
def test_the_chunk_template_writes_what_json_dumps_writes(chat, model):
    def obj(text, finish):
        choice = ({"index": 0, "delta": {"content": text}, "finish_reason": finish} if chat
                  else {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
        return {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1790000000, "model": model,
                "choices": [choice]}

    chunk = _chunk_template(obj(_TEXT, _FINISH))
    for text in ["", "a", "quote \" back\\slash", "new\nline\ttab\r", "\x00\x1f\x7f", "é中🙂", "\ufffd", "</script>"]:
        for finish in (None, "stop", "length"):
            assert chunk(text, finish) == _sse(obj(text, finish))
    assert json.loads(chunk("x", "stop")[6:]) == obj("x", "stop")


def test_a_model_name_that_is_a_stand_in_is_refused():
    with pytest.raises(ValueError, match="may not be"):
        _chunk_template({"model": _TEXT, "choices": [{"text": _TEXT, "finish_reason": _FINISH}]})
