"""How a generation picks its tokens: greedy, or sampled with temperature, top-k, top-p, min-p,
a seed, penalties and logit bias (vLLM's and OpenAI's parameters).

The GPU picks the tokens of a batching model (kernels/attention/sampler.py, async_runtime/bursts.py),
each sequence with its own settings; `Sampling.probabilities` is the same choice on the host, in
float64, the reference of the tests and the sampler of models without GPU picking. Order: logit
bias, the repetition penalty (a positive logit of a token seen in the prompt or the output divided
by it, a negative one multiplied), the frequency and presence penalties (output tokens), the
temperature, then the cuts: top-k, top-p of what top-k kept, min-p of the largest probability.
A token tied with a cut's last kept logit is kept too.
"""

import secrets
import struct
from dataclasses import dataclass

import numpy as np

from pte_wgpu.kernels.attention.sampler import ADJUSTS, PICKS, RADIX_ROUNDS

from .errors import InputError

SEED_BITS = 64


@dataclass
class Sampling:
    """temperature 0 is greedy; top_k 0, top_p 1 and min_p 0 keep every token; penalties 0
    (repetition 1) and no logit bias leave the logits as they are. Without a seed, a fresh one."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict | None = None  # token id -> added to its logit

    def __post_init__(self):
        bad = []
        if not self.temperature >= 0:
            bad.append(f"temperature {self.temperature} (need >= 0)")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            bad.append(f"top_k {self.top_k} (need an integer >= 0)")
        if not 0 < self.top_p <= 1:
            bad.append(f"top_p {self.top_p} (need 0 < top_p <= 1)")
        if not 0 <= self.min_p <= 1:
            bad.append(f"min_p {self.min_p} (need 0 <= min_p <= 1)")
        if not self.repetition_penalty > 0:
            bad.append(f"repetition_penalty {self.repetition_penalty} (need > 0)")
        for name in ("presence_penalty", "frequency_penalty"):
            if not np.isfinite(getattr(self, name)):
                bad.append(f"{name} {getattr(self, name)} (need a finite number)")
        bias = {}
        for token, value in (self.logit_bias or {}).items():
            try:
                token, value = int(token), float(value)
            except (TypeError, ValueError):
                bad.append(f"logit_bias entry {token!r}: {value!r} (need a token id and a number)")
                continue
            if token < 0 or not np.isfinite(value):
                bad.append(f"logit_bias entry {token}: {value} (need an id >= 0 and a finite number)")
            bias[token] = value
        if bad:
            raise InputError("bad sampling settings: " + "; ".join(bad))
        self.top_k = int(self.top_k)
        self.logit_bias = bias or None
        self.seed = secrets.randbits(SEED_BITS) if self.seed is None else int(self.seed) % (1 << SEED_BITS)
        self._rng = np.random.default_rng(self.seed)

    @property
    def greedy(self):
        return self.temperature == 0

    @property
    def adjusts(self):
        """Whether the logits take penalties or bias (the GPU then reads the session's token counts)."""
        return bool(self.logit_bias) or self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def check_vocab(self, vocab):
        """InputError for a logit bias outside the model's vocabulary."""
        outside = sorted(t for t in (self.logit_bias or {}) if t >= vocab)
        if outside:
            raise InputError(f"logit_bias names token ids {outside[:5]} outside the vocabulary of {vocab} tokens")

    def cut_rounds(self, vocab):
        """Radix rounds of the GPU's cuts: four for top-k (when it cuts), four for top-p."""
        if self.greedy:
            return 0
        return RADIX_ROUNDS * ((0 < self.top_k < vocab) + (self.top_p < 1))

    def row(self, slot, vocab):
        """This sequence's settings for the sampler kernels (their `Row`)."""
        flags = PICKS | (ADJUSTS if self.adjusts else 0)
        return struct.pack("<fIffIIfffIII", self.temperature, self.top_k, self.top_p, self.min_p,
                           self.seed & 0xFFFFFFFF, self.seed >> 32, self.presence_penalty, self.frequency_penalty,
                           self.repetition_penalty, flags, slot, self.cut_rounds(vocab))

    def slot_rows(self, vocab, history):
        """The session's rows of token counts (bit 31: in `history`, the prompt) and logit bias at
        the start of a generation."""
        counts = np.zeros(vocab, np.uint32)
        if self.repetition_penalty != 1:
            counts[np.asarray(history, np.int64)] = 1 << 31
        bias = np.zeros(vocab, np.float32)
        for token, value in (self.logit_bias or {}).items():
            bias[token] = value
        return counts, bias

    # --- the host's choice ----------------------------------------------------------------------
    def adjusted(self, logits, generated=(), history=()):
        """The logits after bias and penalties (float64): `generated`, the ids picked so far;
        `history`, the prompt's."""
        z = np.asarray(logits, np.float64).reshape(-1).copy()
        for token, value in (self.logit_bias or {}).items():
            z[token] += value
        n = np.bincount(np.asarray(generated, np.int64), minlength=len(z))[: len(z)]
        if self.repetition_penalty != 1:
            seen = n > 0
            seen[np.asarray(history, np.int64)] = True
            z[seen] = np.where(z[seen] > 0, z[seen] / self.repetition_penalty, z[seen] * self.repetition_penalty)
        return z - self.frequency_penalty * n - self.presence_penalty * (n > 0)

    def probabilities(self, logits, generated=(), history=()):
        """Each token's probability of being drawn (float64; 0 outside the cuts)."""
        z = self.adjusted(logits, generated, history) / self.temperature
        z[np.isnan(z)] = -np.inf
        keep = np.isfinite(z)
        ranked = np.sort(z[keep])[::-1]
        if 0 < self.top_k < len(ranked):
            keep &= z >= ranked[self.top_k - 1]
        weights = np.where(keep, np.exp(z - ranked[0]), 0.0)
        if self.top_p < 1:
            ranked_weights = np.sort(weights[keep])[::-1]
            total = np.cumsum(ranked_weights)
            last = int(np.searchsorted(total, self.top_p * total[-1]))
            keep &= weights >= ranked_weights[min(last, len(ranked_weights) - 1)]
        if self.min_p > 0:
            keep &= weights >= self.min_p
        weights = np.where(keep, weights, 0.0)
        return weights / weights.sum()

    def pick(self, logits, generated=(), history=()):
        """The host's choice from one row of logits (numpy's generator under the seed)."""
        if self.greedy:
            if not self.adjusts:
                return int(np.asarray(logits).reshape(-1).argmax())
            return int(self.adjusted(logits, generated, history).argmax())
        probs = self.probabilities(logits, generated, history)
        return int(self._rng.choice(len(probs), p=probs))
