"""Tables larger than one storage binding: a constant embedding table past the device's
`max_storage_binding` (Phi-4-mini's 200,064 x 3,072 fp32 embedding is 2.46 GB, an H100 binds
2 GiB) is cut into parts of whole rows, each its own constant tensor, and the lookup becomes
`pte_wgpu.embedding_parts` (kernels/tensor/embedding.py), which reads a row from its part."""

from pte_wgpu.kernels.tensor.embedding import EMBEDDING_PARTS, MAX_PARTS
from pte_wgpu.kernels.wgsl import PACKED, elem_bytes
from pte_wgpu.resize.shapes import numel_of
from pte_wgpu.resize.values import Constant, Scalar, Tensor

from ..errors import ModelFormatError

LOOKUPS = ("aten.embedding.default", "aten::embedding.out")  # [weight, indices, .., out]


def split_tables(graph, limit):
    """Rewrite, in place, each lookup of `graph` whose constant table passes `limit` bytes into
    pte_wgpu.embedding_parts over parts of at most `limit` bytes; returns how many."""
    values, split = graph.values, 0
    for k, (name, args) in enumerate(graph.calls):
        if name not in LOOKUPS or not isinstance(values[args[0]], Tensor):
            continue
        table = values[args[0]]
        row = numel_of(table.dims[1:]) * elem_bytes(table.dtype)
        if table.constant is None or numel_of(table.dims) * elem_bytes(table.dtype) <= limit or len(table.dims) != 2 or table.dtype in PACKED:
            continue
        per = limit // row  # rows a part
        count = -(-table.dims[0] // per)
        if per == 0 or count > MAX_PARTS:
            raise ModelFormatError(
                f"embedding table {args[0]} {table.dtype}{list(table.dims)} needs {count} parts of at most {limit} bytes; "
                f"a lookup binds at most {MAX_PARTS}"
            )
        if sum(a == args[0] for _, other in graph.calls for a in other) > 1:
            continue  # the table feeds another op too (a tied output): the load names it as too large
        parts = []
        for first in range(0, table.dims[0], per):
            end = min(first + per, table.dims[0])
            constant = Constant(table.constant.key, table.constant.blob, table.constant.offset, table.constant.length, (first, end, table.dims))
            values.append(Tensor(table.dtype, (end - first,) + table.dims[1:], constant))
            parts.append(len(values) - 1)
        values.append(Scalar(per))
        graph.calls[k] = (EMBEDDING_PARTS, (args[1], len(values) - 1, *parts, args[-1]))
        values[args[0]] = Tensor(table.dtype, (0,) + table.dims[1:])  # nothing reads the whole table now
        split += 1
    return split
