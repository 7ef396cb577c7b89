"""Tables larger than one storage binding: a constant embedding table past the device's
`max_storage_binding` (Phi-4-mini's 200,064 x 3,072 fp32 embedding is 2.46 GB, an H100 binds
2 GiB) is cut into parts of whole rows, each its own constant tensor, and the lookup becomes
`pte_wgpu.embedding_parts` (kernels/tensor/embedding.py), which reads a row from its part."""

from dataclasses import replace

from pte_wgpu.kernels.tensor.embedding import EMBEDDING_PARTS, MAX_PARTS
from pte_wgpu.kernels.wgsl import PACKED, elem_bytes
from pte_wgpu.resize.values import Scalar, Tensor

from ..errors import ModelFormatError

LOOKUPS = ("aten.embedding.default", "aten::embedding.out")  # [weight, indices, .., out]


def split_tables(graph, limit):
    """Rewrite, in place, each lookup of `graph` whose constant table passes `limit` bytes (and
    feeds no other op) into pte_wgpu.embedding_parts over parts of at most `limit` bytes."""
    values = graph.values
    for k, (name, args) in enumerate(graph.calls):
        table = values[args[0]] if name in LOOKUPS else None
        if not isinstance(table, Tensor) or table.constant is None or len(table.dims) != 2 or table.dtype in PACKED:
            continue
        row = table.dims[1] * elem_bytes(table.dtype)
        if table.dims[0] * row <= limit or sum(a == args[0] for _, other in graph.calls for a in other) > 1:
            continue  # fits, or also feeds another op (a tied output): the load names it as too large
        per = limit // row  # rows a part
        if not per or -(-table.dims[0] // per) > MAX_PARTS:
            raise ModelFormatError(
                f"embedding table {args[0]} {table.dtype}{list(table.dims)} does not fit {MAX_PARTS} parts of whole rows "
                f"of at most {limit} bytes (a lookup binds at most {MAX_PARTS})"
            )
        parts = []
        for first in range(0, table.dims[0], per):
            end = min(first + per, table.dims[0])
            values.append(Tensor(table.dtype, (end - first, table.dims[1]), replace(table.constant, rows=(first, end, table.dims))))
            parts.append(len(values) - 1)
        values.append(Scalar(per))
        graph.calls[k] = (EMBEDDING_PARTS, (args[1], len(values) - 1, *parts, args[-1]))
        values[args[0]] = Tensor(table.dtype, (0, table.dims[1]))  # nothing reads the whole table now
