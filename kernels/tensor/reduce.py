"""Row reductions: sum, mean, amax, amin, argmax, argmin, softmax, log_softmax, layer norm, RMS norm.

Every op views its input as rows: the kept dims index a row, the reduced dims run along it. After
dropping size-1 dims and merging neighbours of the same kind, a shape of rank <= 8 has at most 4
kept groups and 4 reduced groups; the kernel rebuilds a row's base offset from the kept groups
(sizes and strides) and an element's offset along the row from the reduced groups. The output
row index is the flat index over the kept dims, in order, so it is also the output offset whether
keepdim is set or not. One workgroup of `RWG` invocations handles one row: each invocation folds
a strided slice of the row, then a shared-memory tree combines the partials (no subgroups).
Rows are folded over the grid's x and y (resize.shapes.fold_grid).

Softmax and the norms make several passes over their row (max, sum, write; mean, variance,
write) and write elements back at the offsets they read, so any softmax dim works.

Tensors are read and written in their own storage types (f32, f16, integers); every sum, max,
mean and variance is computed in f32, conversions only at loads and stores.

Kept as one module past 400 lines: every reduction shares the row decomposition, its uniform and one hook.
"""

import math
import struct

from pte_wgpu.resize.shapes import contiguous_strides, fold_grid, normalize_dim, numel_of
from pte_wgpu.resize.values import Scalar

from ..attention.kv_cache import cache_at, table_entries
from ..attention.rope import hf_rotation
from ..matmul.routes import fused_norm_rows
from ..registry import op
from ..wgsl import fill, maximum, minimum, rounded

RWG = 128  # invocations per row
NEG_INF = -math.inf
PARAMS_SIZE = 96  # P below: 4 u32, 4 vec4<u32>, eps, neg_inf, 2 pad

HEADER = """
struct P { nk: u32, nr: u32, rows: u32, rlen: u32,
           ks: vec4<u32>, kst: vec4<u32>, rs: vec4<u32>, rst: vec4<u32>,
           eps: f32, neg_inf: f32, pad0: u32, pad1: u32 }
$DECLS
@group(0) @binding($P_BINDING) var<uniform> p: P;

fn group_offset(i: u32, n: u32, sizes: vec4<u32>, strides: vec4<u32>) -> u32 {
    var rem = i;
    var off = 0u;
    for (var g = i32(n) - 1; g >= 0; g = g - 1) {
        let s = sizes[g];
        off = off + (rem % s) * strides[g];
        rem = rem / s;
    }
    return off;
}
fn row_base(row: u32) -> u32 { return group_offset(row, p.nk, p.ks, p.kst); }
fn elem(k: u32) -> u32 { return group_offset(k, p.nr, p.rs, p.rst); }

${SHARED}var<workgroup> sm: array<f32, $WG>;
"""

# Tree-combines sm[0..WG) in place with $COMBINE (of a and b); every invocation reaches it (uniform).
TREE = """
    for (var s = ${HALF}u; s > 0u; s = s >> 1u) {
        if (lid < s) { let a = sm[lid]; let b = sm[lid + s]; sm[lid] = $COMBINE; }
        workgroupBarrier();
    }
"""

MAIN = """
@compute @workgroup_size($WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) { return; }
    let base = row_base(row);
$BODY
}
"""


def _tree(combine):
    return fill(TREE, HALF=RWG // 2, COMBINE=combine)


def _shader(decls, body, shared=""):
    """`shared`: module-scope declarations besides `sm` (workgroup variables, helper functions)."""
    lines = [f"@group(0) @binding({k}) var<storage, {mode}> {name}: array<{t}>;" for k, (mode, name, t) in enumerate(decls)]
    head = fill(HEADER, DECLS="\n".join(lines), P_BINDING=len(decls), WG=RWG, SHARED=shared)
    return head + fill(MAIN, WG=RWG, BODY=body)


# ---------------------------------------------------------------------------------------------
# shape arithmetic


def _groups(shape, reduced):
    """(kept groups, reduced groups) of `shape` as [(size, stride)], outer first; size-1 dims dropped
    and neighbours of the same kind merged."""
    strides = contiguous_strides(shape)
    groups = []  # [kind, size, stride]
    for d, (size, stride) in enumerate(zip(shape, strides)):
        if size == 1:
            continue
        kind = d in reduced
        if groups and groups[-1][0] == kind:
            groups[-1][1] *= size
            groups[-1][2] = stride
        else:
            groups.append([kind, size, stride])
    kept = [(s, st) for k, s, st in groups if not k]
    red = [(s, st) for k, s, st in groups if k]
    return kept, red


def _vec4(items):
    items = list(items)
    return struct.pack("<4I", *(items + [0] * (4 - len(items))))


def _pack(shape, reduced, eps=0.0):
    """Parameter bytes of `shape` reduced over the dim set `reduced`, plus (rows, row length)."""
    if any(s == 0 for s in shape):
        rows = numel_of([s for d, s in enumerate(shape) if d not in reduced])
        rlen = numel_of([s for d, s in enumerate(shape) if d in reduced])
        kept, red = [], []
    else:
        kept, red = _groups(shape, reduced)
        rows, rlen = numel_of([s for s, _ in kept]), numel_of([s for s, _ in red])
    if len(kept) > 4 or len(red) > 4:
        raise ValueError(f"rank {len(shape)} exceeds 8")
    data = struct.pack("<4I", len(kept), len(red), rows, rlen)
    data += _vec4(s for s, _ in kept) + _vec4(st for _, st in kept)
    data += _vec4(s for s, _ in red) + _vec4(st for _, st in red)
    data += struct.pack("<ff2I", eps, NEG_INF, 0, 0)
    return data, rows, rlen


def _dims_arg(b, ctx, i, rank):
    """The reduced dim set of argument `i` (an int, a list, or None/empty for all dims)."""
    if i is None:
        dims = ()
    else:
        v = b.graph.values[b.args[i]]
        if isinstance(v, Scalar):
            dims = () if v.value is None else (v.value,)
        else:
            dims = ctx.int_list(b.args[i])
    if not dims:
        return set(range(rank))
    try:
        return {normalize_dim(int(d), rank) for d in dims}
    except IndexError as e:
        b.fail(f"{e}")


def _reduced_shape(shape, reduced, keepdim):
    if keepdim:
        return tuple(1 if d in reduced else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in reduced)


# ---------------------------------------------------------------------------------------------
# sum, mean, amax, amin, argmax, argmin

# kind -> (init, combine of a and b, final of the combined value v)
REDUCERS = {
    "sum": ("0.0", "a + b", "v"),
    "mean": ("0.0", "a + b", "v / f32(p.rlen)"),
    "amax": ("p.neg_inf", maximum("a", "b"), "v"),
    "amin": ("-p.neg_inf", minimum("a", "b"), "v"),
    "prod": ("1.0", "a * b", "v"),
}

REDUCE_BODY = """
    var acc = $INIT;
    for (var k = lid; k < p.rlen; k = k + ${WG}u) {
        let a = acc;
        let b = f32(x[base + elem(k)]);
        acc = $COMBINE;
    }
    sm[lid] = acc;
    workgroupBarrier();
$TREE
    if (lid == 0u) {
        let v = sm[0];
        out[row] = $TO($FINAL);
    }
"""

# Whether v at index k comes before bv at bk in torch's order: by $CMP, ties to the lower index; a
# NaN before every number ($NAN_FIRST true: argmax, argmin, topk of the largest) or after (topk of
# the smallest), NaNs among themselves by index.
RANKS_ABOVE = """
fn ranks_above(v: f32, k: u32, bv: f32, bk: u32) -> bool {
    let v_nan = is_nan(v);
    let b_nan = is_nan(bv);
    if (v_nan || b_nan) { return select(b_nan && (!v_nan || k < bk), v_nan && (!b_nan || k < bk), $NAN_FIRST); }
    return v $CMP bv || (v == bv && k < bk);
}
"""


def _ranks_above(cmp, nan_first=True):
    return fill(RANKS_ABOVE, CMP=cmp, NAN_FIRST=str(nan_first).lower())


# argmax/argmin carry (value, index) pairs, the first in torch's order (RANKS_ABOVE) winning.
ARG_BODY = """
    var bv = $INIT;
    var bi = 0xffffffffu;
    for (var k = lid; k < p.rlen; k = k + ${WG}u) {
        let v = f32(x[base + elem(k)]);
        if (ranks_above(v, k, bv, bi)) { bv = v; bi = k; }
    }
    sm[lid] = bv;
    si[lid] = bi;
    workgroupBarrier();
    for (var s = ${HALF}u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let v = sm[lid + s];
            let i = si[lid + s];
            if (ranks_above(v, i, sm[lid], si[lid])) { sm[lid] = v; si[lid] = i; }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[row] = $TO(select(si[0], 0u, si[0] == 0xffffffffu));
    }
"""


# A row's mean, then the sum of its squared deviations from it in sm[0]; x[$AT] is element k.
MEAN_AND_SQUARES = """
    var t = 0.0;
    for (var k = lid; k < p.rlen; k = k + ${WG}u) { t = t + f32(x[$AT]); }
    sm[lid] = t;
    workgroupBarrier();
$TREE
    let mean = sm[0] / f32(p.rlen);
    workgroupBarrier();
    var q = 0.0;
    for (var k = lid; k < p.rlen; k = k + ${WG}u) { let c = f32(x[$AT]) - mean; q = q + c * c; }
    sm[lid] = q;
    workgroupBarrier();
$TREE
"""


def mean_and_squares(at):
    return fill(MEAN_AND_SQUARES, WG=RWG, AT=at, TREE=_tree("a + b"))


# the variance: the squared deviations over (length - correction), the correction in P's eps
VAR_BODY = mean_and_squares("base + elem(k)") + """
    if (lid == 0u) {
        out[row] = $TO(sm[0] / (f32(p.rlen) - p.eps));
    }
"""


def add_reduce(b, kind, dims_arg, keepdim):
    """Record a reduction of argument 0 over the dims of argument `dims_arg` (None: all dims)."""
    b.hook(_reduction(b, kind, dims_arg, keepdim, b.out))


def _reduction(b, kind, dims_arg, keepdim, out, correction=0.0):
    """add_reduce's dispatch into `out` ("var": with `correction`); returns its resize hook."""
    x = b.args[0]
    ti, to = b.storage(x, packed=False), b.storage(out, packed=False)
    if kind in REDUCERS:
        init, combine, final = REDUCERS[kind]
        body = fill(REDUCE_BODY, INIT=init, COMBINE=combine, FINAL=final, WG=RWG, TO=to, TREE=_tree(combine))
    elif kind == "var":
        body = fill(VAR_BODY, TO=to)
    else:
        cmp = ">" if kind == "argmax" else "<"
        init = "p.neg_inf" if kind == "argmax" else "-p.neg_inf"
        body = fill(ARG_BODY, INIT=init, WG=RWG, HALF=RWG // 2, TO=to)
    shared = "" if not kind.startswith("arg") else f"var<workgroup> si: array<u32, {RWG}>;\n" + _ranks_above(cmp)
    shader = _shader([("read", "x", ti), ("read_write", "out", to)], body, shared)
    params = b.params(PARAMS_SIZE)
    d = b.dispatch(shader, [x, out, params])

    def resize(ctx):
        shape = ctx.dims(x)
        reduced = _dims_arg(b, ctx, dims_arg, len(shape))
        data, rows, rlen = _pack(shape, reduced, correction)
        if rlen == 0 and kind not in ("sum", "mean") and rows > 0:
            b.fail(f"cannot reduce an empty dim of shape {shape}")
        ctx.set_params(params, data)
        ctx.set_grid(d, fold_grid(rows))
        ctx.set_dims(out, _reduced_shape(shape, reduced, keepdim))

    return resize


def _reduce_op(kind, has_dims=True):
    def build(b):
        if has_dims:
            add_reduce(b, kind, 1, b.flag(2))
        else:  # sum.out / mean.dtype_out: [x, dtype, out], every dim
            add_reduce(b, kind, None, False)

    return build


op("aten.sum.dim_IntList", "aten::sum.IntList_out", half=True)(_reduce_op("sum"))
op("aten::sum.out", half=True)(_reduce_op("sum", has_dims=False))
op("aten.mean.dim", "aten::mean.out", half=True)(_reduce_op("mean"))
op("aten::mean.dtype_out", half=True)(_reduce_op("mean", has_dims=False))
op("aten.prod.dim_int", "aten::prod.int_out", half=True)(_reduce_op("prod"))
op("aten::prod.out", half=True)(_reduce_op("prod", has_dims=False))
op("aten.amax.default", "aten::amax.out", half=True)(_reduce_op("amax"))
op("aten.amin.default", "aten::amin.out", half=True)(_reduce_op("amin"))
op("aten.max.default", "aten::max.unary_out", half=True)(_reduce_op("amax", has_dims=False))  # x.max(): every dim
op("aten.min.default", "aten::min.unary_out", half=True)(_reduce_op("amin", has_dims=False))
op("aten.argmax.default", "aten::argmax.out", half=True)(_reduce_op("argmax"))
op("aten.argmin.default", "aten::argmin.out", half=True)(_reduce_op("argmin"))


def _extreme_and_index(kind):
    """max.dim / min.dim: [x, dim, keepdim, (values, indices)], the amax and argmax (amin, argmin) of
    one dim."""

    def build(b):
        values, indices = b.outputs(2)
        b.hook(_reduction(b, f"a{kind}", 1, b.flag(2), values), _reduction(b, f"arg{kind}", 1, b.flag(2), indices))

    return build


@op("aten.var_mean.correction", "aten::var_mean.correction_out", half=True)
def var_mean(b):
    """[x, dims, correction, keepdim, (var, mean)]; no correction given: 1."""
    variance, mean = b.outputs(2)
    keepdim, correction = b.flag(3), float(b.scalar(2, 1))
    b.hook(_reduction(b, "var", 1, keepdim, variance, correction), _reduction(b, "mean", 1, keepdim, mean))


op("aten.max.dim", "aten::max.dim_max", half=True)(_extreme_and_index("max"))
op("aten.min.dim", "aten::min.dim_min", half=True)(_extreme_and_index("min"))


# topk: k rounds over the row, each taking the first element in torch's order (RANKS_ABOVE;
# largest: NaN first, then descending; smallest: ascending, NaN last) of those after the last one
# taken, so nothing is marked taken. P's pad0 holds k, pad1 the elements after the dim (a row's
# outputs are k of them apart).
TOPK_BODY = """
    let inner = p.pad1;
    let out_base = row / inner * p.pad0 * inner + row % inner;
    var prev_v = 0.0;
    var prev_k = 0xffffffffu;
    for (var j = 0u; j < p.pad0; j = j + 1u) {
        var bv = 0.0;
        var bk = 0xffffffffu;
        for (var k = lid; k < p.rlen; k = k + ${WG}u) {
            let v = f32(x[base + elem(k)]);
            let eligible = j == 0u || ranks_above(prev_v, prev_k, v, k);
            if (eligible && (bk == 0xffffffffu || ranks_above(v, k, bv, bk))) { bv = v; bk = k; }
        }
        sm[lid] = bv;
        si[lid] = bk;
        workgroupBarrier();
        for (var s = ${HALF}u; s > 0u; s = s >> 1u) {
            if (lid < s && si[lid + s] != 0xffffffffu && (si[lid] == 0xffffffffu || ranks_above(sm[lid + s], si[lid + s], sm[lid], si[lid]))) {
                sm[lid] = sm[lid + s];
                si[lid] = si[lid + s];
            }
            workgroupBarrier();
        }
        prev_v = sm[0];
        prev_k = si[0];
        if (lid == 0u) {
            out[out_base + j * inner] = $TO(prev_v);
            indices[out_base + j * inner] = i32(prev_k);
        }
        workgroupBarrier();
    }
"""


@op("aten.topk.default", "aten::topk.values", half=True)
def topk(b):
    """[x, k, dim, largest, sorted, (values, indices)]: the k largest (smallest) along dim, in
    order (sorted or not)."""
    x = b.args[0]
    values, indices = b.outputs(2)
    k, largest = int(b.scalar(1)), bool(b.scalar(3, True))
    ti, to = b.storage(x, packed=False), b.storage(values, packed=False)
    order = _ranks_above(">" if largest else "<", nan_first=largest)
    body = fill(TOPK_BODY, WG=RWG, HALF=RWG // 2, TO=to)
    decls = [("read", "x", ti), ("read_write", "out", to), ("read_write", "indices", b.storage(indices, packed=False))]
    shader = _shader(decls, body, f"var<workgroup> si: array<u32, {RWG}>;\n" + order)
    params = b.params(PARAMS_SIZE)
    d = b.dispatch(shader, [x, values, indices, params])

    def resize(ctx):
        shape = ctx.dims(x)
        dim = normalize_dim(int(b.scalar(2, -1)), len(shape)) if shape else 0
        if not 0 <= k <= (shape[dim] if shape else 1):
            b.fail(f"k = {k} is out of range for dim {dim} of shape {shape}")
        data, rows, _ = _pack(shape, {dim})
        inner = numel_of(shape[dim + 1 :])
        ctx.set_params(params, data[:-8] + struct.pack("<2I", k, max(inner, 1)))
        ctx.set_grid(d, fold_grid(rows if k else 0))
        out_shape = tuple(k if i == dim else s for i, s in enumerate(shape))
        ctx.set_dims(values, out_shape)
        ctx.set_dims(indices, out_shape)

    b.hook(resize)


@op("aten.var.correction", "aten::var.correction_out", "aten::var.out", half=True)
def var(b):
    """[x, dims, correction (var.out: unbiased), keepdim, out]; no correction given: 1."""
    given = b.scalar(2, True)
    correction = float(given) if b.name != "aten::var.out" else float(bool(given))
    b.hook(_reduction(b, "var", 1, b.flag(3), b.out, correction))


# ---------------------------------------------------------------------------------------------
# softmax, log_softmax

SOFTMAX_BODY = """
    var m = p.neg_inf;
    for (var k = lid; k < p.rlen; k = k + ${WG}u) { m = max(m, f32(x[base + elem(k)])); }
    sm[lid] = m;
    workgroupBarrier();
$TREE_MAX
    let mx = sm[0];
    workgroupBarrier();
    var t = 0.0;
    for (var k = lid; k < p.rlen; k = k + ${WG}u) { t = t + exp(f32(x[base + elem(k)]) - mx); }
    sm[lid] = t;
    workgroupBarrier();
$TREE_SUM
    let total = sm[0];
    let log_total = log(total);
    for (var k = lid; k < p.rlen; k = k + ${WG}u) {
        let o = base + elem(k);
        let v = f32(x[o]) - mx;
        out[o] = $TO($WRITE);
    }
"""


# PyTorch's `_safe_softmax` (what scaled_dot_product_attention's decomposition applies), whose rows
# of -inf only are zeros, not NaN: kernels/fusion.py finds its pieces
SAFE_SOFTMAX = "pte_wgpu.safe_softmax"


@op("aten._softmax.default", "aten._log_softmax.default", "aten::_softmax.out", "aten::_log_softmax.out", SAFE_SOFTMAX, half=True)
def softmax(b):
    x, out = b.args[0], b.out
    dim = int(b.scalar(1))
    if b.name == SAFE_SOFTMAX:
        write = "select(exp(v) / total, 0.0, mx == p.neg_inf)"
    else:
        write = "v - log_total" if "log_softmax" in b.name else "exp(v) / total"
    to = b.storage(out, packed=False)
    body = fill(SOFTMAX_BODY, WG=RWG, TREE_MAX=_tree("max(a, b)"), TREE_SUM=_tree("a + b"), WRITE=write, TO=to)
    shader = _shader([("read", "x", b.storage(x, packed=False)), ("read_write", "out", to)], body)
    params = b.params(PARAMS_SIZE)
    d = b.dispatch(shader, [x, out, params])

    def resize(ctx):
        shape = ctx.dims(x)
        try:
            reduced = {normalize_dim(dim, len(shape))}
        except IndexError as e:
            b.fail(f"{e}")
        data, rows, _ = _pack(shape, reduced)
        ctx.set_params(params, data)
        ctx.set_grid(d, fold_grid(rows))
        ctx.set_dims(out, shape)

    b.hook(resize)


# ---------------------------------------------------------------------------------------------
# native_layer_norm, rms_norm: rows of the trailing `normalized` dims

LAYER_NORM_BODY = mean_and_squares("base + k") + """
    let rstd = inverseSqrt(sm[0] / f32(p.rlen) + p.eps);
    for (var k = lid; k < p.rlen; k = k + ${WG}u) {
        out[base + k] = $TO((f32(x[base + k]) - mean) * rstd$AFFINE);
    }
    if (lid == 0u) {
        mean_out[row] = $TM(mean);
        rstd_out[row] = $TR(rstd);
    }
"""


def strided(load, use, unroll=4):
    """WGSL: for K = lid, lid + RWG, .. below p.rlen, `load` then `use` (of the index `$K` and the
    names' suffix `$I`), `unroll` Ks a pass: their loads first, all of them in flight together,
    where a loop of one waits on each in turn (an RMS norm's 4,096-long row took 32 loads'
    latencies, ~15 us on an H200; a store before the next load keeps it waiting, as the bindings
    may alias), then their uses in the plain loop's order. H100, greedy bursts, rounds old / new /
    new / old in one call: Llama-3.2-1B fp16 1 / 16 streams 582-584 / 3,198-3,209 -> 644-648 /
    3,289-3,300 tokens/s, 4w at 64 streams 8,463 -> 8,598-8,646
    (results/h100/kernel_choices/rms_norm_loads_in_flight/)."""
    def at(i, k):
        return fill(f"{load}\0{use}", K=k, I=i).split("\0")
    parts = [at(i, f"k + {i * RWG}u") for i in range(unroll)]
    more = " ".join(p[0] for p in parts) + " " + " ".join(p[1] for p in parts)
    return (f"    {{ var k = lid;\n      for (; k + {(unroll - 1) * RWG}u < p.rlen; k = k + {unroll * RWG}u) {{ {more} }}\n"
            f"      for (; k < p.rlen; k = k + {RWG}u) {{ {' '.join(at(0, 'k'))} }} }}\n")


def rms_rstd(s=""):
    """WGSL: `rstd`, the RMS norm's factor of the row of x{s} from base{s}: each invocation's
    squares, then a tree (`s`: the suffix of the bindings' names and of `base`)."""
    return ("    var q = 0.0;\n" + strided(f"let c$I = f32(x{s}[base{s} + $K]);", "q = q + c$I * c$I;")
            + "    sm[lid] = q;\n    workgroupBarrier();\n" + _tree("a + b")
            + "    let rstd = inverseSqrt(sm[0] / f32(p.rlen) + p.eps);\n")


def rms_norm_body(to, s=""):
    """The rows' RMS norm into `out` of storage type `to`: rms_rstd, then x * rstd * w (`s`: the
    suffix of the bindings' names and of `base`, the row's first element)."""
    return rms_rstd(s) + strided(f"let c$I = f32(x{s}[base{s} + $K]); let w$I = f32(w{s}[$K]);", f"out{s}[base{s} + $K] = {to}(c$I * rstd * w$I);")


def _rms_decls(b, x, weight, out, s=""):
    """The bindings rms_norm_body reads and writes (`s`: their names' suffix)."""
    return [("read", f"x{s}", b.storage(x, packed=False)), ("read", f"w{s}", b.storage(weight, packed=False)), ("read_write", f"out{s}", b.storage(out, packed=False))]


def _norm_params(b, ctx, x, normalized, eps, more_rows=0):
    """Parameter bytes and row count of a norm over the trailing dims `normalized` of `x`; with
    `more_rows`, the params cover that many rows more (a second tensor's, rms_norm_pair), P's pad0
    the rows of `x`."""
    shape = ctx.dims(x)
    n = len(normalized)
    if n > len(shape) or tuple(shape[len(shape) - n :]) != tuple(normalized):
        b.fail(f"input of shape {shape} does not end in the normalized shape {tuple(normalized)}")
    rows, rlen = numel_of(shape[: len(shape) - n]), numel_of(normalized)
    total = rows + more_rows
    data = struct.pack("<4I", 1, 1, total, rlen)
    data += _vec4([total]) + _vec4([rlen]) + _vec4([rlen]) + _vec4([1])
    data += struct.pack("<ff2I", eps, NEG_INF, rows, 0)
    return shape, data, rows


def _check_param(b, ctx, vid, normalized, what):
    if vid is not None and numel_of(ctx.dims(vid)) != numel_of(normalized):
        b.fail(f"{what} of shape {ctx.dims(vid)} does not match the normalized shape {tuple(normalized)}")


@op("aten.native_layer_norm.default", "aten::native_layer_norm.out", half=True)
def native_layer_norm(b):
    x = b.args[0]
    weight = None if b.is_none(2) else b.args[2]
    bias = None if b.is_none(3) else b.args[3]
    eps = float(b.scalar(4, 1e-5))
    outs = b.graph.values[b.out].items
    if len(outs) != 3:
        b.fail(f"expected 3 outputs, found {len(outs)}")
    out, mean_out, rstd_out = outs
    affine = ""
    decls, bindings = [("read", "x", b.storage(x, packed=False))], [x]
    if weight is not None:
        affine += " * f32(w[k])"
        decls.append(("read", "w", b.storage(weight, packed=False)))
        bindings.append(weight)
    if bias is not None:
        affine += " + f32(bias[k])"
        decls.append(("read", "bias", b.storage(bias, packed=False)))
        bindings.append(bias)
    types = [b.storage(v, packed=False) for v in (out, mean_out, rstd_out)]
    decls += [("read_write", name, t) for name, t in zip(("out", "mean_out", "rstd_out"), types)]
    bindings += [out, mean_out, rstd_out]
    body = fill(LAYER_NORM_BODY, WG=RWG, AFFINE=affine, TO=types[0], TM=types[1], TR=types[2])
    params = b.params(PARAMS_SIZE)
    d = b.dispatch(_shader(decls, body), bindings + [params])

    def resize(ctx):
        normalized = ctx.int_list(b.args[1])
        shape, data, rows = _norm_params(b, ctx, x, normalized, eps)
        _check_param(b, ctx, weight, normalized, "weight")
        _check_param(b, ctx, bias, normalized, "bias")
        ctx.set_params(params, data)
        ctx.set_grid(d, fold_grid(rows))
        ctx.set_dims(out, shape)
        stat = tuple(shape[: len(shape) - len(normalized)]) + (1,) * len(normalized)
        ctx.set_dims(mean_out, stat)
        ctx.set_dims(rstd_out, stat)

    b.hook(resize)


@op("et_vk.rms_norm.default", "pte_wgpu.rms_norm_for_gemm", "pte_wgpu.rms_norm_for_q4", half=True)
def rms_norm(b):
    """`pte_wgpu.rms_norm_for_gemm` and `pte_wgpu.rms_norm_for_q4` (kernels/fusion.py) run only
    for more rows than the fused float or 4-bit linear that reads them normalizes itself
    (kernels/matmul/routes.py's fused_norm_rows)."""
    x, weight, out = b.args[0], b.args[1], b.out
    for_gemm = b.name != "et_vk.rms_norm.default"
    fused_rows = fused_norm_rows(b, b.tensor(1).dims[-1], (x, weight, out), q4=b.name == "pte_wgpu.rms_norm_for_q4")
    eps = float(b.scalar(2, 1e-6))
    shader = _shader(_rms_decls(b, x, weight, out), rms_norm_body(b.storage(out, packed=False)))
    params = b.params(PARAMS_SIZE)
    d = b.dispatch(shader, [x, weight, out, params])

    def resize(ctx):
        shape = ctx.dims(x)
        if not shape:
            b.fail("input is 0-d")
        normalized = shape[-1:]
        _check_param(b, ctx, weight, normalized, "weight")
        shape, data, rows = _norm_params(b, ctx, x, normalized, eps)
        ctx.set_params(params, data)
        ctx.set_grid(d, fold_grid(rows) if rows > fused_rows or not for_gemm else (0, 0, 0))
        ctx.set_dims(out, shape)

    b.hook(resize)


@op("pte_wgpu.rms_norm_pair", half=True)
def rms_norm_pair(b):
    """[x, weight, eps, x2, weight2, (out, out2)]: two RMS norms of one row length and eps in one
    dispatch (kernels/fusion.py: Qwen3's q and k norms), x's rows first; each row as
    et_vk.rms_norm computes it, so the same bits."""
    x, weight, _, x2, weight2 = b.args[:5]
    out, out2 = b.graph.values[b.out].items
    eps = float(b.scalar(2, 1e-6))
    to, to2 = (b.storage(v, packed=False) for v in (out, out2))
    decls = _rms_decls(b, x, weight, out) + _rms_decls(b, x2, weight2, out2, "b")
    second = "    let baseb = (row - p.pad0) * p.rlen;\n" + rms_norm_body(to2, "b")
    params = b.params(PARAMS_SIZE)
    d = b.dispatch(_shader(decls, f"    if (row < p.pad0) {{\n{rms_norm_body(to)}    }} else {{\n{second}    }}\n"),
                   [x, weight, out, x2, weight2, out2, params])

    def resize(ctx):
        shape, shape2 = ctx.dims(x), ctx.dims(x2)
        if not shape or not shape2:
            b.fail("input is 0-d")
        normalized = shape[-1:]
        _check_param(b, ctx, weight, normalized, "weight")
        _check_param(b, ctx, weight2, normalized, "second weight")
        if shape2[-1:] != normalized:
            b.fail(f"second input of shape {shape2} has rows of {shape2[-1]}, the first of {normalized[0]}")
        rows2 = numel_of(shape2[:-1])
        shape, data, rows = _norm_params(b, ctx, x, normalized, eps, more_rows=rows2)
        ctx.set_params(params, data)
        ctx.set_grid(d, fold_grid(rows + rows2))
        ctx.set_dims(out, shape)
        ctx.set_dims(out2, shape2)

    b.hook(resize)


# Qwen3's q and k norms and the rotate-half RoPE after them (kernels/fusion.py's
# _fuse_norms_into_rope): a workgroup normalizes a head's row as rms_norm_pair does, then each
# invocation rotates its dims, reading the pair's other dim normalized the same way, and stores k
# and v in the KV caches as rope_hf_into_cache does. The same expressions on the same values.
NORM_ROPE_UNIFORM = """struct R { q_heads: u32, k_heads: u32, rd: u32, start: u32, row: u32, blocks: u32, pad0: u32, pad1: u32 }
@group(0) @binding($AT) var<uniform> rope: R;
"""
NORM_ROPE_DECLS = (("fcos", "read"), ("fsin", "read"), ("oq", "read_write"), ("ok", "read_write"), ("v", "read"), ("kc", "read_write"),
                   ("vc", "read_write"), ("row_pos", "read"), ("row_seq", "read"), ("seq_blocks", "read"))  # fmt: skip


def _norm_rope_body(s, out, t, heads, stored=""):
    """The rotate-half RoPE of the row that rms_norm_body would write (bindings' suffix `s`, of
    storage type `t`) into `out`, its rows of `heads` heads a position; `stored` after each store."""
    norm = lambda k: rounded(f"f32(x{s}[base{s} + {k}]) * rstd * f32(w{s}[{k}])", t)  # noqa: E731
    return (rms_rstd(s) + f"    let tok = hrow / {heads};\n    for (var k = lid; k < p.rlen; k = k + {RWG}u) {{\n"
            + f"        var y = {norm('k')};\n"
            + "        if (k < rope.rd) {\n            let half = rope.rd / 2u;\n"
            + f"            let kp = select(k - half, k + half, k < half); let other = {norm('kp')};\n"
            + "            let partner = select(other, -other, k < half); let t = (rope.start + tok) * rope.rd + k;\n"
            + f"            y = {hf_rotation('y', 'partner', 't')};\n        }}\n"
            + f"        let j = base{s} + k; {out}[j] = {out.upper()}T(y);{stored}\n    }}\n")


@op("pte_wgpu.rms_norm_pair_rope_hf_into_cache", half=True)
def rms_norm_pair_rope(b):
    """[x, weight, eps, x2, weight2, fcos, fsin, start_pos, v, k_cache, v_cache, row_pos, row_seq,
    seq_blocks, (rotated q, rotated k)]: rms_norm_pair of q's and k's heads [1, S, H, D] (x, x2),
    then pte_wgpu.rope_hf_into_cache of the two, in one dispatch: each head's row a workgroup."""
    x, weight, _, x2, weight2, fcos, fsin, start_pos, v, k_cache, v_cache, *tables = b.args[:-1]
    oq, ok = b.graph.values[b.out].items
    eps = float(b.scalar(2, 1e-6))
    _, context, hkv, dim = b.graph.values[k_cache].dims
    b.writes(k_cache)
    b.writes(v_cache)
    bound = [fcos, fsin, oq, ok, v, k_cache, v_cache, *tables]
    t = {vid: b.storage(vid, packed=False) for vid in (x, weight, x2, weight2, *bound)}
    decls = [("read", "x", t[x]), ("read", "w", t[weight]), ("read", "xb", t[x2]), ("read", "wb", t[weight2])]
    decls += [(mode, name, t[vid]) for (name, mode), vid in zip(NORM_ROPE_DECLS, bound)]
    aliases = "".join(f"alias {name}T = {t[vid]};\n" for name, vid in (("OQ", oq), ("OK", ok), ("KC", k_cache), ("VC", v_cache)))
    stored = "\n        if (row_seq[tok] >= 0) { let at = cache_at(tok, j % rope.row); kc[at] = KCT(OKT(y)); vc[at] = VCT(v[j]); }"
    body = (f"    if (row < p.pad0) {{\n    let hrow = row;\n{_norm_rope_body('', 'oq', t[x], 'rope.q_heads')}    }} else {{\n"
            f"    let hrow = row - p.pad0; let baseb = hrow * p.rlen;\n{_norm_rope_body('b', 'ok', t[x2], 'rope.k_heads', stored)}    }}\n")
    shared = aliases + fill(NORM_ROPE_UNIFORM, AT=len(decls) + 1) + cache_at("rope")
    params, uniform = b.params(PARAMS_SIZE), b.params(32)
    d = b.dispatch(_shader(decls, body, shared), [x, weight, x2, weight2, *bound, params, uniform])

    def resize(ctx):
        shapes = ctx.dims(x), ctx.dims(x2)
        if any(len(shape) != 4 for shape in shapes):
            b.fail(f"q {list(shapes[0])} and k {list(shapes[1])} are not [1, S, heads, head dim]")
        (one, s, q_heads, rlen), (one_k, s_k, k_heads, rlen_k) = shapes
        rows, rd = ctx.dims(fcos)
        start = ctx.int_value(start_pos)
        if (one, one_k, s_k, rlen_k, k_heads * rlen) != (1, 1, s, rlen, hkv * dim) or rd % 2 or rd > rlen:
            b.fail(f"q {list(shapes[0])} and k {list(shapes[1])} with a rotary table of width {rd} and a cache of {hkv} x {dim}")
        if start < 0 or start + s > rows:
            b.fail(f"the rotary table has {rows} rows for positions {start}..{start + s - 1} (are the positions past the context?)")
        for vid, what in ((weight, "weight"), (weight2, "second weight")):
            _check_param(b, ctx, vid, (rlen,), what)
        rows2 = s * k_heads
        _, data, q_rows = _norm_params(b, ctx, x, (rlen,), eps, more_rows=rows2)
        ctx.set_params(params, data)
        ctx.set_params(uniform, struct.pack("<8I", q_heads, k_heads, rd, start, hkv * dim, table_entries(context), 0, 0))
        ctx.set_grid(d, fold_grid(q_rows + rows2))
        ctx.set_dims(oq, shapes[0])
        ctx.set_dims(ok, shapes[1])

    b.hook(resize)
