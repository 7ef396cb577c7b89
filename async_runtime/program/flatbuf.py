"""A small FlatBuffers reader that checks every offset and length against the buffer.

The `flatbuffers` package trusts the bytes it is given; a truncated or hostile `.pte` would make it
raise IndexError or struct.error deep inside. Here every read is checked first and a failure is a
`ModelFormatError` that names what was being read and where.
"""

import struct

from ..errors import ModelFormatError

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")

SCALARS = {
    "bool": _U8,
    "u8": _U8,
    "i8": struct.Struct("<b"),
    "u16": _U16,
    "i32": _I32,
    "u32": _U32,
    "i64": _I64,
    "u64": _U64,
    "f64": _F64,
}


class Buffer:
    """A FlatBuffer held in memory; `what` names it in error messages."""

    def __init__(self, data, what, identifier=None):
        self.data = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
        self.what = what
        if len(self.data) < 8:
            raise ModelFormatError(f"{what}: {len(self.data)} bytes is too short for a FlatBuffer")
        if identifier is not None and bytes(self.data[4:8]) != identifier:
            raise ModelFormatError(
                f"{what}: file identifier {bytes(self.data[4:8])!r} at offset 4, expected {identifier!r}"
            )

    def check(self, pos, size, what):
        if pos < 0 or size < 0 or pos + size > len(self.data):
            raise ModelFormatError(
                f"{self.what}: {what} at offset {pos} (+{size} bytes) lies outside the {len(self.data)}-byte buffer"
            )

    def read(self, fmt, pos, what):
        self.check(pos, fmt.size, what)
        return fmt.unpack_from(self.data, pos)[0]

    def root(self):
        return Table(self, self.read(_U32, 0, "root offset"), "root table")


class Table:
    """One table: fields are read by their slot number in the schema (a union takes two slots)."""

    __slots__ = ("buf", "pos", "what", "_vt", "_vt_len")

    def __init__(self, buf, pos, what):
        self.buf, self.pos, self.what = buf, pos, what
        vt = pos - buf.read(_I32, pos, f"{what} vtable offset")
        vt_len = buf.read(_U16, vt, f"{what} vtable")
        if vt_len < 4 or vt_len % 2:
            raise ModelFormatError(f"{buf.what}: {what} vtable at offset {vt} has bad length {vt_len}")
        buf.check(vt, vt_len, f"{what} vtable")
        table_len = buf.read(_U16, vt + 2, f"{what} vtable")
        buf.check(pos, max(table_len, 4), f"{what} table")
        self._vt, self._vt_len = vt, vt_len

    def _field(self, slot):
        entry = 4 + 2 * slot
        if entry + 2 > self._vt_len:
            return 0
        return _U16.unpack_from(self.buf.data, self._vt + entry)[0]

    def has(self, slot):
        return self._field(slot) != 0

    def scalar(self, slot, kind, default=0):
        off = self._field(slot)
        if not off:
            return default
        value = self.buf.read(SCALARS[kind], self.pos + off, f"{self.what} field {slot}")
        return bool(value) if kind == "bool" else value

    def _target(self, slot, what):
        off = self._field(slot)
        if not off:
            return None
        at = self.pos + off
        return at + self.buf.read(_U32, at, what)

    def table(self, slot, what):
        at = self._target(slot, what)
        return None if at is None else Table(self.buf, at, what)

    def string(self, slot, what, default=""):
        at = self._target(slot, what)
        if at is None:
            return default
        n = self.buf.read(_U32, at, f"{what} length")
        self.buf.check(at + 4, n, what)
        try:
            return bytes(self.buf.data[at + 4 : at + 4 + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise ModelFormatError(f"{self.buf.what}: {what} at offset {at} is not UTF-8") from None

    def _vector(self, slot, elem_size, what):
        at = self._target(slot, what)
        if at is None:
            return None, 0
        n = self.buf.read(_U32, at, f"{what} length")
        self.buf.check(at + 4, n * elem_size, f"{what} ({n} elements)")
        return at + 4, n

    def scalars(self, slot, kind, what):
        """A vector of scalars as a tuple."""
        fmt = SCALARS[kind]
        start, n = self._vector(slot, fmt.size, what)
        if not n:
            return ()
        values = struct.unpack_from(f"<{n}{fmt.format[-1]}", self.buf.data, start)
        return tuple(bool(v) for v in values) if kind == "bool" else values

    def bytes(self, slot, what):
        """A [ubyte] vector as a zero-copy memoryview."""
        start, n = self._vector(slot, 1, what)
        return self.buf.data[start : start + n] if n else self.buf.data[0:0]

    def tables(self, slot, what):
        """A vector of tables, read lazily."""
        start, n = self._vector(slot, 4, what)
        for i in range(n):
            at = start + 4 * i
            yield Table(self.buf, at + _U32.unpack_from(self.buf.data, at)[0], f"{what}[{i}]")

    def count(self, slot, what):
        return self._vector(slot, 4, what)[1]

    def strings(self, slot, what):
        start, n = self._vector(slot, 4, what)
        out = []
        for i in range(n):
            at = start + 4 * i
            at += _U32.unpack_from(self.buf.data, at)[0]
            m = self.buf.read(_U32, at, f"{what}[{i}] length")
            self.buf.check(at + 4, m, f"{what}[{i}]")
            out.append(bytes(self.buf.data[at + 4 : at + 4 + m]).decode("utf-8", "replace"))
        return out
