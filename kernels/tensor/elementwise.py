"""Elementwise ops: unary, binary and `where`, with NumPy broadcasting of up to 8 dims.

One WGSL template serves every op: each output element is decomposed into coordinates and each
operand is read through its broadcast strides (0 on broadcast dims), unless no operand broadcasts:
then every operand is read at the output's own flat index. A Scalar operand becomes a
uniform. The arithmetic runs in f32 unless every tensor operand and the output are integers.
"""

import math
import struct

from pte_wgpu.resize.shapes import broadcast_shapes, numel_of
from pte_wgpu.resize.values import SymInt

from ..registry import op
from ..wgsl import ERF, FLAT_INDEX, GELU, SPREAD_MAIN, STRIDED, clamped, fill, is_float, is_nan, maximum, minimum, pack_strides, pack_u32x8, relu, spread_grid, wgsl_type

PARAMS_SIZE = 16 + 32 * 4  # numel, rank, alpha, beta; sizes; 3 operand stride arrays

# Ended by the op's expression (`_shader`)
TEMPLATE = """
struct P { numel: u32, rank: u32, alpha: f32, beta: f32, sizes: array<vec4<u32>, 2>,
           s0: array<vec4<u32>, 2>, s1: array<vec4<u32>, 2>, s2: array<vec4<u32>, 2> }
$DECLS
@group(0) @binding($OUT_BINDING) var<storage, read_write> out: array<$TO>;
@group(0) @binding($P_BINDING) var<uniform> p: P;
$FLAT_INDEX
$STRIDED
$MAIN
fn element(i: u32) {
    if (i >= p.numel) { return; }
    let o = strided_offsets(i, p.rank, p.sizes, p.s0, p.s1, p.s2);  // rank 0: no operand broadcasts
    let o0 = o.x; let o1 = o.y; let o2 = o.z;
    let alpha = $CT(p.alpha);
    let beta = $CT(p.beta);
$LOADS
"""

# name -> (expression over a, b, c, alpha, beta in the compute type $CT)
UNARY = {
    "aten.relu.default": relu("a", "$CT(0)"),
    "aten.sigmoid.default": "1.0 / (1.0 + exp(-a))",
    "aten.tanh.default": f"tanh({clamped('a', '-20.0', '20.0')})",
    "aten.exp.default": "exp(a)",
    "aten.neg.default": "-a",
    "aten.sqrt.default": "sqrt(a)",
    "aten.rsqrt.default": "inverseSqrt(a)",
    "aten.abs.default": "abs(a)",
    "aten.sin.default": "sin(a)",
    "aten.cos.default": "cos(a)",
    "aten.log.default": "log(a)",
    "aten.log10.default": "log2(a) * 0.30102999566398120",
    "aten.log1p.default": "log1p_real(a)",
    "aten.reciprocal.default": "1.0 / a",
    "aten.round.default": "round(a)",
    "aten.logical_not.default": "$CT(a == $CT(0))",
    "aten.silu.default": "a / (1.0 + exp(-a))",
    "aten.hardtanh.default": clamped("a", "alpha", "beta"),
    "aten.clamp.default": clamped("a", "alpha", "beta"),
    "aten.leaky_relu.default": "select(a * alpha, a, a >= $CT(0))",
    "aten.hardswish.default": "a * clamp(a + 3.0, 0.0, 6.0) / 6.0",
    "aten.hardshrink.default": "select(a, $CT(0), abs(a) <= alpha)",
    # the unary ops ExecuTorch's Vulkan partitioner leaves to the portable kernels (their `.out` names)
    "aten.log2.default": "log2(a)",
    "aten.erf.default": "erf_approx(a)",
    "aten.expm1.default": "expm1_real(a)",
    "aten.tan.default": "tan(a)",
    "aten.asin.default": "asin_real(a)",
    "aten.acos.default": "acos_real(a)",
    "aten.atan.default": "atan_real(a)",
    "aten.sinh.default": "sinh(a)",
    "aten.cosh.default": "cosh(a)",
    "aten.asinh.default": "asinh(a)",
    "aten.acosh.default": "acosh(a)",
    "aten.atanh.default": "atanh(a)",
    "aten.floor.default": {"f32": "floor(a)", "i32": "a"},
    "aten.ceil.default": {"f32": "ceil(a)", "i32": "a"},
    "aten.trunc.default": {"f32": "trunc(a)", "i32": "a"},
    "aten.sign.default": "select(select(a, $CT(1), a > $CT(0)), $CT(-1), a < $CT(0))",  # 0, -0.0 and NaN as they are
    "aten.isnan.default": f"$CT({is_nan('a')})",
    "aten.isinf.default": "$CT(abs(a) > 3.4028234663852886e38)",
}
BINARY = {
    "add": "a + alpha * b",
    "sub": "a - alpha * b",
    "mul": "a * b",
    "div": "a / b",
    "pow": {"f32": "pow_real(a, b)", "i32": "pow_int(a, b)"},
    "minimum": minimum("a", "b"),
    "maximum": maximum("a", "b"),
    "eq": "$CT(a == b)",
    "ne": "$CT(a != b)",
    "lt": "$CT(a < b)",
    "le": "$CT(a <= b)",
    "gt": "$CT(a > b)",
    "ge": "$CT(a >= b)",
    "logical_and": "$CT(a != $CT(0) && b != $CT(0))",
    "logical_or": "$CT(a != $CT(0) || b != $CT(0))",
    "bitwise_and": {"i32": "a & b", "f32": "$CT(a != $CT(0) && b != $CT(0))"},  # bools are 0 and 1: & is their and
    "bitwise_or": {"i32": "a | b", "f32": "$CT(a != $CT(0) || b != $CT(0))"},
    "bitwise_xor": {"i32": "a ^ b", "f32": "$CT((a != $CT(0)) != (b != $CT(0)))"},
    "logical_xor": "$CT((a != $CT(0)) != (b != $CT(0)))",
    "atan2": "atan2_real(a, b)",
    # the remainder of a / b with the divisor's sign (remainder) or the dividend's (fmod); in
    # integers through the truncated quotient, not `%` (see DIV_MODE)
    "remainder": {"f32": "a - floor(a / b) * b", "i32": "select(a - a / b * b, a - a / b * b + b, a - a / b * b != 0 && ((a - a / b * b < 0) != (b < 0)))"},
    "fmod": {"f32": "a - trunc(a / b) * b", "i32": "a - a / b * b"},
}
# pow of f32 as torch's (C's): WGSL's pow is exp2(b * log2(a)), indeterminate for a base below 0 and
# at NaN (lavapipe: pow(NaN, 2) is 0, pow(-2.5, -2.5) a number), where torch gives a real result for
# an integral exponent, NaN for a fractional one, 1 for an exponent of 0 or a base of 1, and C's
# values at zeros and infinities. A `let` holds the bits of Inf and NaN: WGSL refuses such constants.
POW_REAL = """
fn pow_real(a: f32, b: f32) -> f32 {
    if (b == 0.0 || a == 1.0) { return 1.0; }
    if (is_nan(a) || is_nan(b)) { return a + b; }
    let bits = vec2<u32>(0x7f800000u, 0x7fc00000u);
    let inf = bitcast<f32>(bits.x);
    let m = abs(a);
    if (abs(b) == inf) {
        if (m == 1.0) { return 1.0; }
        return select(0.0, inf, (m < 1.0) == (b < 0.0));
    }
    let integral = fract(b) == 0.0;
    if (a < 0.0 && m != inf && !integral) { return bitcast<f32>(bits.y); }
    var r = pow(m, b);
    if (m == 0.0) { r = select(0.0, inf, b < 0.0); }
    if (m == inf) { r = select(0.0, inf, b > 0.0); }
    let odd = integral && fract(b * 0.5) != 0.0;
    return select(r, -r, odd && (bitcast<u32>(a) >> 31u) == 1u);
}
"""
# pow of i32 by squaring, wrapping as torch's integers do (WGSL's pow takes floats only); a negative
# exponent (which torch refuses for integer tensors) gives 1 / a^-b truncated
POW_INT = """
fn pow_int(a: i32, b: i32) -> i32 {
    if (b < 0) { return select(select(0, 1 - 2 * (b & 1), a == -1), 1, a == 1); }
    var r = 1;
    var base = a;
    for (var e = b; e > 0; e = e >> 1u) {
        if ((e & 1) == 1) { r = r * base; }
        base = base * base;
    }
    return r;
}
"""
# log1p and expm1 of a small a keep its digits by series: log(1 + a) and exp(a) - 1 lose them, and
# WGSL's log is only within 2^-21 (absolute) near 1. log1p(a) = 2 atanh(s), s = a / (2 + a), as
# 2 (s + s^3/3 + .. + s^11/11) for |a| < 0.5 (|s| < 0.2: the next term 1e-9 of the sum); expm1 by
# its Taylor series to a^9/9! for |a| < 0.5 (the next 6e-9).
SERIES = """
fn log1p_real(a: f32) -> f32 {
    if (abs(a) >= 0.5 || is_nan(a)) { return log(1.0 + a); }
    let s = a / (2.0 + a);
    let z = s * s;
    return 2.0 * s * (1.0 + z * (1.0 / 3.0 + z * (0.2 + z * (1.0 / 7.0 + z * (1.0 / 9.0 + z / 11.0)))));
}
fn expm1_real(a: f32) -> f32 {
    if (abs(a) >= 0.5 || is_nan(a)) { return exp(a) - 1.0; }
    return a * (1.0 + a * (0.5 + a * (1.0 / 6.0 + a * (1.0 / 24.0 + a * (1.0 / 120.0 + a * (1.0 / 720.0
        + a * (1.0 / 5040.0 + a * (1.0 / 40320.0 + a / 362880.0))))))));
}
"""
# asin, acos, atan and atan2 (C's values at zeros and infinities) to f32's precision: WGSL's are only within 4096 ULP (lavapipe's asin 4e-4 off).
# atan: |x| reduced to [0, tan(pi/8)] by atan(x) = pi/2 - atan(1/x) and pi/4 + atan((x - 1)/(x + 1)),
# then an odd polynomial; asin: sqrt((1 - |x|)/2) for |x| > 1/2 (asin(x) = pi/2 - 2 asin of it), then
# an odd polynomial; acos from asin. Outside [-1, 1], NaN.
INVERSE_TRIG = """
fn atan_real(x: f32) -> f32 {
    let a = abs(x);
    var y0 = 0.0;
    var t = a;
    if (a > 2.414213562373095) { y0 = 1.5707963267948966; t = -1.0 / a; }
    else if (a > 0.41421356237309503) { y0 = 0.7853981633974483; t = (a - 1.0) / (a + 1.0); }
    let z = t * t;
    let y = y0 + ((((0.0805374449538 * z - 0.138776856032) * z + 0.199777106478) * z - 0.333329491539) * z * t + t);
    return select(y, -y, x < 0.0);
}
fn asin_real(x: f32) -> f32 {
    let a = abs(x);
    if (!(a <= 1.0) || is_nan(a)) { let bits = 0x7fc00000u; return bitcast<f32>(bits); }
    let far = a > 0.5;
    let z = select(a * a, 0.5 * (1.0 - a), far);
    let s = select(a, sqrt(z), far);
    var y = ((((0.042163199048 * z + 0.024181311049) * z + 0.045470025998) * z + 0.074953002686) * z + 0.16666752422) * z * s + s;
    if (far) { y = 1.5707963267948966 - 2.0 * y; }
    return select(y, -y, x < 0.0);
}
fn atan2_real(y: f32, x: f32) -> f32 {
    if (is_nan(x) || is_nan(y)) { return x + y; }
    let bits = 0x7f800000u;
    let inf = bitcast<f32>(bits);
    let left = (bitcast<u32>(x) >> 31u) == 1u;  // x < 0 or -0.0: the angle is past pi/2
    var r: f32;
    if (abs(y) == inf) { r = select(select(1.5707963267948966, 0.7853981633974483, abs(x) == inf), 2.356194490192345, left && abs(x) == inf); }
    else if (abs(x) == inf || y == 0.0) { r = select(0.0, 3.141592653589793, left); }
    else if (x == 0.0) { r = 1.5707963267948966; }
    else {
        r = atan_real(abs(y) / abs(x));
        if (left) { r = 3.141592653589793 - r; }
    }
    return select(r, -r, (bitcast<u32>(y) >> 31u) == 1u);
}
fn acos_real(x: f32) -> f32 {
    if (x < -0.5) { return 3.141592653589793 - 2.0 * asin_real(sqrt(0.5 * (1.0 + x))); }
    if (x > 0.5) { return 2.0 * asin_real(sqrt(0.5 * (1.0 - x))); }
    return 1.5707963267948966 - asin_real(x);
}
"""
# the helper functions an expression may call, added to its shader when it does
HELPERS = {"erf_approx": ERF, "pow_real": POW_REAL, "pow_int": POW_INT, "log1p_real": SERIES, "expm1_real": SERIES,
           "asin_real": INVERSE_TRIG, "acos_real": INVERSE_TRIG, "atan_real": INVERSE_TRIG, "atan2_real": INVERSE_TRIG}


def _shader(expr, operand_types, out_type, ct):
    decls, loads = [], []
    for k, t in enumerate(operand_types):
        name = "abc"[k]
        if t is None:  # a Scalar operand, passed in beta
            loads.append(f"    let {name} = beta;")
            continue
        decls.append(f"@group(0) @binding({len(decls)}) var<storage, read> in{k}: array<{t}>;")
        loads.append(f"    let {name} = {ct}(in{k}[o{k}]);")
    n = len(decls)
    # the expression ends the template: its $CT is filled with the template's
    template = TEMPLATE + "    out[i] = $TO(" + expr + ");\n}\n"
    src = fill(
        template,
        DECLS="\n".join(decls),
        OUT_BINDING=n,
        P_BINDING=n + 1,
        TO=out_type,
        CT=ct,
        MAIN=SPREAD_MAIN,
        FLAT_INDEX=FLAT_INDEX,
        STRIDED=STRIDED,
        LOADS="\n".join(loads),
    )
    return src + "".join(dict.fromkeys(helper for name, helper in HELPERS.items() if name in expr))


def add_elementwise(b, operands, expr, alpha=1.0, beta=0.0):
    """Record a broadcast elementwise op: `operands` are arg positions (or None for the Scalar in
    `beta`), `expr` is over a, b, c, `$CT` naming the compute type (or {compute type: expr}).
    `alpha` and `beta` are numbers or `fn(ctx)` for live values (a SymInt clamp bound)."""
    out = b.tensor(len(b.args) - 1)
    tensors = [b.args[i] if i is not None else None for i in operands]
    dtypes = [b.graph.values[v].dtype for v in tensors if v is not None] + [out.dtype]
    ct = "f32" if any(is_float(d) for d in dtypes) else "i32"
    if isinstance(expr, dict):
        expr = expr[ct]
    types = [b.storage(v) if v is not None else None for v in tensors]
    shader = _shader(expr, types, wgsl_type(out.dtype), ct)
    params = b.params(PARAMS_SIZE)
    live = [v for v in tensors if v is not None]
    d = b.dispatch(shader, live + [b.out, params])

    def resize(ctx):
        a, c = (x(ctx) if callable(x) else x for x in (alpha, beta))
        if ct == "i32":
            a, c = (float(int(x)) if math.isfinite(x) else x for x in (a, c))
        shapes = [ctx.dims(v) for v in live]
        try:
            shape = broadcast_shapes(*shapes)
        except ValueError as e:
            b.fail(f"{e}")
        n = numel_of(shape)
        strides = b"".join(pack_strides(s, shape) for s in shapes)
        strides += bytes(32 * (3 - len(shapes)))
        # rank 0 when every operand has the output's elements (none broadcasts): the kernel then
        # skips the coordinate loop, whose divisions cost more than the memory traffic
        rank = len(shape) if any(numel_of(s) != n for s in shapes) else 0
        ctx.set_params(params, struct.pack("<IIff", n, rank, a, c) + pack_u32x8(shape) + strides)
        ctx.set_grid(d, spread_grid(n))
        ctx.set_dims(b.out, shape)

    b.hook(resize)


def _bound(b, i, default):
    """A clamp bound or a scalar operand: a number fixed in the file (None: `default`), or `fn(ctx)`
    for a SymInt."""
    if isinstance(b.value(i), SymInt):
        vid = b.args[i]
        return lambda ctx: ctx.int_value(vid)
    return b.scalar(i, default)


def _unary(name, expr):
    """The build of unary op `name` (the delegate's name; the portable kernel's takes the same arguments)."""

    def build(b):
        alpha, beta = -math.inf, math.inf  # a bound of None: open
        if name in ("aten.clamp.default", "aten.hardtanh.default"):
            alpha, beta = _bound(b, 1, alpha), _bound(b, 2, beta)
        elif name == "aten.leaky_relu.default":
            alpha = b.scalar(1, 0.01)
        elif name == "aten.hardshrink.default":
            alpha = b.scalar(1, 0.5)
        add_elementwise(b, [0], expr, alpha, beta)

    return build


for _name, _expr in UNARY.items():  # the delegate's name and the portable kernel's (aten::relu.out)
    op(_name, _name.replace("aten.", "aten::").replace(".default", ".out"), half=True, capacity=True)(_unary(_name, _expr))


@op("aten.bitwise_not.default", "aten::bitwise_not.out", half=True, capacity=True)
def bitwise_not(b):
    """Of a bool tensor its logical not; of an integer one each bit flipped."""
    add_elementwise(b, [0], "$CT(a == $CT(0))" if b.tensor(0).dtype == "bool" else "~a")


@op("aten.elu.default", "aten::elu.out", half=True, capacity=True)
def elu(b):
    """[x, alpha, scale, input_scale, out]: scale * x, or scale * alpha * (exp(x * input_scale) - 1) at x <= 0."""
    alpha, scale, input_scale = (repr(float(b.scalar(i, 1.0))) for i in (1, 2, 3))
    add_elementwise(b, [0], f"select({scale} * {alpha} * (exp(a * {input_scale}) - 1.0), {scale} * a, a > 0.0)")


@op("aten.gelu.default", "aten::gelu.out", half=True, capacity=True)
def gelu(b):
    add_elementwise(b, [0], GELU[b.scalar(1, "none")])


# torch's pow by a number takes these exponents as these expressions (sqrt(-Inf) is NaN where C's pow
# gives Inf), the others as pow_real
POW_BY = {0.5: "sqrt(a)", -0.5: "inverseSqrt(a)", 2.0: "a * a", 3.0: "a * a * a", -1.0: "1.0 / a", -2.0: "1.0 / (a * a)"}


def _binary(expr):
    def build(b):
        alpha = 1.0
        if len(b.args) == 4 and not b.is_tensor(2):  # add/sub carry alpha
            alpha = b.scalar(2, 1)
        if b.is_tensor(1):
            add_elementwise(b, [0, 1], expr, alpha)
            return
        beta = _bound(b, 1, None)  # a number, or a live SymInt
        if expr == BINARY["pow"] and not callable(beta) and float(beta) in POW_BY:
            add_elementwise(b, [0], POW_BY[float(beta)])
        else:
            add_elementwise(b, [0, None], expr, alpha, beta=beta)

    return build


for _base, _expr in BINARY.items():
    names = [f"aten.{_base}.Tensor", f"aten.{_base}.Scalar", f"aten::{_base}.out", f"aten::{_base}.Scalar_out"]
    if _base == "pow":
        names = ["aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", "aten::pow.Tensor_Tensor_out", "aten::pow.Tensor_Scalar_out"]
    if _base in ("minimum", "maximum"):
        names = [f"aten.{_base}.default", f"aten::{_base}.out"]
    if _base in ("logical_and", "logical_or", "logical_xor", "atan2"):
        names = [f"aten.{_base}.default", f"aten::{_base}.out"]
    if _base in ("remainder", "fmod"):
        names = [f"aten.{_base}.Tensor", f"aten.{_base}.Scalar", f"aten::{_base}.Tensor_out", f"aten::{_base}.Scalar_out"]
    if _base in ("eq", "ne", "lt", "le", "gt", "ge", "bitwise_and", "bitwise_or", "bitwise_xor"):
        names.append(f"aten::{_base}.Tensor_out")  # the portable kernels' name for the Tensor form
    op(*names, half=True, capacity=True)(_binary(_expr))


@op("aten.pow.Scalar", "aten::pow.Scalar_out", half=True, capacity=True)
def pow_scalar(b):
    """[base (a number), exponent (a tensor), out]."""
    add_elementwise(b, [1], {"f32": "pow_real(beta, a)", "i32": "pow_int(beta, a)"}, beta=_bound(b, 0, None))


@op("aten.clamp.Tensor", "aten::clamp.Tensor_out", half=True, capacity=True)
def clamp_tensor(b):
    """[self, min, max, out], either bound a tensor or None: min(max(self, min), max), NaN where
    any operand is."""
    if b.is_none(1) and b.is_none(2):
        b.fail("neither min nor max given, expected at least one")
    if b.is_none(2):
        add_elementwise(b, [0, 1], maximum("a", "b"))
    elif b.is_none(1):
        add_elementwise(b, [0, 2], minimum("a", "b"))
    else:
        add_elementwise(b, [0, 1, 2], minimum(maximum("a", "b"), "c"))


# div with rounding_mode "trunc" or "floor"; WGSL integer division truncates. The integer floor
# tests the remainder as a / b * b != a, not with `%`: on an H200 through wgpu-native, `%` of a
# negative i32 gave the unsigned remainder (-50 % 3 read 2, its division right).
DIV_MODE = {
    None: "a / b",
    "trunc": {"f32": "trunc(a / b)", "i32": "a / b"},
    "floor": {"f32": "floor(a / b)", "i32": "a / b - $CT((a / b * b != a) && ((a < $CT(0)) != (b < $CT(0))))"},
}


@op("aten.div.Tensor_mode", "aten.div.Scalar_mode", "aten::div.out_mode", "aten::div.Scalar_mode_out", half=True, capacity=True)
def div_mode(b):
    mode = b.scalar(2, None)
    if mode not in DIV_MODE:
        b.fail(f"rounding mode {mode!r}")
    if b.is_tensor(1):
        add_elementwise(b, [0, 1], DIV_MODE[mode])
    else:
        add_elementwise(b, [0, None], DIV_MODE[mode], beta=_bound(b, 1, None))


@op("aten.where.self", "aten::where.self_out", half=True, capacity=True)
def where(b):
    add_elementwise(b, [0, 1, 2], "select(c, b, a != $CT(0))")
