"""p-norm distances between rows: `_cdist_forward` (every row of x1 against every row of x2, over
broadcast batch dims) and `_pdist_forward` (every pair of rows of one matrix, the upper triangle in
row-major order), which ExecuTorch leaves to its portable kernels.

One function sums a pair of rows, the norm fixed in the shader: p = 0 counts the unequal
coordinates (NaN if one is), 1 and 2 sum |d| and d^2, infinity takes the largest |d| (passing over a NaN, as
torch's does), any other p sums |d|^p and takes the 1/p-th power. Each pair is summed directly in f32, where torch's cdist of
more than 25 rows of p = 2 expands |x - y|^2 into products (nearer zero it is the less exact).
"""

import math
import struct

from pte_wgpu.resize.shapes import broadcast_shapes, broadcast_strides, numel_of

from ..registry import op
from ..wgsl import STRIDED, fill, flat_grid, flat_kernel, pack_u32x8

DISTANCE = """
fn distance(a: u32, b: u32) -> f32 {
    var acc = 0.0;
    for (var k = 0u; k < p.m; k = k + 1u) {
        let d = abs(f32(x1[a + k]) - f32($OTHER[b + k]));
        $ACCUM
    }
    return $RESULT;
}
"""


def _norm(b, p):
    """(the statement adding |d| to acc, the distance from acc) of the p-norm."""
    if p < 0 or math.isnan(p):
        b.fail(f"p = {p}, expected a non-negative number")
    if p == 0:
        return "acc = acc + select(select(0.0, 1.0, d != 0.0), d, is_nan(d));", "acc"  # a NaN coordinate: NaN
    if p == 1:
        return "acc = acc + d;", "acc"
    if p == 2:
        return "acc = acc + d * d;", "sqrt(acc)"
    if math.isinf(p):
        return "acc = select(acc, d, d > acc);", "acc"
    # WGSL's pow of a NaN may be a number (lavapipe's is): the NaN passes by select
    return f"acc = acc + select(pow(d, {p!r}), d, is_nan(d));", f"select(pow(acc, {1 / p!r}), acc, is_nan(acc))"


def _distance_kernel(b, fields, bindings, body, p, other):
    """The flat kernel of `body` with DISTANCE between rows of x1 and of array `other`, by the p-norm."""
    accum, result = _norm(b, float(p))
    return flat_kernel(fields, bindings, body, count="n", functions=STRIDED + fill(DISTANCE, OTHER=other, ACCUM=accum, RESULT=result))


CDIST_FIELDS = "n: u32, m: u32, rows1: u32, rows2: u32, rank: u32, pad0: u32, pad1: u32, pad2: u32, sizes: array<vec4<u32>, 2>, s1: array<vec4<u32>, 2>, s2: array<vec4<u32>, 2>"
CDIST_BODY = """
    let r = i % p.rows2;
    let q = (i / p.rows2) % p.rows1;
    let o = strided_offsets(i / (p.rows1 * p.rows2), p.rank, p.sizes, p.s1, p.s2, p.s1);
    out[i] = $TO(distance(o.x + q * p.m, o.y + r * p.m));
"""


@op("aten._cdist_forward.default", "aten::_cdist_forward.out", half=True)
def cdist(b):
    """[x1 (*, P, M), x2 (*, R, M), p, compute_mode, out (*, P, R)]."""
    x1, x2 = b.args[0], b.args[1]
    t1, t2, to = b.float_storage(x1, x2, b.out)
    bindings = [("x1", t1, "read"), ("x2", t2, "read"), ("out", to, "read_write")]
    shader = fill(_distance_kernel(b, CDIST_FIELDS, bindings, CDIST_BODY, b.scalar(2, 2.0), "x2"), TO=to)
    params = b.params(32 + 3 * 32)
    d = b.dispatch(shader, [x1, x2, b.out, params])

    def resize(ctx):
        d1, d2 = ctx.dims(x1), ctx.dims(x2)
        if len(d1) < 2 or len(d2) < 2 or d1[-1] != d2[-1]:
            b.fail(f"shapes {list(d1)} and {list(d2)}: expected (*, P, M) and (*, R, M), the same M")
        try:
            batch = broadcast_shapes(d1[:-2], d2[:-2])
        except ValueError as e:
            b.fail(str(e))
        rows1, rows2, m = d1[-2], d2[-2], d1[-1]
        n = numel_of(batch) * rows1 * rows2
        s1 = [s * rows1 * m for s in broadcast_strides(d1[:-2], batch)]
        s2 = [s * rows2 * m for s in broadcast_strides(d2[:-2], batch)]
        data = struct.pack("<8I", n, m, rows1, rows2, len(batch), 0, 0, 0) + pack_u32x8(batch) + pack_u32x8(s1) + pack_u32x8(s2)
        ctx.set_params(params, data)
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, (*batch, rows1, rows2))

    b.hook(resize)


PDIST_BODY = """
    var k = i;
    var a = 0u;
    while (k >= p.rows - 1u - a) {
        k = k - (p.rows - 1u - a);
        a = a + 1u;
    }
    out[i] = $TO(distance(a * p.m, (a + 1u + k) * p.m));
"""


@op("aten._pdist_forward.default", "aten::_pdist_forward.out", half=True)
def pdist(b):
    """[x (N, M), p, out (N (N - 1) / 2)]: row a against row c > a, pairs in row-major order."""
    x = b.args[0]
    tx, to = b.float_storage(x, b.out)
    bindings = [("x1", tx, "read"), ("out", to, "read_write")]
    shader = fill(_distance_kernel(b, "n: u32, m: u32, rows: u32, pad0: u32", bindings, PDIST_BODY, b.scalar(1, 2.0), "x1"), TO=to)
    params = b.params(16)
    d = b.dispatch(shader, [x, b.out, params])

    def resize(ctx):
        dims = ctx.dims(x)
        if len(dims) != 2 or dims[0] < 2:
            b.fail(f"shape {list(dims)}: expected a matrix of at least 2 rows")
        rows, m = dims
        n = rows * (rows - 1) // 2
        ctx.set_params(params, struct.pack("<4I", n, m, rows, 0))
        ctx.set_grid(d, flat_grid(n))
        ctx.set_dims(b.out, (n,))

    b.hook(resize)
