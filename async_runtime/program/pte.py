"""Reads an ExecuTorch `.pte` program: the `ET12` FlatBuffer, the `eh00` header, segments, named data.

Only the parts this runtime needs become Python objects; every offset is checked (see `flatbuf`).
"""

import struct
from dataclasses import dataclass, field

from ..errors import ModelFormatError
from .flatbuf import Buffer
from pte_wgpu.resize.values import ET_DTYPES, NONE, BoolList, Constant, DoubleList, Scalar, Tensor, ValueList

MAX_VALUES = 1 << 22  # bounds on table sizes a real program never comes near


@dataclass(frozen=True)
class KernelCall:
    op: str  # "aten::expand_copy.out"
    args: tuple


@dataclass(frozen=True)
class DelegateCall:
    delegate: int
    args: tuple


@dataclass(frozen=True)
class MoveCall:
    src: int
    dst: int


@dataclass(frozen=True)
class JumpFalseCall:
    cond: int
    target: int


@dataclass(frozen=True)
class FreeCall:
    value: int


@dataclass(frozen=True)
class Delegate:
    backend: str
    blob: memoryview
    compile_specs: dict


@dataclass
class Method:
    name: str
    values: list
    inputs: tuple
    outputs: tuple
    instructions: list
    delegates: list = field(default_factory=list)
    # value id -> (memory id, byte offset) of each memory-planned tensor: a view that ExecuTorch's
    # memory planning folded away shares its base's, with no instruction between them
    allocations: dict = field(default_factory=dict)


@dataclass
class Program:
    methods: dict
    named_data: dict  # key -> memoryview of the bytes

    def method(self, name):
        try:
            return self.methods[name]
        except KeyError:
            raise ModelFormatError(f"no method {name!r} in the program; it has {sorted(self.methods)}") from None


def _extended_header(data):
    """(program_size, segment_base_offset) from the `eh00` header, or the whole file if there is none."""
    if len(data) >= 32 and bytes(data[8:12]) == b"eh00":
        length = struct.unpack_from("<I", data, 12)[0]
        if length < 24:
            raise ModelFormatError(f"extended header at offset 8 has length {length}, expected at least 24")
        program_size, segment_base = struct.unpack_from("<QQ", data, 16)
        if not 0 < program_size <= len(data) or segment_base > len(data):
            raise ModelFormatError(
                f"extended header at offset 8: program size {program_size} / segment base {segment_base} "
                f"do not fit the {len(data)}-byte file"
            )
        return program_size, segment_base
    return len(data), len(data)


def read_program(data):
    data = memoryview(data).cast("B")
    program_size, segment_base = _extended_header(data)
    root = Buffer(data[:program_size], ".pte program", identifier=b"ET12").root()

    segments = []
    for seg in root.tables(4, "segments"):
        start, size = segment_base + seg.scalar(0, "u64"), seg.scalar(1, "u64")
        if start + size > len(data):
            raise ModelFormatError(
                f"segment {len(segments)} at file offset {start} (+{size} bytes) lies outside the {len(data)}-byte file"
            )
        segments.append(data[start : start + size])

    def segment(i, what):
        if not 0 <= i < len(segments):
            raise ModelFormatError(f"{what} names segment {i}, but the file has {len(segments)}")
        return segments[i]

    named = {}
    for nd in root.tables(7, "named_data"):
        named[nd.string(0, "named_data key")] = segment(nd.scalar(1, "u32"), f"named data {nd.string(0, 'key')!r}")

    inline = [d.bytes(0, "backend_delegate_data") for d in root.tables(3, "backend_delegate_data")]
    constant_buffers = [b.bytes(0, "constant_buffer") for b in root.tables(2, "constant_buffer")]
    const_seg = root.table(5, "constant_segment")
    if const_seg is not None and const_seg.count(1, "constant_segment offsets"):
        seg = segment(const_seg.scalar(0, "u32"), "constant_segment")
        offsets = const_seg.scalars(1, "u64", "constant_segment offsets")
        constant_data = [seg[o : offsets[i + 1] if i + 1 < len(offsets) else len(seg)] for i, o in enumerate(offsets)]
        if any(o > len(seg) for o in offsets):
            raise ModelFormatError("constant_segment offsets lie outside their segment")
    else:
        constant_data = constant_buffers

    methods = {}
    for plan in root.tables(1, "execution_plan"):
        m = _read_method(plan, inline, segment, constant_data)
        methods[m.name] = m
    return Program(methods, named)


def _read_method(plan, inline, segment, constant_data):
    name = plan.string(0, "execution_plan name")
    n_values = plan.count(2, "values")
    if n_values > MAX_VALUES:
        raise ModelFormatError(f"method {name!r} claims {n_values} values")
    evalues = list(plan.tables(2, "values"))
    values = [_read_evalue(v, i, constant_data) for i, v in enumerate(evalues)]
    allocations = {i: at for i, (v, ev) in enumerate(zip(values, evalues)) if isinstance(v, Tensor) and (at := _allocation(ev)) is not None}

    def vid(i, what):
        if not 0 <= i < len(values):
            raise ModelFormatError(f"{what} refers to value {i}, but method {name!r} has {len(values)} values")
        return i

    for i, v in enumerate(values):
        if isinstance(v, ValueList):  # int and tensor lists hold value ids; -1 is an optional tensor's None
            for item in v.items:
                if item != -1:
                    vid(item, f"value {i} (a list)")

    ops = [
        o.string(0, "operator name") + (("." + o.string(1, "")) if o.string(1, "") else "")
        for o in plan.tables(6, "operators")
    ]
    delegates = []
    for d in plan.tables(7, "delegates"):
        ref = d.table(1, "delegate processed")
        location, index = (ref.scalar(0, "i8"), ref.scalar(1, "u32")) if ref is not None else (0, 0)
        if location == 0:
            if index >= len(inline):
                raise ModelFormatError(f"delegate refers to inline data {index}, but there are {len(inline)}")
            blob = inline[index]
        else:
            blob = segment(index, "delegate")
        specs = {s.string(0, "compile spec key"): bytes(s.bytes(1, "compile spec")) for s in d.tables(2, "compile_specs")}
        delegates.append(Delegate(d.string(0, "delegate id"), blob, specs))

    instructions = []
    chains = list(plan.tables(5, "chains"))
    if len(chains) != 1:
        raise ModelFormatError(f"method {name!r} has {len(chains)} chains; exactly one is supported")
    for ins in chains[0].tables(2, "instructions"):
        kind, a = ins.scalar(0, "u8"), ins.table(1, "instruction")
        if a is None:
            raise ModelFormatError(f"instruction {len(instructions)} of {name!r} has no arguments")
        if kind in (1, 2):
            args = tuple(vid(x, f"instruction {len(instructions)}") for x in a.scalars(1, "i32", "instruction args"))
            index = a.scalar(0, "i32")
            table = ops if kind == 1 else delegates
            if not 0 <= index < len(table):
                raise ModelFormatError(f"instruction {len(instructions)} refers to entry {index} of {len(table)}")
            instructions.append(KernelCall(ops[index], args) if kind == 1 else DelegateCall(index, args))
        elif kind == 3:
            instructions.append(MoveCall(vid(a.scalar(0, "i32"), "move"), vid(a.scalar(1, "i32"), "move")))
        elif kind == 4:
            instructions.append(JumpFalseCall(vid(a.scalar(0, "i32"), "jump"), a.scalar(1, "i32")))
        elif kind == 5:
            instructions.append(FreeCall(vid(a.scalar(0, "i32"), "free")))
        else:
            raise ModelFormatError(f"instruction {len(instructions)} of {name!r} has unknown kind {kind}")
    inputs = tuple(vid(i, "method input") for i in plan.scalars(3, "i32", "inputs"))
    outputs = tuple(vid(i, "method output") for i in plan.scalars(4, "i32", "outputs"))
    return Method(name, values, inputs, outputs, instructions, delegates, allocations)


def _allocation(ev):
    """(memory id, byte offset) of a memory-planned tensor's EValue, else None."""
    details = ev.table(1, "value").table(6, "tensor allocation_info")
    if details is None:
        return None
    return details.scalar(0, "u32"), details.scalar(1, "u32") | details.scalar(2, "u32") << 32


def _read_evalue(ev, index, constant_data):
    kind, v = ev.scalar(0, "u8"), ev.table(1, f"value {index}")
    if kind in (0, 1) or v is None:
        return NONE
    if kind == 2:
        return Scalar(v.scalar(0, "i64"))
    if kind == 3:
        return Scalar(v.scalar(0, "bool"))
    if kind == 4:
        return Scalar(v.scalar(0, "f64"))
    if kind == 5:
        code = v.scalar(0, "i8")
        if code not in ET_DTYPES:
            raise ModelFormatError(f"value {index}: unsupported tensor scalar type {code}")
        sizes = v.scalars(2, "i32", f"value {index} sizes")
        if any(s < 0 for s in sizes):
            raise ModelFormatError(f"value {index}: negative size in {sizes}")
        buffer_idx = v.scalar(5, "u32")
        constant = None
        if buffer_idx > 0 and not v.has(6):  # constant data, not memory-planned
            if buffer_idx >= len(constant_data):
                raise ModelFormatError(f"value {index}: constant buffer {buffer_idx} of {len(constant_data)}")
            raw = constant_data[buffer_idx]
            constant = Constant(blob=raw, offset=0, length=len(raw))
        return Tensor(ET_DTYPES[code], tuple(sizes), constant, dynamic=v.scalar(8, "i8") != 0)
    if kind == 6:
        return Scalar(v.string(0, f"value {index} string"))
    if kind == 7:
        # An ExecuTorch IntList holds value ids of Ints (some of them SymInts), like a VkGraph ValueList.
        return ValueList(v.scalars(0, "i64", f"value {index} int list"))
    if kind == 8:
        return DoubleList(v.scalars(0, "f64", f"value {index} double list"))
    if kind == 9:
        return BoolList(v.scalars(0, "bool", f"value {index} bool list"))
    if kind in (10, 11):
        return ValueList(v.scalars(0, "i32", f"value {index} tensor list"))
    raise ModelFormatError(f"value {index} has unknown type tag {kind}")
