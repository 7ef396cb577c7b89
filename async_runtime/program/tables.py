"""Constant tensors larger than one storage binding, cut at load into parts of whole rows, each its
own constant tensor (an H100 binds 2 GiB; lavapipe 128 MiB):
- an embedding table (Phi-4-mini's 200,064 x 3,072 fp32 embedding is 2.46 GB): the lookup becomes
  `pte_wgpu.embedding_parts` (kernels/tensor/embedding.py), which reads a row from its part;
- a linear's [N, K] weight (the same size as an LM head): one linear per part, each giving its
  rows' outputs, and `aten.cat` of them along the last dim."""

from dataclasses import replace

from pte_wgpu.kernels.tensor.embedding import EMBEDDING_PARTS, MAX_PARTS
from pte_wgpu.kernels.wgsl import PACKED, elem_bytes, is_float
from pte_wgpu.resize.values import Scalar, Tensor, ValueList

from ..errors import ModelFormatError

LOOKUPS = ("aten.embedding.default", "aten::embedding.out")  # [weight, indices, .., out]
LINEAR = "aten.linear.default"  # [x, weight, bias, out]
CAT = "aten.cat.default"  # [tensors, dim, out]


def _too_large(graph, vid, limit):
    """The rows a part of constant 2-D tensor `vid` takes, or None where it fits one binding or is
    not such a tensor, or also feeds another op (a tied output: the load names it as too large)."""
    t = graph.values[vid]
    if not isinstance(t, Tensor) or t.constant is None or len(t.dims) != 2 or t.dtype in PACKED:
        return None
    row = t.dims[1] * elem_bytes(t.dtype)
    if t.dims[0] * row <= limit or sum(a == vid for _, args in graph.calls for a in args) > 1:
        return None
    return limit // row


def _row_parts(values, vid, per):
    """Cut constant tensor `vid` into new constant tensors of `per` rows (the last fewer); returns
    their ids. Nothing reads the whole tensor afterwards: it is left with no rows."""
    t = values[vid]
    parts = []
    for first in range(0, t.dims[0], per):
        end = min(first + per, t.dims[0])
        values.append(Tensor(t.dtype, (end - first, t.dims[1]), replace(t.constant, rows=(first, end, t.dims))))
        parts.append(len(values) - 1)
    values[vid] = Tensor(t.dtype, (0, t.dims[1]))
    return parts


def split_tables(graph, limit):
    """Rewrite, in place, each lookup of `graph` whose constant table passes `limit` bytes (and
    feeds no other op) into pte_wgpu.embedding_parts over parts of at most `limit` bytes."""
    values = graph.values
    for k, (name, args) in enumerate(graph.calls):
        per = _too_large(graph, args[0], limit) if name in LOOKUPS else None
        if per is None:
            continue
        table = values[args[0]]
        if not per or -(-table.dims[0] // per) > MAX_PARTS:
            raise ModelFormatError(
                f"embedding table {args[0]} {table.dtype}{list(table.dims)} does not fit {MAX_PARTS} parts of whole rows "
                f"of at most {limit} bytes (a lookup binds at most {MAX_PARTS})"
            )
        parts = _row_parts(values, args[0], per)
        values.append(Scalar(per))
        graph.calls[k] = (EMBEDDING_PARTS, (args[1], len(values) - 1, *parts, args[-1]))


def split_weights(graph, limit):
    """Rewrite, in place, each aten.linear of `graph` whose constant float weight passes `limit`
    bytes (and feeds no other op) into linears over parts of at most `limit` bytes of its rows,
    then aten.cat of their outputs along the last dim into the linear's output."""
    values, calls = graph.values, []
    for name, args in graph.calls:
        per = _too_large(graph, args[1], limit) if name == LINEAR else None
        if per is None:
            calls.append((name, args))
            continue
        x, weight, bias, out = args
        w = values[weight]
        if not per or not is_float(w.dtype) or isinstance(values[bias], Tensor):
            raise ModelFormatError(
                f"linear weight {weight} {w.dtype}{list(w.dims)} passes one binding ({limit} bytes) and cannot be cut "
                f"into rows: {'a row is larger' if not per else 'it has a bias' if is_float(w.dtype) else 'not a float weight'}"
            )
        outs = []
        for part in _row_parts(values, weight, per):
            values.append(Tensor(values[out].dtype, values[out].dims[:-1] + (values[part].dims[0],)))
            outs.append(len(values) - 1)
            calls.append((LINEAR, (x, part, bias, outs[-1])))
        values.append(ValueList(tuple(outs)))
        values.append(Scalar(-1))
        calls.append((CAT, (len(values) - 2, len(values) - 1, out)))
    graph.calls[:] = calls
