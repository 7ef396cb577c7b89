"""An 8da4w product's activations, quantized to int8 per row and dequantized again, in one
dispatch: what kernels/fusion.py makes of `torchao.choose_qparams_affine` (per row) and the
`et_vk.linear_dq8ca_q4gsw` products that quantize their input with its scales and zero points.
The products then read those rows as a 4-bit linear of float rows reads its input, and take the
4-bit linears' fused kernels (one q/k/v dispatch, SwiGLU as one, the residual in the epilogue).

- `pte_wgpu.quantized_rows` [x, mapping_type, block_size, target_dtype, quant_min, quant_max,
  eps, scale_dtype Str, zero_point_dtype Str, keepdim, out]: choose_qparams_affine's arguments,
  the dtypes being those its scales and zero points were stored as; out (f32, x's shape) holds
  each element of x as the product multiplied it: the row's scale and zero point by
  wgsl.py's `qparams` over the row's minimum and maximum (rounded to the scales' and zero
  points' storage as they were), then wgsl.py's XQ. Bitwise what the products computed. Where
  kernels/fusion.py's `_int8_rows` made out an int32 tensor [..., K + K / 4 + 2] (rows of a
  multiple of 16 that only 4-bit linears read), it holds those floats and the int8 values, scale
  and zero point of each row (wgsl.py's Int8Rows), which the subgroup kernels multiply as
  integers (kernels/matmul/q4_linear.py's sg_body). Where only products whose subgroup kernel
  takes a one-row pass read them (q4_linear.py's quantizes_one_row), a pass of one row runs no
  dispatch here: those kernels quantize the row themselves, bitwise as this kernel does.
- `pte_wgpu.rms_norm_quantized_rows` [x, .., keepdim, gamma, eps, out]: the same of
  et_vk.rms_norm(x, gamma, eps), its rows x * rstd * gamma rounded to x's storage type as the
  norm stored them; rstd from the same squares summed in another order (to rounding of the norm's).

A workgroup a row (the blocks must be whole rows, as the products' per-row scales are, of a
multiple of 4), which its invocations hold in registers, 4 elements a load: one read of the row,
two or three trees, one write. Where 128 invocations walked the row three times (the norm's sums,
the minimum and maximum, the values), one element a load: H200, Llama-3.2-1B shape 8da4w, greedy
bursts, two rounds in one call, 1 / 16 / 64 streams 605 / 3,059-3,068 / 7,612-7,672 -> 663-671 /
3,149-3,170 / 7,796-7,864 tokens/s (results/h200/kernel_choices/dq8_quantized_rows/registers/).
"""

from pte_wgpu.resize.shapes import fold_grid, numel_of

from ..matmul.q4_linear import quantizes_one_row
from ..registry import op
from ..wgsl import DIV_RN, QP_SIZE, QP_STRUCT, QPARAMS, XQ, Int8Rows, affine_args, fill, int8_rows_dim, is_float, qp_bytes, stored_zero_point, vec4_loader, vec4_type, wgsl_type

WG = 256  # invocations a row

QUANTIZED_ROWS = """
@group(0) @binding(0) var<storage, read> x: array<$X4>;
@group(0) @binding(1) var<storage, read_write> out: array<$OUT>;
@group(0) @binding(2) var<uniform> p: P;
$GAMMA
var<workgroup> lo: array<f32, $WG>;
var<workgroup> hi: array<f32, $WG>;

@compute @workgroup_size($WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.blocks) { return; }
    let quads = p.block / 4u;
    let base = row * quads;
    var v: array<vec4<f32>, $HELD>;  // quads lid, lid + WG, ..; zeros past the row
    for (var i = 0u; i < ${HELD}u; i = i + 1u) {
        let j = lid + i * ${WG}u;
        if (j < quads) { v[i] = x4(base + j); }
    }
$NORM
    var mn = vec4<f32>(0.0);
    var mx = vec4<f32>(0.0);
    for (var i = 0u; i < ${HELD}u; i = i + 1u) { mn = min(mn, v[i]); mx = max(mx, v[i]); }
    lo[lid] = min(min(mn.x, mn.y), min(mn.z, mn.w));
    hi[lid] = max(max(mx.x, mx.y), max(mx.z, mx.w));
    workgroupBarrier();
    for (var s = ${HALF}u; s > 0u; s = s >> 1u) {
        if (lid < s) { lo[lid] = min(lo[lid], lo[lid + s]); hi[lid] = max(hi[lid], hi[lid + s]); }
        workgroupBarrier();
    }
    let qp = qparams(lo[0], hi[0]);
    let s = f32($SCALE_TYPE(qp.x));
    let zp = $ZP;
    let inv = div_rn(1.0, s);
$STORE
}
"""
# the norm: rstd from the row's squares (lo holds the invocations' sums, read before it is reused),
# then each element x * rstd * gamma as the norm stored it
NORM = """
    var q = 0.0;
    for (var i = 0u; i < ${HELD}u; i = i + 1u) { q = q + dot(v[i], v[i]); }
    lo[lid] = q;
    workgroupBarrier();
    for (var s = ${HALF}u; s > 0u; s = s >> 1u) {
        if (lid < s) { lo[lid] = lo[lid] + lo[lid + s]; }
        workgroupBarrier();
    }
    let rstd = inverseSqrt(lo[0] / f32(p.block) + p.norm_eps);
    workgroupBarrier();
    for (var i = 0u; i < ${HELD}u; i = i + 1u) {
        let j = lid + i * ${WG}u;
        if (j < quads) { v[i] = vec4<f32>(vec4<$X_TYPE>(v[i] * rstd * gamma4(j))); }
    }
"""

# The rows as the products multiplied them (f32, x's shape), each element by wgsl.py's XQ
FLOAT_ROWS = """    for (var i = 0u; i < ${HELD}u; i = i + 1u) {
        let j = lid + i * ${WG}u;
        let e = v[i];
        if (j < quads) { out[base + j] = vec4<f32>(xq(e.x, inv, zp, s), xq(e.y, inv, zp, s), xq(e.z, inv, zp, s), xq(e.w, inv, zp, s)); }
    }"""
# ... or as kernels/wgsl.py's Int8Rows: the floats as above (their bits), and each quad's int8
# values packed into workgroup memory, from where every 4 quads (16 values) leave as 4 words (of
# each 8 values, the even ones, then the odd ones); then the row's scale and zero point
INT8_ROWS = """    for (var i = 0u; i < ${HELD}u; i = i + 1u) {
        let j = lid + i * ${WG}u;
        if (j < quads) {
            let c = clamp(round(v[i] * inv) + zp, vec4<f32>(-128.0), vec4<f32>(127.0));  // xq's, a quad at a time
            out[base + j] = bitcast<vec4<u32>>((c - zp) * s);
            packed[j] = pack4xI8(vec4<i32>(c));
        }
    }
    workgroupBarrier();
    for (var t = lid; t < quads / 4u; t = t + ${WG}u) {
        let a = unpack4xI8(packed[4u * t]);
        let b = unpack4xI8(packed[4u * t + 1u]);
        let c = unpack4xI8(packed[4u * t + 2u]);
        let d = unpack4xI8(packed[4u * t + 3u]);
        out[(${WORDS}u + base) / 4u + t] = vec4<u32>(pack4xI8(vec4<i32>(a.xz, b.xz)), pack4xI8(vec4<i32>(a.yw, b.yw)),
                                                    pack4xI8(vec4<i32>(c.xz, d.xz)), pack4xI8(vec4<i32>(c.yw, d.yw)));
    }
    if (lid == 0u) {
        out[(${SCALES}u + row) / 4u][(${SCALES}u + row) % 4u] = bitcast<u32>(s);
        out[(${ZPS}u + row) / 4u][(${ZPS}u + row) % 4u] = bitcast<u32>(i32(zp));
    }"""


@op("pte_wgpu.quantized_rows", "pte_wgpu.rms_norm_quantized_rows", half=True)
def quantized_rows(b):
    norm = b.name == "pte_wgpu.rms_norm_quantized_rows"
    mode, qmin, qmax, eps, _ = affine_args(b)
    x, out = b.args[0], b.out
    scale_dtype, zp_dtype = b.scalar(7), b.scalar(8)
    if not is_float(scale_dtype) or zp_dtype not in ("int8", "int32"):
        b.fail(f"scales stored as {scale_dtype} and zero points as {zp_dtype}: expected floats and int8 or int32")
    block = b.graph.values[b.args[2]].items[-1]
    out_t = b.graph.values[out]
    int8 = out_t.dtype == "int32"  # wgsl.py's Int8Rows, else floats
    if out_t.dtype not in ("float32", "int32"):
        b.fail(f"output dtype {out_t.dtype}, expected float32 (the rows) or int32 (their int8 words)")
    if block % (16 if int8 else 4):
        b.fail(f"rows of {block}: the kernel reads them 4 elements at a time (a multiple of 4; of 16 for int8 rows)")
    x_type = b.storage(x, packed=False)
    zp = stored_zero_point(zp_dtype)  # as the products read it back
    held = -(-block // (4 * WG))
    norm_wgsl = fill(NORM, HELD=held, WG=WG, HALF=WG // 2, X_TYPE=x_type) if norm else ""
    gamma = ""
    if norm:
        g_type = b.storage(b.args[10], packed=False)
        gamma = f"@group(0) @binding(3) var<storage, read> gamma: array<{vec4_type(g_type)}>;\n" + vec4_loader("gamma", g_type)
    if int8:
        values, scales, zps = Int8Rows(block, numel_of(out_t.dims[:-1])).offsets()
        store = fill(INT8_ROWS, HELD=held, WG=WG, WORDS=values, SCALES=scales, ZPS=zps)
    else:
        store = fill(FLOAT_ROWS, HELD=held, WG=WG)
    packed = f"var<workgroup> packed: array<u32, {held * WG}>;  // the row's int8 values, a quad a word\n" if int8 else ""
    body = fill(QUANTIZED_ROWS, X4=vec4_type(x_type), OUT="vec4<u32>" if int8 else "vec4<f32>", GAMMA=gamma + packed, NORM=norm_wgsl, HELD=held,
                SCALE_TYPE=wgsl_type(scale_dtype), ZP=zp, WG=WG, HALF=WG // 2, STORE=store)
    src = QP_STRUCT + DIV_RN + QPARAMS + XQ + vec4_loader("x", x_type) + body
    params = b.params(QP_SIZE)
    d = b.dispatch(src, [x, out, params] + ([b.args[10]] if norm else []))
    norm_eps = float(b.scalar(11, 1e-6)) if norm else 0.0
    readers = [(name, args) for name, args in b.graph.calls if out in args[:-1]]
    alone = int8 and not norm and readers and all(args[0] == out and quantizes_one_row(b.part(name, args)) for name, args in readers)

    def resize(ctx):
        dims = ctx.dims(x)
        if not dims or dims[-1] != block:
            b.fail(f"input {tuple(dims)} is not rows of {block}, the quantization's blocks")
        if norm and ctx.numel(b.args[10]) != block:
            b.fail(f"norm weight of {ctx.numel(b.args[10])} elements for rows of {block}")
        rows = numel_of(dims[:-1])
        ctx.set_params(params, qp_bytes(mode, qmin, qmax, eps, rows, block, norm_eps))
        ctx.set_grid(d, (0, 0, 0) if alone and rows == 1 else fold_grid(rows))  # `alone`: its readers quantize one row
        ctx.set_dims(out, tuple(dims[:-1]) + ((int8_rows_dim(block),) if int8 else (block,)))

    b.hook(resize)
