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
  integers (kernels/matmul/q4_linear.py's sg_body). Where only products that quantize a pass's
  rows themselves read them (q4_linear.py's quantizing_rows: one row, or a few on the GPUs'
  subgroup kernels), such a pass runs no dispatch here: those kernels quantize the rows
  themselves, bitwise as this kernel does.
- `pte_wgpu.rms_norm_quantized_rows` [x, .., keepdim, gamma, eps, out]: the same of
  et_vk.rms_norm(x, gamma, eps), its rows x * rstd * gamma rounded to x's storage type as the
  norm stored them; rstd from the same squares summed in another order (to rounding of the norm's).
  Where the 4-bit product writing x takes a one-row pass on its GEMV (q4_linear.py's
  normalized_row), a pass of one row runs no dispatch here: that GEMV's last workgroup runs this
  kernel's function (wgsl.py's QUANTIZE_ROW) on the row, the same sums in the same order.

A workgroup a row (the blocks must be whole rows, as the products' per-row scales are, of a
multiple of 4), which its invocations hold in registers, 4 elements a load: one read of the row,
two or three trees, one write. Where 128 invocations walked the row three times (the norm's sums,
the minimum and maximum, the values), one element a load: H200, Llama-3.2-1B shape 8da4w, greedy
bursts, two rounds in one call, 1 / 16 / 64 streams 605 / 3,059-3,068 / 7,612-7,672 -> 663-671 /
3,149-3,170 / 7,796-7,864 tokens/s (results/h200/kernel_choices/dq8_quantized_rows/registers/).
"""

from pte_wgpu.resize.shapes import fold_grid, numel_of

from ..matmul.q4_linear import normalized_by_writer, quantizing_rows
from ..registry import op
from ..wgsl import DIV_RN, QP_SIZE, QP_STRUCT, QPARAMS, ROW_INVOCATIONS, XQ, RowQuantizer, affine_args, fill, int8_rows_dim, is_float, qp_bytes, stored_zero_point, vec4_loader, vec4_type, wgsl_type

QUANTIZED_ROWS = """
@group(0) @binding(0) var<storage, read> x: array<$X4>;
@group(0) @binding(1) var<storage, read_write> out: array<$OUT>;
@group(0) @binding(2) var<uniform> p: P;
$GAMMA
@compute @workgroup_size($WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.blocks) { return; }
    quantize_row(row, lid);
}
"""


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
    gamma = ""
    if norm:
        g_type = b.storage(b.args[10], packed=False)
        gamma = f"@group(0) @binding(3) var<storage, read> gamma: array<{vec4_type(g_type)}>;\n" + vec4_loader("gamma", g_type)
    rows = numel_of(out_t.dims[:-1]) if int8 else 0
    quantizer = RowQuantizer(block, x_type, wgsl_type(scale_dtype), zp, norm, rows)
    body = fill(QUANTIZED_ROWS, X4=vec4_type(x_type), OUT="vec4<u32>" if int8 else "vec4<f32>", GAMMA=gamma, WG=ROW_INVOCATIONS)
    src = QP_STRUCT + DIV_RN + QPARAMS + XQ + vec4_loader("x", x_type) + quantizer.wgsl() + body
    params = b.params(QP_SIZE)
    d = b.dispatch(src, [x, out, params] + ([b.args[10]] if norm else []))
    norm_eps = float(b.scalar(11, 1e-6)) if norm else 0.0
    elsewhere = 0  # up to this many rows, another kernel does this one's work
    if norm and int8:  # one row: the product before it normalizes and quantizes the row
        elsewhere = int(normalized_by_writer(b))
    elif int8:  # the products after it quantize the rows as they read them
        readers = [(name, args) for name, args in b.graph.calls if out in args[:-1]]
        if readers and all(args[0] == out for _, args in readers):
            elsewhere = min(quantizing_rows(b.part(name, args)) for name, args in readers)

    def resize(ctx):
        dims = ctx.dims(x)
        if not dims or dims[-1] != block:
            b.fail(f"input {tuple(dims)} is not rows of {block}, the quantization's blocks")
        if norm and ctx.numel(b.args[10]) != block:
            b.fail(f"norm weight of {ctx.numel(b.args[10])} elements for rows of {block}")
        rows = numel_of(dims[:-1])
        ctx.set_params(params, qp_bytes(mode, qmin, qmax, eps, rows, block, norm_eps))
        ctx.set_grid(d, (0, 0, 0) if rows <= elsewhere else fold_grid(rows))
        ctx.set_dims(out, tuple(dims[:-1]) + ((int8_rows_dim(block),) if int8 else (block,)))

    b.hook(resize)
