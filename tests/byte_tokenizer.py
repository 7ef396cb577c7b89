"""A tokenizer for the tiny Llama export (vocabulary 257), importable by Ray's worker processes."""


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255 and id 256 as the end of a turn."""

    stop_ids = {256}

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", "replace")

    def chat(self, messages):
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"
        return self.encode(text)
