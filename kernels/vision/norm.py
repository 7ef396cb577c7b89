"""Normalization over channels: batch norm in inference (running statistics), batch norm by the
batch's own statistics (instance norm's form) and group norm.

Batch norm in inference is elementwise: channel c of `x` scaled by `weight[c] / sqrt(var[c] + eps)`
after subtracting `mean[c]`; its saved mean and invstd outputs are empty in inference and stay as
they are. Group norm and batch norm by the batch's statistics run one workgroup per row (a
(sample, group) in NCHW, contiguous; a channel across the batch): a sum for the mean, a sum of
squared deviations for the (biased) variance, then the normalized write with each channel's
affine. They also write the mean and the reciprocal std of each row. Tensors are f32
or f16, each read and written in its own storage type; the statistics are computed in f32.
"""

import struct

from pte_wgpu.resize.shapes import fold_grid, numel_of

from ..registry import op
from ..tensor.reduce import RWG, mean_and_squares
from ..wgsl import FLAT_INDEX, SPREAD_MAIN, fill, spread_grid

BATCH_NORM = """
struct P { numel: u32, c: u32, inner: u32, eps: f32 }
@group(0) @binding(0) var<storage, read> x: array<$XT>;
@group(0) @binding(1) var<storage, read> mean: array<$MT>;
@group(0) @binding(2) var<storage, read> var_: array<$VT>;
$AFFINE_DECLS
@group(0) @binding($OUT_BINDING) var<storage, read_write> out: array<$OT>;
@group(0) @binding($P_BINDING) var<uniform> p: P;
$FLAT_INDEX
$MAIN
fn element(i: u32) {
    if (i >= p.numel) { return; }
    let c = (i / p.inner) % p.c;
    out[i] = $OT((f32(x[i]) - f32(mean[c])) * inverseSqrt(f32(var_[c]) + p.eps)$AFFINE);
}
"""


def _affine(b, first_binding, weight_arg, bias_arg):
    """(binding declarations, expression suffix, value ids) of an optional weight and bias."""
    decls, expr, vids = [], "", []
    for arg, name, suffix in ((weight_arg, "weight", " * f32(weight[c])"), (bias_arg, "bias", " + f32(bias[c])")):
        if not b.is_none(arg):
            t = b.float_storage(b.args[arg])[0]
            decls.append(f"@group(0) @binding({first_binding + len(vids)}) var<storage, read> {name}: array<{t}>;")
            expr += suffix
            vids.append(b.args[arg])
    return "\n".join(decls), expr, vids


def _channels(b, ctx, x, per_channel, what):
    shape = ctx.dims(x)
    if len(shape) < 2:
        b.fail(f"input of shape {shape}: expected at least 2 dims")
    for v in per_channel:
        if numel_of(ctx.dims(v)) != shape[1]:
            b.fail(f"{what} of shape {ctx.dims(v)} for {shape[1]} channels")
    return shape


# The portable kernel's out variant (a batch norm the partitioner leaves out, as at batch 8) has
# the same arguments, its three outputs given before their list, which it returns.
@op("aten._native_batch_norm_legit_no_training.default", "aten::_native_batch_norm_legit_no_training.out", half=True)
def batch_norm(b):
    x = b.args[0]
    out = b.outputs(3)[0]
    decls, expr, affine = _affine(b, 3, 1, 2)
    mean, var = b.args[3], b.args[4]
    eps = float(b.scalar(6, 1e-5))
    types = dict(zip(("XT", "MT", "VT", "OT"), b.float_storage(x, mean, var, out)))
    shader = fill(
        BATCH_NORM,
        AFFINE_DECLS=decls,
        AFFINE=expr,
        OUT_BINDING=3 + len(affine),
        P_BINDING=4 + len(affine),
        FLAT_INDEX=FLAT_INDEX,
        MAIN=SPREAD_MAIN,
        **types,
    )
    params = b.params(16)
    d = b.dispatch(shader, [x, mean, var, *affine, out, params])

    def resize(ctx):
        shape = _channels(b, ctx, x, [mean, var, *affine], "statistics")
        numel = numel_of(shape)
        ctx.set_params(params, struct.pack("<3If", numel, shape[1], numel_of(shape[2:]), eps))
        ctx.set_grid(d, spread_grid(numel))
        ctx.set_dims(out, shape)

    b.hook(resize)


# One workgroup a row: the mean and the sum of squared deviations (reduce.py's template, layer norm's
# too), then the normalized write; x[at(row, k)] is element k of the row.
GROUP_NORM = """
struct P { rows: u32, rlen: u32, inner: u32, cpg: u32, groups: u32, eps: f32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<storage, read> x: array<$XT>;
$AFFINE_DECLS
@group(0) @binding($OUT_BINDING) var<storage, read_write> out: array<$OT>;
@group(0) @binding($MEAN_BINDING) var<storage, read_write> mean_out: array<$MT>;
@group(0) @binding($RSTD_BINDING) var<storage, read_write> rstd_out: array<$RT>;
@group(0) @binding($P_BINDING) var<uniform> p: P;
var<workgroup> sm: array<f32, $WG>;

fn at(row: u32, k: u32) -> u32 { return $AT; }

@compute @workgroup_size($WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) { return; }
$MEAN_AND_SQUARES
    let rstd = inverseSqrt(sm[0] / f32(p.rlen) + p.eps);
    for (var k = lid; k < p.rlen; k = k + ${WG}u) {
        let c = $CHANNEL;
        out[at(row, k)] = $OT((f32(x[at(row, k)]) - mean) * rstd$AFFINE);
    }
    if (lid == 0u) { mean_out[row] = $MT(mean); rstd_out[row] = $RT(rstd); }
}
"""


# A row's elements and each one's channel: group norm's rows are contiguous (a sample's group of
# channels); batch norm's row c holds channel c of every sample, `inner` elements a sample.
GROUP_ROWS = {"AT": "row * p.rlen + k", "CHANNEL": "(row % p.groups) * p.cpg + k / p.inner"}
CHANNEL_ROWS = {"AT": "(k / p.inner * p.groups + row) * p.inner + k % p.inner", "CHANNEL": "row"}


def _normalize_rows(b, rows, eps, layout):
    """Record the normalization of argument 0 by its rows' mean and (biased) variance, with the
    affine of arguments 1 and 2, into the three outputs (the result, each row's mean and 1 / std);
    `layout(shape)`: (rows, elements a row, inner, channels a group, groups (batch norm: channels),
    the statistics' shape)."""
    x = b.args[0]
    out, mean_out, rstd_out = b.outputs(3)
    decls, expr, affine = _affine(b, 1, 1, 2)
    n = len(affine)
    types = dict(zip(("XT", "OT", "MT", "RT"), b.float_storage(x, out, mean_out, rstd_out)))
    shader = fill(GROUP_NORM, AFFINE_DECLS=decls, AFFINE=expr, OUT_BINDING=1 + n, MEAN_BINDING=2 + n, RSTD_BINDING=3 + n, P_BINDING=4 + n,
                  WG=RWG, MEAN_AND_SQUARES=mean_and_squares("at(row, k)"), **rows, **types)
    params = b.params(32)
    d = b.dispatch(shader, [x, *affine, out, mean_out, rstd_out, params])

    def resize(ctx):
        shape = _channels(b, ctx, x, affine, "weight or bias")
        count, rlen, inner, cpg, groups, stats = layout(shape)
        ctx.set_params(params, struct.pack("<5If2I", count, rlen, inner, cpg, groups, eps, 0, 0))
        ctx.set_grid(d, fold_grid(count))
        ctx.set_dims(out, shape)
        ctx.set_dims(mean_out, stats)
        ctx.set_dims(rstd_out, stats)

    b.hook(resize)


@op("aten.native_group_norm.default", "aten::native_group_norm.out", half=True)
def group_norm(b):
    groups = int(b.scalar(6))

    def layout(shape):
        if groups < 1 or shape[1] % groups:
            b.fail(f"{shape[1]} channels in {groups} groups")
        inner, cpg = numel_of(shape[2:]), shape[1] // groups
        return shape[0] * groups, cpg * inner, inner, cpg, groups, (shape[0], groups)

    _normalize_rows(b, GROUP_ROWS, float(b.scalar(7, 1e-5)), layout)


@op("aten._native_batch_norm_legit.no_stats", "aten::_native_batch_norm_legit.no_stats_out", half=True)
def batch_norm_of_the_batch(b):
    """[input, weight or None, bias or None, training, momentum, eps, (out, mean [C], invstd [C])]:
    each channel normalized by its statistics over the batch and the spatial dims (what a batch norm
    in training mode and instance norm, a batch norm of [1, N * C, ...], export to)."""

    def layout(shape):
        inner = numel_of(shape[2:])
        return shape[1], shape[0] * inner, inner, 1, shape[1], (shape[1],)

    _normalize_rows(b, CHANNEL_ROWS, float(b.scalar(5, 1e-5)), layout)
