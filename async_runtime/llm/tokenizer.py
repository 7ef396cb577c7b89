"""Byte-level BPE tokenizer + chat template, built from a GGUF's metadata (no torch, no ExecuTorch).

    tok = Tokenizer.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")   # needs the `gguf` package
    tok.save("tokenizer.json")                                      # next to the exported .pte
    tok = Tokenizer.load("tokenizer.json")                          # needs only `tokenizers`
    ids = tok.chat([{"role": "user", "content": "Hi"}])             # prompt ids, ends "<|im_start|>assistant\\n"
    text = tok.decode(generated_ids, skip_special_tokens=True)

Supported: `tokenizer.ggml.model == "gpt2"` (GPT-2 byte-level BPE) with the pre-tokenizers llama.cpp
calls gpt2/default and smollm/starcoder/refact (single digits split off, then GPT-2's regex), which
is what HF's SmolLM2 tokenizer.json does. Control tokens (token type 3) and user-defined ones
(type 4) become added special tokens, so "<|im_start|>" in text encodes to its id.

Chat template: rendered with jinja2 (the template string from `tokenizer.chat_template`, in a
sandbox, as transformers does) when jinja2 is installed; otherwise with a built-in ChatML renderer
(`<|im_start|>role\\ncontent<|im_end|>\\n`, plus the template's default system prompt when the
first message is not a system one), which gives the same text for SmolLM2's template.
"""

import json
import os
import re

_FORMAT = "pte-wgpu-tokenizer/1"

# llama.cpp pre-tokenizer names (tokenizer.ggml.pre) -> whether single digits are split off first.
_GPT2_PRE = {"default": False, "gpt2": False, "gpt-2": False, "smollm": True, "starcoder": True, "refact": True}

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types


def _build(tokens, merges, special, split_digits):
    from tokenizers import AddedToken, Tokenizer as _Tok, decoders, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    tok = _Tok(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in sorted(special)])
    return tok


class Tokenizer:
    """A `tokenizers.Tokenizer` plus BOS/EOS ids and the chat template."""

    def __init__(self, tokenizer, *, chat_template=None, bos_id=None, eos_id=None, stop_ids=(),
                 add_bos=False):
        self.tokenizer = tokenizer  # tokenizers.Tokenizer
        self.chat_template = chat_template
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        stops = [i for i in (eos_id, *stop_ids) if i is not None]
        self.stop_ids = frozenset(stops)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_gguf(cls, path):
        """From a GGUF file's `tokenizer.*` metadata (reads metadata only; tensors stay on disk)."""
        from gguf import GGUFReader

        fields = GGUFReader(path).fields

        def get(key, default=None):
            f = fields.get(key)
            return default if f is None else f.contents()

        kind = get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"{path}: tokenizer.ggml.model {kind!r} is not supported (only 'gpt2' byte-level BPE)")
        pre = get("tokenizer.ggml.pre", "default")
        if pre not in _GPT2_PRE:
            raise ValueError(f"{path}: pre-tokenizer {pre!r} is not supported (known: {sorted(_GPT2_PRE)})")
        tokens = get("tokenizer.ggml.tokens")
        merges = get("tokenizer.ggml.merges")
        types = get("tokenizer.ggml.token_type", [1] * len(tokens))
        special = [i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)]
        bos, eos = get("tokenizer.ggml.bos_token_id"), get("tokenizer.ggml.eos_token_id")
        vocab = {t: i for i, t in enumerate(tokens)}
        stops = [get("tokenizer.ggml.eot_token_id"), get("tokenizer.ggml.eom_token_id")]
        stops += [vocab.get(t) for t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")]
        return cls(
            _build(tokens, merges, special, _GPT2_PRE[pre]),
            chat_template=get("tokenizer.chat_template"),
            bos_id=None if bos is None else int(bos),
            eos_id=None if eos is None else int(eos),
            stop_ids=[int(i) for i in stops if i is not None],
            add_bos=bool(get("tokenizer.ggml.add_bos_token", False)),
        )

    def to_dict(self):
        return dict(format=_FORMAT, tokenizer=json.loads(self.tokenizer.to_str()), chat_template=self.chat_template,
                    bos_id=self.bos_id, eos_id=self.eos_id, stop_ids=sorted(self.stop_ids), add_bos=self.add_bos)

    def save(self, path):
        """One JSON file: the `tokenizers` JSON plus chat template and special ids."""
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, ensure_ascii=False)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path):
        """From `save`'s file (needs only the `tokenizers` package)."""
        from tokenizers import Tokenizer as _Tok

        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        if d.get("format") != _FORMAT:
            raise ValueError(f"{path}: not a {_FORMAT} file")
        return cls(_Tok.from_str(json.dumps(d["tokenizer"])), chat_template=d.get("chat_template"),
                   bos_id=d.get("bos_id"), eos_id=d.get("eos_id"), stop_ids=d.get("stop_ids", ()),
                   add_bos=d.get("add_bos", False))

    @classmethod
    def for_model(cls, pte_path):
        """The `tokenizer.json` that `gguf_export.export` writes next to the `.pte`."""
        return cls.load(os.path.join(os.path.dirname(os.path.abspath(pte_path)), "tokenizer.json"))

    # ------------------------------------------------------------------ use

    @property
    def vocab_size(self):
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text, *, add_bos=None):
        """Token ids of `text`; special-token strings in it (e.g. "<|im_start|>") become their ids."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids, *, skip_special_tokens=False):
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def decode_stream(self, *, skip_special_tokens=True):
        """Incremental decoder: `step(id)` returns the new text (or None while a UTF-8 char is incomplete).

            stream = tok.decode_stream()
            for i in generated: print(stream.step(i) or "", end="")
        """
        from tokenizers.decoders import DecodeStream

        stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        tok = self.tokenizer

        class _Stream:
            def step(self, token_id):
                return stream.step(tok, int(token_id))

        return _Stream()

    def render_chat(self, messages, *, add_generation_prompt=True):
        """The prompt text for `messages` ([{"role": ..., "content": ...}, ...])."""
        messages = [dict(m) for m in messages]
        template = self.chat_template
        if template:
            try:
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ImportError:
                pass
            else:
                env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                vocab = self.tokenizer.get_vocab(with_added_tokens=True)
                names = {i: t for t, i in vocab.items()}
                return env.from_string(template).render(
                    messages=messages, add_generation_prompt=add_generation_prompt,
                    bos_token=names.get(self.bos_id, ""), eos_token=names.get(self.eos_id, ""))
        return render_chatml(messages, add_generation_prompt=add_generation_prompt,
                             default_system=chatml_default_system(template))

    def chat(self, messages, *, add_generation_prompt=True):
        """Prompt token ids for `messages` (the chat template, then `encode`)."""
        return self.encode(self.render_chat(messages, add_generation_prompt=add_generation_prompt), add_bos=False)


def chatml_default_system(template):
    """The system prompt a ChatML template inserts when the first message is not a system one."""
    if not template:
        return None
    m = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template, re.S)
    return m.group(1) if m and "!= 'system'" in template else None


def render_chatml(messages, *, add_generation_prompt=True, default_system=None):
    """`<|im_start|>role\\ncontent<|im_end|>\\n` per message (+ `<|im_start|>assistant\\n`)."""
    parts = []
    if default_system is not None and (not messages or messages[0]["role"] != "system") and messages:
        parts.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
    for m in messages:
        parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)
