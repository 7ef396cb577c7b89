"""Reads a Vulkan delegate blob: the 30-byte `VH00` header and the `VK00` `VkGraph` FlatBuffer."""

import struct
from dataclasses import dataclass

from ..errors import ModelFormatError
from .flatbuf import Buffer
from pte_wgpu.resize.values import (
    NONE,
    VK_DTYPES,
    BoolList,
    Constant,
    DoubleList,
    IntList,
    Scalar,
    SymInt,
    Tensor,
    ValueList,
)

HEADER_SIZE = 30
NAMED = 0xFFFFFFFFFFFFFFFF  # VkBytes.offset meaning "look the bytes up by named_key"
MAX_RANK = 8


@dataclass(frozen=True)
class OperatorCall:
    name: str
    args: tuple


@dataclass
class VkGraph:
    values: list
    chain: list
    inputs: tuple
    outputs: tuple


def read_header(blob):
    """(flatbuffer_offset, flatbuffer_size, bytes_offset, bytes_size) after checking them."""
    if len(blob) < HEADER_SIZE or bytes(blob[4:8]) != b"VH00":
        raise ModelFormatError(
            f"delegate blob: expected a VH00 header at offset 4, found {bytes(blob[4:8])!r} ({len(blob)} bytes)"
        )
    size, fb_off, fb_size, bytes_off, bytes_size = struct.unpack_from("<HIIIQ", blob, 8)
    if size < HEADER_SIZE or fb_off < size or fb_size == 0 or fb_off + fb_size > len(blob):
        raise ModelFormatError(
            f"VH00 header: flatbuffer at {fb_off} (+{fb_size}) does not fit the {len(blob)}-byte blob "
            f"(header size {size})"
        )
    if bytes_off < fb_off + fb_size or bytes_off > len(blob):
        raise ModelFormatError(f"VH00 header: constant bytes offset {bytes_off} is out of place")
    if bytes_size == 0:
        bytes_size = len(blob) - bytes_off
    if bytes_off + bytes_size > len(blob):
        raise ModelFormatError(
            f"VH00 header: constant bytes at {bytes_off} (+{bytes_size}) exceed the {len(blob)}-byte blob"
        )
    return fb_off, fb_size, bytes_off, bytes_size


def read_vkgraph(blob):
    blob = memoryview(blob).cast("B")
    fb_off, fb_size, bytes_off, bytes_size = read_header(blob)
    raw = blob[bytes_off : bytes_off + bytes_size]
    root = Buffer(blob[fb_off : fb_off + fb_size], "VkGraph", identifier=b"VK00").root()

    constants = []
    for c in root.tables(5, "constants"):
        offset, length, key = c.scalar(0, "u64"), c.scalar(1, "u64"), c.string(2, "named_key", None)
        if offset == NAMED:
            if not key:
                raise ModelFormatError(f"VkGraph constant {len(constants)} has no offset and no named key")
            constants.append(Constant(key=key, length=length))
        else:
            if offset + length > len(raw):
                raise ModelFormatError(
                    f"VkGraph constant {len(constants)} at {offset} (+{length}) exceeds the {len(raw)}-byte region"
                )
            constants.append(Constant(blob=raw, offset=offset, length=length))

    values = [_read_value(v, i, constants) for i, v in enumerate(root.tables(2, "values"))]
    n = len(values)

    def vid(i, what):
        if not 0 <= i < n:
            raise ModelFormatError(f"VkGraph {what} refers to value {i}, but there are {n} values")
        return i

    for i, v in enumerate(values):
        if isinstance(v, ValueList):
            for item in v.items:
                vid(item, f"value list {i}")
    chain = []
    for k, op in enumerate(root.tables(1, "chain")):
        name = op.string(1, f"operator {k} name")
        args = tuple(vid(a, f"operator {k} ({name})") for a in op.scalars(2, "i32", f"operator {k} args"))
        chain.append(OperatorCall(name, args))
    inputs = tuple(vid(i, "input") for i in root.scalars(3, "u32", "input_ids"))
    outputs = tuple(vid(i, "output") for i in root.scalars(4, "u32", "output_ids"))
    return VkGraph(values, chain, inputs, outputs)


def _read_value(vv, index, constants):
    kind, v = vv.scalar(0, "u8"), vv.table(1, f"value {index}")
    if kind in (0, 1) or v is None:
        return NONE
    if kind == 2:
        return Scalar(v.scalar(0, "i64"))
    if kind == 3:
        return Scalar(v.scalar(0, "f64"))
    if kind == 4:
        return Scalar(v.scalar(0, "bool"))
    if kind == 5:
        code = v.scalar(0, "i8")
        if code not in VK_DTYPES:
            raise ModelFormatError(f"VkGraph value {index}: unknown datatype {code}")
        dims = v.scalars(1, "u32", f"value {index} dims")
        if len(dims) > MAX_RANK:
            raise ModelFormatError(f"VkGraph value {index}: rank {len(dims)} exceeds {MAX_RANK}")
        cid, mem = v.scalar(2, "i32"), v.scalar(3, "i32")
        constant = None
        if cid >= 0:
            if cid >= len(constants):
                raise ModelFormatError(f"VkGraph value {index}: constant {cid} of {len(constants)}")
            constant = constants[cid]
        return Tensor(VK_DTYPES[code], tuple(dims), constant, mem if mem >= 0 else None)
    if kind == 6:
        return IntList(v.scalars(0, "i64", f"value {index} int list"))
    if kind == 7:
        return DoubleList(v.scalars(0, "f64", f"value {index} double list"))
    if kind == 8:
        return BoolList(v.scalars(0, "bool", f"value {index} bool list"))
    if kind == 9:
        return ValueList(v.scalars(0, "i32", f"value {index} value list"))
    if kind == 10:
        return Scalar(v.string(0, f"value {index} string"))
    if kind == 11:
        return SymInt(v.scalar(0, "i32"))
    raise ModelFormatError(f"VkGraph value {index} has unknown type tag {kind}")
