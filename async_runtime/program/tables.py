"""Constant tensors larger than one storage binding, cut at load into parts of whole rows, each its
own constant tensor (an H100 binds 2 GiB; lavapipe 128 MiB), once for all the ops that read them:
- an embedding table (Phi-4-mini's 200,064 x 3,072 fp32 embedding is 2.46 GB): the lookup becomes
  `pte_wgpu.embedding_parts` (kernels/tensor/embedding.py), which reads a row from its part;
- a linear's [N, K] weight (the same size as an LM head; with tied embeddings the same tensor as
  the table): one linear per part, each giving its rows' outputs (its rows of the bias added), and
  `aten.cat` of them along the last dim."""

from dataclasses import replace

from pte_wgpu.kernels.tensor.embedding import EMBEDDING_PARTS, MAX_PARTS
from pte_wgpu.kernels.wgsl import PACKED, elem_bytes
from pte_wgpu.resize.values import Scalar, Tensor, ValueList

from ..errors import ModelFormatError

LOOKUPS = ("aten.embedding.default", "aten::embedding.out")  # [weight, indices, .., out]
LINEAR = "aten.linear.default"  # [x, weight, bias, out]
CAT = "aten.cat.default"  # [tensors, dim, out]


def _past_one_binding(values, vid, limit):
    """Rows a part of constant 2-D float tensor `vid` takes (0: a row is larger), or None where it
    fits one binding or is not such a tensor."""
    t = values[vid]
    if not isinstance(t, Tensor) or t.constant is None or len(t.dims) != 2 or t.dtype in PACKED:
        return None
    row = t.dims[1] * elem_bytes(t.dtype)
    return None if t.dims[0] * row <= limit else limit // row


def _row_parts(values, vid, per, keep=False):
    """Cut constant tensor `vid` into new constant tensors of `per` rows (the last fewer); returns
    their ids. Unless `keep`, nothing reads the whole tensor afterwards: it is left with no rows."""
    t = values[vid]
    parts = []
    for first in range(0, t.dims[0], per):
        end = min(first + per, t.dims[0])
        values.append(Tensor(t.dtype, (end - first, *t.dims[1:]), replace(t.constant, rows=(first, end, t.dims))))
        parts.append(len(values) - 1)
    if not keep:
        values[vid] = Tensor(t.dtype, (0, *t.dims[1:]))
    return parts


def split_constants(graph, limit):
    """Rewrite, in place, every constant float table or weight of `graph` past `limit` bytes that
    is read only as lookup tables and linear weights (a tied embedding and LM head are one
    tensor): cut once into parts of whole rows of at most `limit` bytes, each lookup becomes
    pte_wgpu.embedding_parts over them, each linear one linear a part (its bias cut alike) and
    aten.cat of their outputs along the last dim. A tensor read otherwise is left whole (its
    binding then fails, naming it)."""
    values, readers = graph.values, {}
    for k, (_, args) in enumerate(graph.calls):
        for a in set(args):
            readers.setdefault(a, []).append(k)
    replaced = {}  # call index -> the calls in its place
    for vid, ks in readers.items():
        per = _past_one_binding(values, vid, limit)
        uses = [_use(graph.calls[k], vid) for k in ks]
        if per is None or None in uses:
            continue
        t = values[vid]
        if not per or ("lookup" in uses and -(-t.dims[0] // per) > MAX_PARTS):
            raise ModelFormatError(
                f"constant {vid} {t.dtype}{list(t.dims)} does not fit {MAX_PARTS if 'lookup' in uses else 'any number of'} "
                f"parts of whole rows of at most {limit} bytes"
            )
        parts = _row_parts(values, vid, per)
        for k, use in zip(ks, uses):
            name, args = graph.calls[k]
            if use == "lookup":
                values.append(Scalar(per))
                replaced[k] = [(EMBEDDING_PARTS, (args[1], len(values) - 1, *parts, args[-1]))]
            else:
                replaced[k] = _linear_parts(values, args, parts, per)
    graph.calls[:] = [c for k, call in enumerate(graph.calls) for c in replaced.get(k, [call])]


def _use(call, vid):
    """How `call` reads `vid`: "lookup" (its table), "linear" (its weight, with no bias or a
    constant one), or None (otherwise, or also otherwise)."""
    name, args = call
    if name in LOOKUPS and args[0] == vid and vid not in args[1:]:
        return "lookup"
    if name == LINEAR and args[1] == vid and vid not in (args[0], *args[2:]):
        return "linear"
    return None


def _linear_parts(values, args, parts, per):
    """The calls of linear `args` [x, weight, bias, out] over the weight's `parts` of `per` rows:
    one linear a part, with its rows of the bias, then aten.cat of their outputs."""
    x, _, bias, out = args
    b = values[bias]
    if isinstance(b, Tensor) and b.constant is None:
        raise ModelFormatError(f"a linear whose weight is cut into parts of rows has a bias {bias} that is not a constant")
    biases = _row_parts(values, bias, per, keep=True) if isinstance(b, Tensor) else [bias] * len(parts)
    calls, outs = [], []
    for part, part_bias in zip(parts, biases):
        values.append(Tensor(values[out].dtype, values[out].dims[:-1] + (values[part].dims[0],)))
        outs.append(len(values) - 1)
        calls.append((LINEAR, (x, part, part_bias, outs[-1])))
    values.append(ValueList(tuple(outs)))
    values.append(Scalar(-1))
    calls.append((CAT, (len(values) - 2, len(values) - 1, out)))
    return calls
