"""Kernels over 8-bit tensors, which are stored packed 4 per u32 word (kernels/wgsl.py PACKED).

A kernel that writes an 8-bit tensor owns whole output words: each invocation computes the 4
elements of one word and stores them at once, so no two invocations write the same word. Reads
go through `<name>_at(i)`, which sign-extends int8 and zero-extends uint8 bytes; float tensors
(f32 or f16 storage) read as f32 and int32 ones as themselves. A float output converts from f32 at
the store.

`add_word_map` records such a kernel for ops whose output has the input's shape (quantize,
dequantize, q8ta_add, q8ta_relu); `kernels/quant/per_channel_linear.py` builds the linear ones on the same
helpers.
"""

import struct

from pte_wgpu.resize.shapes import numel_of

from ..registry import op
from ..wgsl import FLAT_INDEX, PACKED, WG, fill, flat_grid, is_float, wgsl_type

# numel, a 4-dim coordinate helper (inner, channels), then 4 floats and 4 ints of op constants
MAP_PARAMS = "<IIII4f4i"
MAP_SIZE = struct.calcsize(MAP_PARAMS)
MAP_STRUCT = "struct P { n: u32, inner: u32, channels: u32, pad: u32, f: vec4<f32>, k: vec4<i32> }"


def reader(name, dtype, binding):
    """The binding of a tensor and its accessor `<name>_at(i)`: i32 for 8-bit, f32 for a float
    tensor stored as f32 or f16, else its storage type."""
    decl = f"@group(0) @binding({binding}) var<storage, read> {name}: array<{wgsl_type(dtype)}>;\n"
    if dtype == "int8":
        return decl + (
            f"fn {name}_at(i: u32) -> i32 {{ return bitcast<i32>({name}[i / 4u] << (24u - 8u * (i % 4u))) >> 24u; }}\n"
        )
    if dtype == "uint8":
        return decl + f"fn {name}_at(i: u32) -> i32 {{ return i32(({name}[i / 4u] >> (8u * (i % 4u))) & 0xFFu); }}\n"
    if is_float(dtype):
        return decl + f"fn {name}_at(i: u32) -> f32 {{ return f32({name}[i]); }}\n"
    return decl + f"fn {name}_at(i: u32) -> {wgsl_type(dtype)} {{ return {name}[i]; }}\n"


# The word kernels' entry point; $STORE stores the 4 values of word w
WORD_MAIN = """
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = flat_index(gid, nwg, ${WG}u);
    let first = w * 4u;
    if (first >= $TOTAL) { return; }$STORE
}
"""


def word_main(out_dtype, total="p.n"):
    """The entry point: invocation w computes `fn value(i)` for elements 4w..4w+3 (below `total`)
    and stores them, packed into one word when the output has 8 bits."""
    if out_dtype in PACKED:
        store = fill(
            """
    var word = 0u;
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (first + j < $TOTAL) { word = word | ((u32(value(first + j)) & 0xFFu) << (8u * j)); }
    }
    out[w] = word;""",
            TOTAL=total,
        )
    else:
        store = fill(
            """
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (first + j < $TOTAL) { out[first + j] = $OUT_T(value(first + j)); }
    }""",
            TOTAL=total,
            OUT_T=wgsl_type(out_dtype),
        )
    return FLAT_INDEX + fill(WORD_MAIN, WG=WG, TOTAL=total, STORE=store)


def word_grid(n):
    return flat_grid(-(-n // 4))


def add_word_map(b, inputs, body, consts_of, qparams=(), coords_of=None):
    """Record an elementwise kernel over 8-bit or float tensors, the output shaped as `inputs[0]`.
    `inputs` (value ids, all of one shape) read in WGSL as `in0_at(i)`, `in1_at(i)`, ...; `qparams`
    (per-tensor, per-channel or per-token scale and zero point tensors) as `q0_at(j)`, ... .
    `body` defines `fn value(i: u32) -> <i32 for an 8-bit output, f32 otherwise>` over them and
    the uniform `p`: p.f and p.k are `consts_of(ctx)` -> (4 floats, 4 integral numbers: zero
    points may come as Doubles, see `zero_point`); element i's parameter index is
    (i / p.inner) % p.channels, with `coords_of(ctx, dims)` -> (inner, channels), (1, 1) without it."""
    values = b.graph.values
    out = values[b.out]
    named = [(f"in{k}", v) for k, v in enumerate(inputs)] + [(f"q{k}", v) for k, v in enumerate(qparams)]
    decls = "".join(reader(name, values[v].dtype, k) for k, (name, v) in enumerate(named))
    n = len(named)
    src = (
        decls
        + f"@group(0) @binding({n}) var<storage, read_write> out: array<{wgsl_type(out.dtype)}>;\n"
        + f"@group(0) @binding({n + 1}) var<uniform> p: P;\n{MAP_STRUCT};\n"
        + "fn param_index(i: u32) -> u32 { return (i / p.inner) % p.channels; }\n"
        + body
        + word_main(out.dtype)
    )
    params = b.params(MAP_SIZE)
    d = b.dispatch(src, [v for _, v in named] + [b.out, params])

    def resize(ctx):
        dims = ctx.dims(inputs[0])
        for v in inputs[1:]:
            if ctx.dims(v) != dims:
                b.fail(f"operands of shapes {dims} and {ctx.dims(v)}")
        n = numel_of(dims)
        floats, ints = consts_of(ctx)
        inner, channels = coords_of(ctx, dims) if coords_of else (1, 1)
        ctx.set_params(params, struct.pack(MAP_PARAMS, n, inner, channels, 0, *floats, *map(int, ints)))
        ctx.set_grid(d, word_grid(n))
        ctx.set_dims(b.out, dims)

    b.hook(resize)


# Quantize and dequantize one value (the reference decomposition: quantize_per_tensor's
# clamp(round(x * (1 / scale)) + zp), dequantize's (q - zp) * scale, all in f32).
QUANT_FNS = """
fn quantize(x: f32, inv_scale: f32, zp: i32, qmin: i32, qmax: i32) -> i32 {
    return i32(clamp(round(x * inv_scale) + f32(zp), f32(qmin), f32(qmax)));
}
fn dequantize(q: i32, scale: f32, zp: i32) -> f32 { return (f32(q) - f32(zp)) * scale; }
"""


def inv(scale):
    """1 / scale as torch computes it for a Python scale: in double, then used as float32."""
    return 1.0 / float(scale)


def zero_point(b, i):
    """Argument `i`, a zero point, as an int. ExecuTorch's Vulkan serializer shares one value
    between equal constant scalars, so a zero point of 6 can arrive as a ReLU6's 6.0 (a Double)."""
    return int(b.scalar(i))


# ---------------------------------------------------------------- q8ta_add / q8ta_relu


@op("et_vk.q8ta_add.default")
def q8ta_add(b):
    """[a int8, b int8, a_scale, a_zp, b_scale, b_zp, out_scale, out_zp, alpha, out int8]:
    quantize(dequantize(a) + alpha * dequantize(b)) with int8 bounds."""
    sa, za, sb, zb, so, zo, alpha = (b.scalar(i) for i in range(2, 9))
    if b.graph.values[b.args[0]].dims != b.graph.values[b.args[1]].dims:
        raise NotImplementedError(f"{b.name}: broadcasting operands")
    body = (
        QUANT_FNS
        + """
fn value(i: u32) -> i32 {
    let r = dequantize(in0_at(i), p.f.x, p.k.x) + p.f.w * dequantize(in1_at(i), p.f.y, p.k.y);
    return quantize(r, p.f.z, p.k.z, -128, 127);
}
"""
    )
    add_word_map(b, [b.args[0], b.args[1]], body, lambda ctx: ((sa, sb, inv(so), alpha), (za, zb, zo, 0)))


@op("et_vk.q8ta_relu.default")
def q8ta_relu(b):
    """[x int8, in_scale, in_zp, out_scale, out_zp, out int8]: quantize(relu(dequantize(x)))."""
    si, zi, so, zo = (b.scalar(i) for i in range(1, 5))
    body = (
        QUANT_FNS
        + """
fn value(i: u32) -> i32 {
    return quantize(max(dequantize(in0_at(i), p.f.x, p.k.x), 0.0), p.f.y, p.k.y, -128, 127);
}
"""
    )
    add_word_map(b, [b.args[0]], body, lambda ctx: ((si, inv(so), 0.0, 0.0), (zi, zo, 0, 0)))


# ---------------------------------------------------------------- q8ta_pixel_shuffle

PIXEL_SHUFFLE = """
struct P { n: u32, oh: u32, ow: u32, r: u32, x_zp: i32, out_zp: i32, x_scale: f32, inv_out: f32 }
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> p: P;
fn value(e: u32) -> i32 {
    let ox = e % p.ow;
    let oy = (e / p.ow) % p.oh;
    let nc = e / (p.ow * p.oh);
    let c = (nc * p.r + oy % p.r) * p.r + ox % p.r;  // the input plane: channel c * r * r + (oy % r) * r + ox % r
    let q = in0_at((c * (p.oh / p.r) + oy / p.r) * (p.ow / p.r) + ox / p.r);
    return quantize(dequantize(q, p.x_scale, p.x_zp), p.inv_out, p.out_zp, -128, 127);
}
"""


@op("et_vk.q8ta_pixel_shuffle.default")
def q8ta_pixel_shuffle(b):
    """[x int8 [N, C * r * r, H, W], input_scale, input_zp, output_inv_scale, output_zp, r,
    out int8 [N, C, H * r, W * r]]: the bytes moved and requantized. The reference quantizes with
    output_scale = 1 / output_inv_scale, so the multiplier is that scale's inverse again."""
    x_scale, x_zp, out_inv_scale, out_zp, r = b.scalar(1), zero_point(b, 2), b.scalar(3), zero_point(b, 4), b.scalar(5)
    inv_out = inv(1.0 / float(out_inv_scale))
    params = b.params(32)
    d = b.dispatch(reader("in0", "int8", 0) + QUANT_FNS + PIXEL_SHUFFLE + word_main("int8"), [b.args[0], b.out, params])

    def resize(ctx):
        n, c, h, w = ctx.dims(b.args[0])
        if c % (r * r):
            b.fail(f"{c} channels do not divide by the upscale factor {r} squared")
        shape = (n, c // (r * r), h * r, w * r)
        total = numel_of(shape)
        ctx.set_params(params, struct.pack("<4I2i2f", total, h * r, w * r, r, x_zp, out_zp, x_scale, inv_out))
        ctx.set_grid(d, word_grid(total))
        ctx.set_dims(b.out, shape)

    b.hook(resize)
