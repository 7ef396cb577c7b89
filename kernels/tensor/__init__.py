"""Tensor ops: elementwise, reductions, scans, shape and memory ops, indexing, creation, SymInt
ops, distances and embeddings. May import the kernels' top modules, `matmul` (a fused norm's
rows) and `attention` (a RoPE after a norm: its rotation and the KV caches' addressing)."""

from . import creation, distance, elementwise, embedding, indexing, rearrange, reduce, scan, shape, symint  # noqa: F401
