"""Token generation over a Llama-style program (ExecuTorch's LLM export: tokens [1, S] and
input_pos [1] in, last-token logits [1, vocab] out, the KV cache inside the session).

    async for token in ar.generate(session, prompt_ids, max_new_tokens=64, temperature=0.7):
        ...

Long prompts are fed in chunks of the largest step the export takes. A model with a recurrent
state (`model.recurrent_states`, LFM2's convolution state) restarts it at position 0 and continues
only where the session's last generation stopped (`session.sequence_end`). Generation stops at a stop
token, after `max_new_tokens`, or when the context is full (`finish_reason == "length"`); a prompt
that does not fit the context is an InputError before anything runs.

On a model with GPU sampling (`model.gpu_sampling`) the GPU picks every token, greedy or sampled
(async_runtime/sampling.py), up to `burst` decode steps a readback (`BatchedSession.pick`), and the
iterator still yields them one by one; greedy tokens are those of the host loop, bitwise, and a
seeded generation's are the same alone or beside others. After a stop token inside a burst the
burst's later steps were computed for nothing, and `position` is where the host loop's would be.
Other models run the host loop, choosing with `Sampling.pick`.
"""

import time
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..sampling import Sampling


MAX_NEW_TOKENS = 256  # generate's default


def context_length(model):
    """Positions the model's KV cache holds (from sdpa_with_kv_cache's cache tensor)."""
    graph = model.graph
    for name, args in graph.calls:
        if name in ("sdpa_with_kv_cache.default", "pte_wgpu.ragged_sdpa", "pte_wgpu.ragged_sdpa_cached"):
            return graph.values[args[3]].dims[1]
    raise InputError("this program has no KV cache (sdpa_with_kv_cache); it cannot generate")


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prompt_seconds: float = 0.0
    generate_seconds: float = 0.0
    finish_reason: str | None = None  # "stop", "length" (max_new_tokens or the context is full)

    @property
    def prompt_tokens_per_s(self):
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def generate_tokens_per_s(self):
        return self.generated_tokens / self.generate_seconds if self.generate_seconds else 0.0


class generate:
    """An async iterator over the new token ids for `prompt` (a list of ids) on `session`,
    starting at position `start` of its KV cache (0 for a new conversation). `stats` and
    `position` are up to date as tokens come; `ready` is how many more tokens the iterator holds
    already (the rest of a burst), so a consumer can handle a burst's tokens together."""

    def __init__(self, session, prompt, *, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                 seed=None, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, logit_bias=None,
                 stop=(), start=0, burst=16):
        self.session = session
        self.prompt = [int(t) for t in prompt]
        self.max_new_tokens = int(max_new_tokens)
        self.sampling = Sampling(temperature, top_k, top_p, min_p, seed, presence_penalty, frequency_penalty,
                                 repetition_penalty, logit_bias)
        self.stop = set(int(t) for t in stop)
        self.position = int(start)
        self.ready = 0
        self.stats = GenerationStats(prompt_tokens=len(self.prompt))
        model = getattr(session, "_model", session)
        self.context = context_length(model)
        self.chunk = model.inputs[0].max_shape[1]
        self.sampling.check_vocab(model.outputs[0].max_shape[-1])
        self.burst = int(burst) if getattr(model, "gpu_sampling", False) else 0
        self.generated = []  # the host loop's ids, for its penalties
        if not self.prompt:
            raise InputError("the prompt is empty: give at least one token")
        if start + len(self.prompt) > self.context:
            raise InputError(
                f"the prompt of {len(self.prompt)} tokens at position {start} does not fit the context of "
                f"{self.context} tokens"
            )
        self.recurrent = bool(getattr(model, "recurrent_states", ()))
        end = getattr(session, "sequence_end", None)
        if self.recurrent and start not in (0, end):
            where = f"continues at position {end}, where its last one stopped" if end is not None else "cannot continue (its last one was cut off)"
            raise InputError(
                f"generation at position {start}: this model carries a recurrent state (model.recurrent_states) that holds "
                f"every token fed so far, so a generation on this session starts at position 0 or {where}"
            )

    def __aiter__(self):
        return self._run()

    async def _step(self, tokens):
        ids = np.asarray(tokens, np.int64).reshape(1, -1)
        self.session.sequence_end = None  # unknown until the step returns
        (logits,) = await self.session.execute(ids, np.array([self.position], np.int64))
        self.position += ids.shape[1]
        self.session.sequence_end = self.position
        return logits

    async def _run(self):
        t0 = time.perf_counter()
        if self.recurrent and self.position == 0:
            self.session.restart()
        reserve = getattr(self.session, "reserve", None)  # a batching model's session: its KV-cache blocks
        if reserve is not None:  # (a new conversation's prompt: the cached blocks it starts with are shared, not set aside)
            await reserve(min(self.context, self.position + len(self.prompt) + self.max_new_tokens),
                          prompt=self.prompt if self.position == 0 else None)
        last = len(self.prompt) - 1 - (len(self.prompt) - 1) % self.chunk  # the last chunk's start
        for i in range(0, last, self.chunk):
            await self._step(self.prompt[i : i + self.chunk])
        if self.burst:  # the last chunk, then its first token picked on the GPU
            picked = await self._pick(self.prompt[last:], 1, history=self.prompt)
            self.position += len(self.prompt) - last - 1
        else:
            picked = [self._host_pick(await self._step(self.prompt[last:]))]
        self.stats.prompt_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        left = self.max_new_tokens  # picked: not yet fed but the last
        while True:
            for i, token in enumerate(picked):
                self.ready = len(picked) - i - 1
                left -= 1
                self.stats.generated_tokens += 1
                self.stats.generate_seconds = time.perf_counter() - t0
                if token in self.stop:  # said before the yield: a caller may stop reading at it
                    self.stats.finish_reason = "stop"
                    self.ready = 0
                    yield token
                    return
                yield token
                if i + 1 < len(picked):
                    self.position += 1
            if not left or self.position >= self.context:
                break
            picked = await self._feed(picked[-1], min(self.burst or 1, left, self.context - self.position))
            self.stats.generate_seconds = time.perf_counter() - t0
        self.stats.finish_reason = "length"

    def _host_pick(self, logits):
        token = self.sampling.pick(logits, self.generated, self.prompt)
        self.generated.append(token)
        return token

    async def _pick(self, tokens, n, history=None):
        ids = np.asarray(tokens, np.int64).reshape(1, -1)
        self.session.sequence_end = None  # unknown until the step returns
        picked = await self.session.pick(ids, np.array([self.position], np.int64), n=n, sampling=self.sampling, history=history)
        self.session.sequence_end = self.position + ids.shape[1] + n - 1  # it fed the tokens and all it picked but the last
        self.position += 1
        return picked.tolist()

    async def _feed(self, token, n):
        """Feed `token`; the n tokens picked after it (a burst feeds all but the last)."""
        if not self.burst:
            return [self._host_pick(await self._step([token]))]
        return await self._pick([token], n)
