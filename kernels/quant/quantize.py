"""Quantize, dequantize and choose_qparams: `quantized_decomposed` (per tensor, per channel, per
token) and torchao's `quantize_affine`, `dequantize_affine` and `choose_qparams_affine`.

The arithmetic is the reference decomposition's, in f32: quantize is
clamp(round(x * (1 / scale)) + zp, qmin, qmax) (per token: round(x * (1 / scale) + zp)), and
dequantize is (q - zp) * scale. A scale given as a number is inverted on the host in double, as
torch does with a Python scale; a scale tensor is inverted on the GPU with `div_rn`, correctly
rounded like torch's f32 division. Eager per-token ops compute in float64 (their scales are
double); here, as in ExecuTorch's Vulkan runtime, every float is f32. float16 inputs, scales and
outputs are stored as f16 and converted at the load and the store.
"""

from pte_wgpu.resize.shapes import fold_grid, normalize_dim, numel_of

from ..registry import op
from ..wgsl import DIV_RN, MODES, PACKED, QP_SIZE, QP_STRUCT, QPARAMS, affine_args, fill, is_float, qp_bytes
from .int8_elementwise import QUANT_FNS, add_word_map, inv, zero_point

QUANTIZE_TENSOR_QPARAMS = """
fn value(i: u32) -> i32 {
    let j = param_index(i);
    return quantize(in0_at(i), div_rn(1.0, q0_at(j)), $ZP, p.k.x, p.k.y);
}
"""
QUANTIZE_SCALAR_QPARAMS = """
fn value(i: u32) -> i32 { return quantize(in0_at(i), p.f.x, p.k.z, p.k.x, p.k.y); }
"""
DEQUANTIZE_TENSOR_QPARAMS = """
fn value(i: u32) -> f32 { let j = param_index(i); return dequantize(i32(in0_at(i)), q0_at(j), $ZP); }
"""
DEQUANTIZE_SCALAR_QPARAMS = """
fn value(i: u32) -> f32 { return dequantize(i32(in0_at(i)), p.f.x, p.k.z); }
"""


def _quantize(b, qmin, qmax, qparams, coords_of=None, body=QUANTIZE_TENSOR_QPARAMS):
    """quantize args[0] with tensor `qparams` [scales] or [scales, zero points], or with the
    scalar args 1 and 2."""
    if not is_float(b.graph.values[b.args[0]].dtype):
        b.fail(f"input dtype {b.graph.values[b.args[0]].dtype}")
    if qparams:
        body = fill(body, ZP="i32(q1_at(j))" if len(qparams) == 2 else "0")
        add_word_map(b, [b.args[0]], QUANT_FNS + DIV_RN + body, lambda ctx: ((0.0,) * 4, (qmin, qmax, 0, 0)), qparams, coords_of)
    else:
        scale, zp = b.scalar(1), b.scalar(2, 0)
        consts = ((inv(scale), 0.0, 0.0, 0.0), (qmin, qmax, zp, 0))
        add_word_map(b, [b.args[0]], QUANT_FNS + QUANTIZE_SCALAR_QPARAMS, lambda ctx: consts)


def _dequantize(b, scales, zps, coords_of=None):
    """dequantize with tensor scales (and zero points, or None for 0)."""
    body = fill(DEQUANTIZE_TENSOR_QPARAMS, ZP="0" if zps is None else "i32(q1_at(j))")
    qparams = [scales] + ([] if zps is None else [zps])
    add_word_map(b, [b.args[0]], QUANT_FNS + body, lambda ctx: ((0.0,) * 4, (0,) * 4), qparams, coords_of)


@op("quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.quantize_per_tensor.tensor",
    "quantized_decomposed::quantize_per_tensor.out", "quantized_decomposed::quantize_per_tensor.Tensor_out", half=True)
def quantize_per_tensor(b):
    """[input, scale, zero_point, qmin, qmax, dtype, out]."""
    _quantize(b, b.scalar(3), b.scalar(4), [b.args[1], b.args[2]] if b.is_tensor(1) else [])


@op("quantized_decomposed.dequantize_per_tensor.default", "quantized_decomposed.dequantize_per_tensor.tensor",
    "quantized_decomposed::dequantize_per_tensor.out", "quantized_decomposed::dequantize_per_tensor.Tensor_out", half=True)
def dequantize_per_tensor(b):
    """[input, scale, zero_point, qmin, qmax, dtype, out_dtype, out]."""
    if b.is_tensor(1):
        _dequantize(b, b.args[1], b.args[2])
    else:
        consts = ((float(b.scalar(1)), 0.0, 0.0, 0.0), (0, 0, b.scalar(2, 0), 0))
        add_word_map(b, [b.args[0]], QUANT_FNS + DEQUANTIZE_SCALAR_QPARAMS, lambda ctx: consts)


# dequantize -> clamp -> quantize with numbers for parameters, as one kernel (kernels/fusion.py):
# the three ops' f32 arithmetic in their order, so the bytes those ops give
REQUANTIZED_CLAMP = "pte_wgpu.requantized_clamp"
REQUANTIZED_CLAMP_VALUE = """
fn value(i: u32) -> i32 {
    return quantize(clamp(dequantize(in0_at(i), p.f.x, p.k.x), p.f.z, p.f.w), p.f.y, p.k.y, p.k.z, p.k.w);
}
"""


@op(REQUANTIZED_CLAMP)
def requantized_clamp(b):
    """[q, scale, zero_point, min or None, max or None, out scale, out zero_point, qmin, qmax, out]."""
    lo, hi = float(b.scalar(3, -3.4e38)), float(b.scalar(4, 3.4e38))
    consts = ((float(b.scalar(1)), inv(b.scalar(5)), lo, hi), (zero_point(b, 2), zero_point(b, 6), b.scalar(7), b.scalar(8)))
    add_word_map(b, [b.args[0]], QUANT_FNS + REQUANTIZED_CLAMP_VALUE, lambda ctx: consts)


def _channel_coords(b, axis):
    def coords(ctx, dims):
        a = normalize_dim(axis, len(dims))
        return numel_of(dims[a + 1 :]), dims[a]

    return coords


@op("quantized_decomposed.quantize_per_channel.default", "quantized_decomposed::quantize_per_channel.out", half=True)
def quantize_per_channel(b):
    """[input, scales [C], zero_points [C], axis, qmin, qmax, dtype, out]."""
    _quantize(b, b.scalar(4), b.scalar(5), [b.args[1], b.args[2]], _channel_coords(b, b.scalar(3)))


@op("quantized_decomposed.dequantize_per_channel.default", "quantized_decomposed::dequantize_per_channel.out", half=True)
def dequantize_per_channel(b):
    """[input, scales [C], zero_points [C] or None, axis, qmin, qmax, dtype, out_dtype, out]."""
    _dequantize(b, b.args[1], None if b.is_none(2) else b.args[2], _channel_coords(b, b.scalar(3)))


def _token_coords(ctx, dims):
    return dims[-1], numel_of(dims[:-1])


@op("quantized_decomposed.quantize_per_token.default", "quantized_decomposed::quantize_per_token.out", half=True)
def quantize_per_token(b):
    """[input [..., K], scales [..., 1], zero_points [..., 1], qmin, qmax, dtype, out]."""
    body = """
fn value(i: u32) -> i32 {
    let j = param_index(i);
    let q = round(in0_at(i) * div_rn(1.0, q0_at(j)) + f32($ZP));
    return i32(clamp(q, f32(p.k.x), f32(p.k.y)));
}
"""
    _quantize(b, b.scalar(3), b.scalar(4), [b.args[1], b.args[2]], _token_coords, body)


@op("quantized_decomposed.dequantize_per_token.default", "quantized_decomposed::dequantize_per_token.out", half=True)
def dequantize_per_token(b):
    """[input, scales [..., 1], zero_points [..., 1], qmin, qmax, dtype, output_dtype, out]."""
    _dequantize(b, b.args[1], b.args[2], _token_coords)


# ---------------------------------------------------------------- torchao quantize_affine / dequantize_affine

DTYPE_BOUNDS = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1)}


def _block_coords(b, block_arg):
    """Element i's scale index is i / run for blocks [1, ..., 1, B, full dims...]: each scale
    covers one contiguous run of `B * (the full dims)` elements. The block sizes may be SymInts."""

    def coords(ctx, dims):
        block = tuple(ctx.int_list(block_arg))
        rank = len(dims)
        lead = next((d for d, s in enumerate(block) if s != 1), rank)
        if len(block) != rank or any(block[d] != dims[d] for d in range(lead + 1, rank)) or (lead < rank and dims[lead] % block[lead]):
            raise NotImplementedError(f"{b.name}: block_size {list(block)} for input {dims}")
        run = numel_of(block[lead:])
        return run, max(numel_of(dims) // run, 1)

    return coords


@op("torchao.quantize_affine.default", half=True)
def quantize_affine(b):
    """[input, block_size, scale, zero_point or None, output_dtype, quant_min, quant_max, out]."""
    qmin, qmax = DTYPE_BOUNDS[b.graph.values[b.out].dtype]
    qmin, qmax = b.scalar(5, qmin), b.scalar(6, qmax)
    coords = _block_coords(b, b.args[1])
    _quantize(b, qmin, qmax, [b.args[2]] + ([] if b.is_none(3) else [b.args[3]]), coords)


@op("torchao.dequantize_affine.default", half=True)
def dequantize_affine(b):
    """[input, block_size, scale, zero_point or None, input_dtype, quant_min, quant_max, output_dtype, out]."""
    coords = _block_coords(b, b.args[1])
    _dequantize(b, b.args[2], None if b.is_none(3) else b.args[3], coords)


# ---------------------------------------------------------------- choose_qparams

F32_EPS = 1.1920928955078125e-07  # torch.finfo(torch.float32).eps

# 4 blocks per workgroup, 64 threads each: min(min(x), 0) and max(max(x), 0) of the block, then its
# scale and zero point (qparams).
CHOOSE_QPARAMS = """
@group(0) @binding(0) var<storage, read> x: array<$X_TYPE>;
@group(0) @binding(1) var<storage, read_write> scale: array<$SCALE_TYPE>;
@group(0) @binding(2) var<storage, read_write> zpo: array<$ZP_TYPE>;
@group(0) @binding(3) var<uniform> p: P;
var<workgroup> rmin: array<f32, 256>;
var<workgroup> rmax: array<f32, 256>;
var<workgroup> zps: array<i32, 4>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = wid.x + wid.y * nwg.x;
    let lane = li % 64u;
    let slot = li / 64u;
    let blk = g * 4u + slot;
    var mn = 0.0;
    var mx = 0.0;
    if (blk < p.blocks) {
        let base = blk * p.block;
        for (var k = lane; k < p.block; k = k + 64u) {
            let v = f32(x[base + k]);
            mn = min(mn, v);
            mx = max(mx, v);
        }
    }
    rmin[li] = mn;
    rmax[li] = mx;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            rmin[li] = min(rmin[li], rmin[li + s]);
            rmax[li] = max(rmax[li], rmax[li + s]);
        }
        workgroupBarrier();
    }
    if (lane == 0u) {
        var zp = 0;
        if (blk < p.blocks) {
            let qp = qparams(rmin[li], rmax[li]);
            scale[blk] = $SCALE_TYPE(qp.x);
            zp = i32(qp.y);
            $ZP_STORE
        }
        zps[slot] = zp;
    }
    $ZP_PACK
}
"""
ZP_PACK = """workgroupBarrier();
    if (li == 0u) {
        zpo[g] = (u32(zps[0]) & 0xFFu) | ((u32(zps[1]) & 0xFFu) << 8u) | ((u32(zps[2]) & 0xFFu) << 16u)
               | ((u32(zps[3]) & 0xFFu) << 24u);
    }"""


def _choose_qparams(b, mode, qmin, qmax, eps, block_of, out_dims_of):
    """Record the kernel giving each block of x (args[0]) its scale and zero point (the two
    outputs, a ValueList): `block_of(dims)` elements a block, consecutive; `out_dims_of(dims,
    block)` the outputs' live shape. A packed int8 zero point is stored 4 blocks a word."""
    x = b.args[0]
    scale, zp = b.outputs(2)
    xt, st, zt = (b.graph.values[v] for v in (x, scale, zp))
    if not is_float(xt.dtype) or not is_float(st.dtype) or zt.dtype not in ("int32", "int64", "int8"):
        raise NotImplementedError(f"{b.name}: {[xt.dtype, st.dtype, zt.dtype]} tensors")
    zp_packed = zt.dtype in PACKED
    src = QP_STRUCT + DIV_RN + QPARAMS + fill(
        CHOOSE_QPARAMS,
        ZP_TYPE="u32" if zp_packed else "i32",
        X_TYPE=b.storage(x),
        SCALE_TYPE=b.storage(scale),
        ZP_STORE="" if zp_packed else "zpo[blk] = zp;",
        ZP_PACK=ZP_PACK if zp_packed else "",
    )
    params = b.params(QP_SIZE)
    d = b.dispatch(src, [x, scale, zp, params])

    def resize(ctx):
        dims = ctx.dims(x)
        block = block_of(dims)
        blocks = numel_of(dims) // block
        shape = out_dims_of(dims, block)
        ctx.set_params(params, qp_bytes(mode, qmin, qmax, eps, blocks, block))
        ctx.set_grid(d, fold_grid(-(-blocks // 4)))
        ctx.set_dims(scale, shape)
        ctx.set_dims(zp, shape)

    b.hook(resize)


@op("quantized_decomposed.choose_qparams.tensor", "quantized_decomposed::choose_qparams.Tensor_out", half=True)
def choose_qparams_tensor(b):
    """[input, quant_min, quant_max, eps, dtype, ValueList[scale [1], zero_point [1]]]."""
    mode, qmin, qmax, eps = MODES["ASYMMETRIC"], b.scalar(1), b.scalar(2), float(b.scalar(3))
    _choose_qparams(b, mode, qmin, qmax, eps, lambda dims: max(numel_of(dims), 1), lambda dims, block: (1,))


@op("quantized_decomposed.choose_qparams_per_token_asymmetric.default", "quantized_decomposed::choose_qparams_per_token_asymmetric.out", half=True)
def choose_qparams_per_token_asymmetric(b):
    """[input [..., K], dtype, ValueList[scales [..., 1], zero_points [..., 1]]]."""
    mode = MODES["PER_TOKEN_ASYMMETRIC"]
    _choose_qparams(b, mode, -128, 127, F32_EPS, lambda dims: max(dims[-1], 1), lambda dims, block: tuple(dims[:-1]) + (1,))


@op("torchao.choose_qparams_affine.default", half=True)
def choose_qparams_affine(b):
    """[input, mapping_type Str, block_size IntList, target_dtype (None), quant_min, quant_max,
    eps Double or None, scale_dtype, zero_point_dtype, keepdim, ValueList[scale, zero_point]]."""
    mode, qmin, qmax, eps, bsize = affine_args(b)
    scale = b.graph.values[b.outputs(2)[0]]
    if not is_float(scale.dtype):
        b.fail(f"scale dtype {scale.dtype}")
    out_rank = len(scale.dims)

    def block_of(dims):
        if dims[-1] % bsize:
            b.fail(f"input {tuple(dims)} does not split into blocks of {bsize}")
        return bsize

    def out_dims_of(dims, block):
        k = dims[-1]
        shape = tuple(dims[:-1]) + ((k // block,) if out_rank == len(dims) or k != block else ())
        if len(shape) != out_rank:
            b.fail(f"cannot shape {numel_of(dims) // block} blocks into rank {out_rank}")
        return shape

    _choose_qparams(b, mode, qmin, qmax, eps, block_of, out_dims_of)
