"""Pure shape arithmetic used by every op; the one place these rules are written."""

import math

MAX_WORKGROUPS = 65535


def numel_of(dims):
    """Number of elements of a shape (1 for a 0-d tensor)."""
    return math.prod(dims)


def normalize_dim(dim, rank):
    """A possibly negative dim index as 0..rank-1; IndexError names the bad index."""
    d = dim + rank if dim < 0 else dim
    if not 0 <= d < max(rank, 1):
        raise IndexError(f"dim {dim} is out of range for rank {rank}")
    return d


def contiguous_strides(dims):
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def broadcast_shapes(*shapes):
    """NumPy broadcasting of shapes; ValueError when they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        size = 1
        for s in shapes:
            k = i - (rank - len(s))
            if k < 0 or s[k] == 1:
                continue
            if size not in (1, s[k]):
                raise ValueError(f"shapes {shapes} do not broadcast")
            size = s[k]
        out.append(size)
    return tuple(out)


def broadcast_strides(shape, out_shape):
    """Strides of `shape` right-aligned into `out_shape`, with 0 where it broadcasts."""
    strides = contiguous_strides(shape)
    pad = len(out_shape) - len(shape)
    return tuple(0 if k < 0 or shape[k] == 1 else strides[k] for k in (i - pad for i in range(len(out_shape))))


def fold_grid(workgroups, limit=MAX_WORKGROUPS):
    """A flat workgroup count as an (x, y, 1) grid with x, y <= limit; kernels rebuild the flat
    index as gid.x + gid.y * num_workgroups.x * workgroup_size and bounds-check it."""
    if workgroups <= 0:
        return (0, 0, 0)
    if workgroups <= limit:
        return (workgroups, 1, 1)
    y = math.ceil(workgroups / limit)
    x = math.ceil(workgroups / y)
    if y > limit:
        raise ValueError(f"{workgroups} workgroups exceed a {limit}x{limit} grid")
    return (x, y, 1)
