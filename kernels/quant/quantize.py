"""Quantize, dequantize and choose_qparams: `quantized_decomposed` (per tensor, per channel, per
token) and torchao's `quantize_affine` / `dequantize_affine`.

The arithmetic is the reference decomposition's, in f32: quantize is
clamp(round(x * (1 / scale)) + zp, qmin, qmax) (per token: round(x * (1 / scale) + zp)), and
dequantize is (q - zp) * scale. A scale given as a number is inverted on the host in double, as
torch does with a Python scale; a scale tensor is inverted on the GPU with `div_rn`, correctly
rounded like torch's f32 division. Eager per-token ops compute in float64 (their scales are
double); here, as in ExecuTorch's Vulkan runtime, every float is f32. float16 inputs, scales and
outputs are stored as f16 and converted at the load and the store.
"""

import struct

from pte_wgpu.resize.shapes import fold_grid, normalize_dim, numel_of

from ..registry import op
from ..wgsl import DIV_RN, is_float, wgsl_type
from .int8_elementwise import QUANT_FNS, add_word_map, inv

QUANTIZE_TENSOR_QPARAMS = """
fn value(i: u32) -> i32 {
    let j = param_index(i);
    return quantize(in0_at(i), div_rn(1.0, q0_at(j)), ZP, p.k.x, p.k.y);
}
"""
QUANTIZE_SCALAR_QPARAMS = """
fn value(i: u32) -> i32 { return quantize(in0_at(i), p.f.x, p.k.z, p.k.x, p.k.y); }
"""
DEQUANTIZE_TENSOR_QPARAMS = """
fn value(i: u32) -> f32 { let j = param_index(i); return dequantize(i32(in0_at(i)), q0_at(j), ZP); }
"""
DEQUANTIZE_SCALAR_QPARAMS = """
fn value(i: u32) -> f32 { return dequantize(i32(in0_at(i)), p.f.x, p.k.z); }
"""


def _quantize(b, qmin, qmax, qparams, coords_of=None, body=QUANTIZE_TENSOR_QPARAMS):
    """quantize args[0] with tensor `qparams` [scales] or [scales, zero points], or with the
    scalar args 1 and 2."""
    if not is_float(b.graph.values[b.args[0]].dtype):
        raise ValueError(f"{b.name}: input dtype {b.graph.values[b.args[0]].dtype}")
    if qparams:
        body = body.replace("ZP", "i32(q1_at(j))" if len(qparams) == 2 else "0")
        add_word_map(b, [b.args[0]], QUANT_FNS + DIV_RN + body, lambda ctx: ((0.0,) * 4, (qmin, qmax, 0, 0)), qparams, coords_of)
    else:
        scale, zp = b.scalar(1), b.scalar(2, 0)
        consts = ((inv(scale), 0.0, 0.0, 0.0), (qmin, qmax, zp, 0))
        add_word_map(b, [b.args[0]], QUANT_FNS + QUANTIZE_SCALAR_QPARAMS, lambda ctx: consts)


def _dequantize(b, scales, zps, coords_of=None):
    """dequantize with tensor scales (and zero points, or None for 0)."""
    body = DEQUANTIZE_TENSOR_QPARAMS.replace("ZP", "0" if zps is None else "i32(q1_at(j))")
    qparams = [scales] + ([] if zps is None else [zps])
    add_word_map(b, [b.args[0]], QUANT_FNS + body, lambda ctx: ((0.0,) * 4, (0,) * 4), qparams, coords_of)


@op("quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.quantize_per_tensor.tensor", half=True)
def quantize_per_tensor(b):
    """[input, scale, zero_point, qmin, qmax, dtype, out]."""
    _quantize(b, b.scalar(3), b.scalar(4), [b.args[1], b.args[2]] if b.is_tensor(1) else [])


@op("quantized_decomposed.dequantize_per_tensor.default", "quantized_decomposed.dequantize_per_tensor.tensor", half=True)
def dequantize_per_tensor(b):
    """[input, scale, zero_point, qmin, qmax, dtype, out_dtype, out]."""
    if b.is_tensor(1):
        _dequantize(b, b.args[1], b.args[2])
    else:
        consts = ((float(b.scalar(1)), 0.0, 0.0, 0.0), (0, 0, b.scalar(2, 0), 0))
        add_word_map(b, [b.args[0]], QUANT_FNS + DEQUANTIZE_SCALAR_QPARAMS, lambda ctx: consts)


def _channel_coords(b, axis):
    def coords(ctx, dims):
        a = normalize_dim(axis, len(dims))
        return numel_of(dims[a + 1 :]), dims[a]

    return coords


@op("quantized_decomposed.quantize_per_channel.default", half=True)
def quantize_per_channel(b):
    """[input, scales [C], zero_points [C], axis, qmin, qmax, dtype, out]."""
    _quantize(b, b.scalar(4), b.scalar(5), [b.args[1], b.args[2]], _channel_coords(b, b.scalar(3)))


@op("quantized_decomposed.dequantize_per_channel.default", half=True)
def dequantize_per_channel(b):
    """[input, scales [C], zero_points [C] or None, axis, qmin, qmax, dtype, out_dtype, out]."""
    _dequantize(b, b.args[1], None if b.is_none(2) else b.args[2], _channel_coords(b, b.scalar(3)))


def _token_coords(ctx, dims):
    return dims[-1], numel_of(dims[:-1])


@op("quantized_decomposed.quantize_per_token.default", half=True)
def quantize_per_token(b):
    """[input [..., K], scales [..., 1], zero_points [..., 1], qmin, qmax, dtype, out]."""
    body = """
fn value(i: u32) -> i32 {
    let j = param_index(i);
    let q = round(in0_at(i) * div_rn(1.0, q0_at(j)) + f32(ZP));
    return i32(clamp(q, f32(p.k.x), f32(p.k.y)));
}
"""
    _quantize(b, b.scalar(3), b.scalar(4), [b.args[1], b.args[2]], _token_coords, body)


@op("quantized_decomposed.dequantize_per_token.default", half=True)
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

# One workgroup per row: min(min(x), 0) and max(max(x), 0), then the row's scale and zero point,
# with torch's f32 arithmetic (mode 0: determine_qparams' per-tensor affine; mode 1: the
# XNNPACK-style per-token asymmetric rule of choose_qparams_per_token_asymmetric).
CHOOSE_QPARAMS = """
struct P { rows: u32, row: u32, mode: u32, pad: u32, qmin: f32, qmax: f32, eps: f32, pad2: f32 }
@group(0) @binding(0) var<storage, read> x: array<TX>;
@group(0) @binding(1) var<storage, read_write> scale: array<TS>;
@group(0) @binding(2) var<storage, read_write> zero_point: array<i32>;
@group(0) @binding(3) var<uniform> p: P;
var<workgroup> lo: array<f32, 64>;
var<workgroup> hi: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * nwg.x;
    if (r >= p.rows) { return; }
    var mn = 0.0;
    var mx = 0.0;
    for (var k = li; k < p.row; k = k + 64u) {
        let v = f32(x[r * p.row + k]);
        mn = min(mn, v);
        mx = max(mx, v);
    }
    lo[li] = mn;
    hi[li] = mx;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (li < s) {
            lo[li] = min(lo[li], lo[li + s]);
            hi[li] = max(hi[li], hi[li + s]);
        }
        workgroupBarrier();
    }
    if (li != 0u) { return; }
    let sc = max(div_rn(hi[0] - lo[0], p.qmax - p.qmin), p.eps);
    var zp = 0.0;
    if (p.mode == 0u) {
        zp = clamp(p.qmin - round(div_rn(lo[0], sc)), p.qmin, p.qmax);
    } else {
        let dmin = div_rn(lo[0], sc);
        let dmax = div_rn(hi[0], sc);
        zp = round(clamp(select(p.qmax - dmax, p.qmin - dmin, (p.qmin + dmin) + (p.qmax + dmax) > 0.0), p.qmin, p.qmax));
    }
    scale[r] = TS(sc);
    zero_point[r] = i32(zp);
}
"""
F32_EPS = 1.1920928955078125e-07  # torch.finfo(torch.float32).eps


def _choose_qparams(b, mode, qmin, qmax, eps, per_row):
    x = b.args[0]
    scale, zp = b.value(len(b.args) - 1).items
    tx, ts, tz = (wgsl_type(b.graph.values[v].dtype) for v in (x, scale, zp))
    if not is_float(b.graph.values[x].dtype) or ts not in ("f32", "f16") or tz != "i32":
        raise NotImplementedError(f"{b.name}: {[b.graph.values[v].dtype for v in (x, scale, zp)]} tensors")
    params = b.params(32)
    d = b.dispatch(DIV_RN + CHOOSE_QPARAMS.replace("TX", tx).replace("TS", ts), [x, scale, zp, params])

    def resize(ctx):
        dims = ctx.dims(x)
        row = dims[-1] if per_row else numel_of(dims)
        rows = numel_of(dims) // row
        ctx.set_params(params, struct.pack("<IIIIffff", rows, row, mode, 0, qmin, qmax, eps, 0.0))
        ctx.set_grid(d, fold_grid(rows))
        shape = tuple(dims[:-1]) + (1,) if per_row else (1,)
        ctx.set_dims(scale, shape)
        ctx.set_dims(zp, shape)

    b.hook(resize)


@op("quantized_decomposed.choose_qparams.tensor", half=True)
def choose_qparams_tensor(b):
    """[input, quant_min, quant_max, eps, dtype, ValueList[scale [1], zero_point [1]]]."""
    _choose_qparams(b, 0, b.scalar(1), b.scalar(2), float(b.scalar(3)), per_row=False)


@op("quantized_decomposed.choose_qparams_per_token_asymmetric.default", half=True)
def choose_qparams_per_token_asymmetric(b):
    """[input [..., K], dtype, ValueList[scales [..., 1], zero_points [..., 1]]]."""
    _choose_qparams(b, 1, -128, 127, F32_EPS, per_row=True)
