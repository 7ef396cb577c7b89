"""How tensors are laid out in GPU buffers, and converting file bytes to that layout."""

import numpy as np
import wgpu

from pte_wgpu.kernels.wgsl import PACKED, STORAGE
from pte_wgpu.resize.shapes import numel_of
from pte_wgpu.resize.values import HOST_DTYPES

from .errors import ModelFormatError

STORAGE_NP = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "u32": np.uint32}
STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC


# The element types a constant's bytes may have been written in, by the kind of its declared dtype.
SAME_KIND = {"f": (np.float64, np.float32, np.float16), "i": (np.int64, np.int32), "u": (), "b": ()}


def align(n, a):
    return -(-n // a) * a


def storage_dtype(dtype):
    """The numpy dtype of a tensor's elements on the device (64-bit narrowed, bools widened)."""
    return STORAGE_NP[STORAGE[dtype]]


def input_words(arr):
    """A host input's or constant's bytes as written to its buffer: 8-bit elements packed, an odd
    count of 16-bit ones (f16), zero-padded to a whole word (writes are in words)."""
    if arr.nbytes % 4 == 0:
        return arr
    return np.concatenate([arr.view(np.uint8).ravel(), np.zeros(-arr.nbytes % 4, np.uint8)])


def constant_rows(raw, rows):
    """The file's bytes of rows first .. end - 1 (`rows` = (first, end, table dims)) of a table whose
    bytes are `raw` (Constant.rows: a part of a table too large for one binding)."""
    first, end, dims = rows
    row = len(raw) // dims[0]
    return raw[first * row : end * row]


def rearranged(data, tensor):
    """`data`, the stored bytes of a constant `tensor` laid out as in the file, as the tensor is:
    taken in Constant.order along one axis, then with its axes permuted (Constant.permuted)."""
    c = tensor.constant
    elements = np.frombuffer(data, np.uint8 if tensor.dtype in PACKED else storage_dtype(tensor.dtype), numel_of(tensor.dims))
    if c.order:
        dims, axis, indices = c.order
        elements = elements.reshape(dims).take(indices, axis)
    if c.permuted:
        dims, axes = c.permuted
        elements = elements.reshape(dims).transpose(axes)
    return input_words(np.ascontiguousarray(elements))


def to_storage(tensor, raw, what):
    """A constant's bytes from the file as the device stores them; packed bytes are kept as is.
    Bytes that need neither a conversion nor padding to a whole word come as a view of `raw`."""
    n = numel_of(tensor.dims)
    if tensor.dtype in PACKED:
        if len(raw) < n:
            raise ModelFormatError(f"{what}: {len(raw)} bytes for {n} packed elements")
        return input_words(np.frombuffer(raw, np.uint8, n)) if n else np.zeros(4, np.uint8)
    # The delegate may declare INT32/FLOAT32 for bytes that were serialized as 64-bit values, and a
    # float16 tensor widened to float32 at load (no shader-f16) still has 2-byte bytes in the file.
    # An odd number of f16 elements is padded to a whole word, as buffer writes need.
    for source in (HOST_DTYPES[tensor.dtype], *SAME_KIND[np.dtype(HOST_DTYPES[tensor.dtype]).kind]):
        if len(raw) == n * np.dtype(source).itemsize:
            return input_words(np.frombuffer(raw, source, n).astype(storage_dtype(tensor.dtype), copy=False))
    need = n * np.dtype(HOST_DTYPES[tensor.dtype]).itemsize
    if len(raw) < need:
        raise ModelFormatError(f"{what}: {len(raw)} bytes do not hold {n} {tensor.dtype} elements")
    return input_words(np.frombuffer(raw, HOST_DTYPES[tensor.dtype], n).astype(storage_dtype(tensor.dtype), copy=False))
