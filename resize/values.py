"""Plain typed values shared by the `.pte` reader, the `VkGraph` reader and the graph build."""

from dataclasses import dataclass

import numpy as np

# numpy dtype of each dtype name, as the host sees it.
HOST_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "float64": np.float64,
    "int32": np.int32,
    "int64": np.int64,
    "int8": np.int8,
    "uint8": np.uint8,
    "int16": np.int16,
    "bool": np.bool_,
}

# VkDataType numbers (backends/vulkan/serialization/schema.fbs).
VK_DTYPES = {0: "bool", 1: "uint8", 2: "int8", 3: "int32", 4: "float16", 5: "float32", 6: "float64", 7: "int64"}
# ScalarType numbers (schema/scalar_type.fbs).
ET_DTYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64", 11: "bool"}


@dataclass(frozen=True, slots=True)
class Constant:
    """Where a constant tensor's bytes are: `key` in the named data, or an offset and length in
    `blob`; with `rows` = (first, end, table dims), rows first .. end - 1 of the table those bytes
    hold (a part of a table too large for one binding); with `order` = (dims, axis, indices), those
    bytes as an array of `dims` taken along `axis` in the order of `indices`, and then with
    `permuted` = (dims, axes), that array as one of `dims` with its axes permuted by `axes`
    (layouts the kernels read better, chosen at load)."""

    key: str | None = None
    blob: object = None
    offset: int = 0
    length: int = 0
    rows: tuple | None = None
    permuted: tuple | None = None
    order: tuple | None = None


@dataclass(frozen=True, slots=True)
class Tensor:
    dtype: str
    dims: tuple  # the maximum shape; what the buffer holds
    constant: Constant | None = None
    mem_obj: int | None = None  # memory-planning alias group inside its delegate
    dynamic: bool = False  # the program marks its shape as bounded-dynamic


@dataclass(frozen=True, slots=True)
class Scalar:
    """An Int, Double, Bool, String or None value fixed in the file."""

    value: object


@dataclass(frozen=True, slots=True)
class IntList:
    items: tuple


@dataclass(frozen=True, slots=True)
class DoubleList:
    items: tuple


@dataclass(frozen=True, slots=True)
class BoolList:
    items: tuple


@dataclass(frozen=True, slots=True)
class ValueList:
    """A list of value ids (tensors, or Ints and SymInts of a size list)."""

    items: tuple


@dataclass(frozen=True, slots=True)
class SymInt:
    """A live scalar computed while running (a size, a position)."""

    initial: int = 0


NONE = Scalar(None)
