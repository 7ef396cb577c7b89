"""What the image op modules (conv, pool, norm, resample) share: reading their fixed arguments, the
WGSL that places a flat output index in an [planes, height, width] output, and the f32 load and
store of a float32 or float16 input and output."""

from pte_wgpu.resize.values import ValueList

from .wgsl import is_float, wgsl_type

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


def float_types(b, *vids):
    """The storage types (f32 or f16) of the float tensors `vids`; NotImplementedError for another dtype."""
    dtypes = [b.graph.values[v].dtype for v in vids]
    if not all(is_float(t) for t in dtypes):
        raise NotImplementedError(f"{b.name}: {', '.join(dtypes)} tensors, expected float ones")
    return [wgsl_type(t) for t in dtypes]


def load_store(to):
    """WGSL `load(k)`, element k of the input `x` as f32, and `store(k, v)`, f32 v into the output
    `out` of storage type `to`: the kernel computes in f32 whether a side is stored as f32 or f16."""
    return f"""
fn load(k: u32) -> f32 {{ return f32(x[k]); }}
fn store(k: u32, v: f32) {{ out[k] = {to}(v); }}
"""
