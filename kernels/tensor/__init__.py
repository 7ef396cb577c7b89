"""Tensor ops: elementwise, reductions, scans, shape and memory ops, indexing, creation, SymInt
ops, distances and embeddings. May import the kernels' top modules and `matmul` (a fused norm's rows)."""

from . import creation, distance, elementwise, embedding, indexing, rearrange, reduce, scan, shape, symint  # noqa: F401
