"""What the image op modules (conv, pool, norm, resample) share: reading their fixed arguments, and
the WGSL that places a flat output index in an [planes, height, width] output."""

from resize.values import ValueList

# The start of `element(i)` in a kernel over an output of planes of p.oh x p.ow read from input
# planes of p.ih x p.iw: output column ox, row oy, plane index nc, the input plane's first element.
OUTPUT_PIXEL = """
    if (i >= p.numel) { return; }
    let ox = i % p.ow;
    let oy = (i / p.ow) % p.oh;
    let nc = i / (p.ow * p.oh);
    let plane = nc * p.ih * p.iw;
"""


def static_ints(b, i):
    """An int list argument fixed in the file: an IntList in a delegate, a list of Int values
    outside one."""
    v = b.value(i)
    if isinstance(v, ValueList):
        return tuple(int(b.graph.values[k].value) for k in v.items)
    return tuple(v.items)


def op_outputs(b, n):
    """The `n` outputs of a multi-output op, a ValueList."""
    v = b.graph.values[b.out]
    if not isinstance(v, ValueList) or len(v.items) != n:
        raise ValueError(f"{b.name}: expected a list of {n} outputs")
    return list(v.items)
