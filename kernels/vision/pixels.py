"""WGSL the image kernels (conv, pool, norm, resample) share: the output pixel of a flat index in an
[planes, height, width] output, and the f32 load and store of a float32 or float16 input and
output."""

from ..wgsl import fill

# The start of `element(i)` in a kernel over an output of planes of p.oh x p.ow read from input
# planes of p.ih x p.iw: output column ox, row oy, plane index nc, the input plane's first element.
OUTPUT_PIXEL = """
    if (i >= p.numel) { return; }
    let ox = i % p.ow;
    let oy = (i / p.ow) % p.oh;
    let nc = i / (p.ow * p.oh);
    let plane = nc * p.ih * p.iw;
"""


def load_store(to):
    """WGSL `load(k)`, element k of the input `x` as f32, and `store(k, v)`, f32 v into the output
    `out` of storage type `to`: the kernel computes in f32 whether a side is stored as f32 or f16."""
    return fill(
        """
fn load(k: u32) -> f32 { return f32(x[k]); }
fn store(k: u32, v: f32) { out[k] = $TO(v); }
""",
        TO=to,
    )
