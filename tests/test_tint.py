"""Every kernel these models compile on wgpu-native (naga) also compiles through Dawn's WGSL
compiler, Tint, with the directives the runtime adds under Dawn (async_runtime/backend.py):
tiny Llamas in fp32, 4-bit (also in fp16) and 8-bit-activation forms, with GPU and CPU kernel variants and
the GPU sampler, a small CNN, int8 convolutions and linears; the kernels of f32 models on a device without shader-f16, as
Dawn's on NVIDIA. Dawn's Null backend compiles without a GPU; pipelines are not created, since
its limits (8 storage buffers a stage, 16 KB of workgroup memory) are not a GPU's.

The subgroup-matrix kernels (Dawn's on NVIDIA GPUs only) are compiled from their generators:
the 8da4w products' (on int8 matrices, and on f16 ones), the int8 convolutions' and linears', the
f16 products' GEMM tile.

Tint is stricter than naga: it wants `enable subgroups;` and refuses subgroup operations it cannot
prove subgroup-uniform, a shift mixed with a product without parentheses, and infinite constants."""

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from async_runtime import pipelines
from pte_wgpu.kernels.attention import gated_delta, rope, short_conv
from pte_wgpu.kernels.matmul import gemm, int8_matrix, linear, q4_fused_linear, q4_linear
from pte_wgpu.kernels.matmul.q4_linear import Storage, matrix_heads, quantize_head
from pte_wgpu.kernels.matmul.routes import FLOAT_SG_GPU_WIDE, Q4_SG_GPU_NARROW_SPLIT, Q4_SG_GPU_WIDE, Q4_SG_GPU_WIDE_SPLIT
from pte_wgpu.kernels.quant import int8_conv, per_channel_linear

from .llama import export_llama
from .test_llama import CONFIGS, CONTEXT
from .test_llm_families import CONTEXT as FAMILY_CONTEXT
from .test_llm_families import FAMILIES, TINY
from .test_q4_fusion import LLAMA
from .test_encoder_attention import mha_export
from .test_int8_conv import _tiled_convs
from .test_more_ops import _wide_linears
from .test_vision_ops import _cnn

pytestmark = [
    pytest.mark.usefixtures("adapter"),
    pytest.mark.skipif(importlib.util.find_spec("wgpudawn") is None, reason="needs wgpudawn (the test extra)"),
]

COMPILE_UNDER_DAWN = """
import json, sys
from async_runtime import pipelines
import wgpu
adapter = wgpu.gpu.request_adapter_sync()
assert adapter.info["backend_type"] == "Null", adapter.summary
wanted = ("subgroups", "chromium-experimental-subgroup-matrix")
half = adapter.request_device_sync(required_features=[f for f in ("shader-f16", *wanted) if f in adapter.features])
single = wgpu.gpu.request_adapter_sync().request_device_sync(required_features=[f for f in wanted if f in adapter.features])
failures = {}
for src, (where, precision) in json.load(sys.stdin).items():
    try:
        pipelines.shader_module(half if precision == "f16" else single, pipelines.wgsl_for_device(src))
    except Exception as e:
        failures[where] = str(e)[:2000]
print(json.dumps(failures))
"""


# the int8 subgroup-matrix route's variants: (zero points packed, bias, residual, storage types)
MATRIX_VARIANTS = [(False, False, False, Storage()), (True, True, False, Storage()), (True, True, True, Storage()),
                   (True, True, False, Storage("f16", "f16", "f16", "f16", "f16"))]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_every_kernel_compiles_under_tint(tmp_path_factory, load_pte, monkeypatch):
    sources, where = {}, ["", "f32"]  # source: (model and variant, its precision)
    prepared = pipelines.wgsl_for_device

    def recording(src):
        sources.setdefault(src, tuple(where))
        return prepared(src)

    monkeypatch.setattr(pipelines, "wgsl_for_device", recording)
    configs = {**CONFIGS, **LLAMA}  # fp32, 4w, 8da4w, and 4w in fp16
    models = {name: export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, **config)[0] for name, config in configs.items()}
    models["cnn"], models["int8 convolutions"], models["int8 linears"] = _cnn()[0], _tiled_convs()[0], _wide_linears()[0]
    models["encoder attention"] = mha_export()[0]
    # Qwen2.5's biased q/k/v groups with the rotate-half RoPE in them, Qwen3's q and k norms with it
    for family, qmode in (("qwen2_5", None), ("qwen2_5", "4w"), ("qwen3", "4w")):
        models[f"{family} {qmode or 'fp32'}"] = export_llama(tmp_path_factory.mktemp("llama"), max_len=FAMILY_CONTEXT, qmode=qmode,
                                                             model_args=tuple(FAMILIES[family].items()), **TINY)[0]
    for name, pte in models.items():
        for kernels in ("gpu", "cpu"):
            monkeypatch.setenv("PTE_WGPU_KERNELS", kernels)
            where[:] = f"{name}, {kernels} kernels", "f16" if name == "4w_fp16" else "f32"
            model = await load_pte(pte)
            assert model.precision == where[1]
    assert any("subgroupAdd" in s for s in sources) and any("neg_inf" in s for s in sources)
    assert any("let c0 = 2u * (i % np);" in s for s in sources) and any("finished[i] = " in s for s in sources)  # the pair reduces
    for zp_packed, has_bias, residual, types in MATRIX_VARIANTS:  # the device's int8 matrices: Dawn's on GPUs only
        quantize, product = matrix_heads(zp_packed, has_bias, types, residual)
        where = f"int8 matrices {zp_packed, has_bias, residual, types}"
        # ... and where the device has f16 matrices, the prompts' route on those: the rows as halves of q - zp, the
        # weights a word at a time (f32 scales too), the row's scale in the epilogue and split-K's reduce
        sources[int8_matrix.quantize_shader(quantize_head(zp_packed, types, "vec2<u32>"), halves=True)] = (where + ", halves", types.x)
        load = q4_linear.q4_load(False, False, 32, 256, replace(types, x="f16"), f32_scale_words=True)
        uniform = f"{q4_linear.LIN_STRUCT};\n@group(0) @binding({6 + has_bias}) var<uniform> q: Q;\n"
        scale = f"@group(0) @binding({7 + has_bias}) var<storage, read> row_scale: array<{types.xs}>;\n"
        epilogue = {"bias": types.bias, "out": types.out, "residual": residual, "row_scale": types.xs}
        sources[gemm.gemm_shader(load, has_bias, uniform + scale, tile=gemm.MATRIX_TILE, **epilogue)] = (where + ", on f16 matrices", "f16")
        reduce_scale = scale.replace(f"binding({7 + has_bias})", f"binding({3 + has_bias})")
        sources[gemm.gemm_reduce_shader(has_bias, extra=reduce_scale, **epilogue)] = (where + ", f16 matrices' reduce", types.x)
        sources[int8_matrix.quantize_shader(quantize)] = (where + ", quantize", types.x)  # x's storage: the precision
        sources[int8_matrix.matrix_shader(product, 6 + has_bias)] = (where, types.x)
    for matrices in (False, True):  # the int8 convolutions' and linears' products on int8 matrices too
        for kernel, stride, padding in (((3, 3), (2, 1), (1, 0)), ((1, 1), (1, 1), (0, 0))):
            finishing = int8_conv.epilogue("float32", True, "relu", 4)
            sources[int8_conv.product_shader(kernel, stride, padding, (1, 2), finishing, matrices)] = (f"int8 convolution {kernel}, matrices {matrices}", "f32")
        for x_dtype, x_byte in (("int8", per_channel_linear.Q8TA_X), ("float32", per_channel_linear.Q8CSW_X)):
            sources[per_channel_linear.product_shader(x_dtype, x_byte, matrices)] = (f"int8 linear, {x_dtype} x, matrices {matrices}", "f32")
    for bias, ns in ((False, (512,)), (True, (512,)), (False, (256, 64, 64)), (False, (256, 128, 64))):  # f16 products on f16 matrices: Dawn's on NVIDIA GPUs only
        load, store = (gemm.weight_load("f16", "f16", 256), None) if len(ns) == 1 else gemm.column_group("f16", ["f16"] * len(ns), ns, 256)
        outs = "".join(f"@group(0) @binding({len(load.inputs) + 3 + j}) var<storage, read_write> out{j}: array<f16>;\n" for j in range(1, len(ns)))
        for tile in (gemm.MATRIX_TILE, gemm.DECODE_MATRIX_TILE):
            sources[gemm.gemm_shader(load, bias, outs, tile=tile, bias="f16", out="f16", store=store)] = (f"f16 matrices {tile.matrix}, bias {bias}, columns {ns}", "f16")
    half = Storage("f16", "f16", "f16", "f16", "f16")  # ... and 4-bit weights of f16 rows, rounded to halves there (groups of 32: a column's K step a read)
    q4_tiles = (gemm.MATRIX_TILE, gemm.DECODE_MATRIX_TILE, gemm.SHORT_DECODE_MATRIX_TILE, gemm.TINY_DECODE_MATRIX_TILE, gemm.WIDE_TINY_DECODE_MATRIX_TILE)
    for (bias, group), tile in itertools.product(((False, 32), (True, 24)), q4_tiles):
        uniform = f"{q4_linear.LIN_STRUCT};\n@group(0) @binding({6 + bias}) var<uniform> q: Q;\n"
        load = q4_linear.q4_load(False, False, group, 256, half)
        sources[gemm.gemm_shader(load, bias, uniform, tile=tile, bias="f16", out="f16")] = (f"4-bit f16 matrices {tile.matrix}, bias {bias}, group {group}", "f16")
    for ns, tile in itertools.product(((256, 128, 128), (256, 64, 64)), q4_tiles):  # the fused products' columns, a K loop a weight or one picking per column
        load, struct = q4_fused_linear.columns_load(ns, 256, 32, {"x": "f16", "scales": ["f16"] * len(ns)})
        first = len(load.inputs) + 3
        outs = f"{struct}@group(0) @binding({first}) var<uniform> q: Q;\n"
        outs += "".join(f"@group(0) @binding({first + j}) var<storage, read_write> out{j}: array<f16>;\n" for j in range(1, len(ns)))
        shader = gemm.gemm_shader(load, False, outs, tile=tile, out="f16", store=gemm.column_store(ns))
        sources[shader] = (f"4-bit f16 matrices {tile.matrix}, columns {ns}", "f16")
    for group in (1, 24):  # ... and the widening of 4-bit weights to f16 for them (a group a word or not)
        source = q4_linear.q4_load(False, False, group, 96, Storage("f16", "f16", "f16", "f16", "f16")).b_source
        sources[gemm.widen_shader(source, halves=True)] = (f"4-bit weights widened to f16, group {group}", "f16")
    for storage in ("f32", "f16"):  # a short convolution's state in a ragged pass (LFM2's, Qwen3.5's: no tiny Llama has one)
        aliases = "".join(f"alias {name} = {storage};\n" for name in ("XT", "ST", "WT", "BT", "OT"))
        for bias, taps in ((False, 4), (True, 4), (False, 3)):
            sources[aliases + short_conv.short_conv_kernel(bias, 3, taps)] = (f"ragged short convolution, {storage}, bias {bias}, {taps} taps", storage)
        sources[aliases + short_conv.STATE_UPDATE] = (f"ragged state update, {storage}", storage)
    for channelwise in (False, True):  # Qwen3.5's gated delta rule, alone and in a ragged pass
        sources[gated_delta.rule_shader(gated_delta.SHADER, 16, 24, channelwise, "s0", "s1")] = (f"gated delta rule, channelwise {channelwise}", "f32")
        for gathered in (False, True):
            shader = gated_delta.rule_shader(gated_delta.ragged_shader(gathered), 16, 24, channelwise, "first_state" if gathered else "pool", "pool")
            sources[shader] = (f"ragged gated delta rule, channelwise {channelwise}, gathered {gathered}", "f32")
    sources[gated_delta.GATHER] = ("ragged gated delta rule's gather", "f32")
    for shape in FLOAT_SG_GPU_WIDE:  # float products of long rows (K >= 2,048: no tiny model has them)
        for weights in ("f32", "f16"):
            types = linear.Storage(weights, weights, "f32", weights)
            sources[linear.gemv_sg_shader(False, linear.wide_sg_shape(shape, weights == "f16"), types)] = (f"subgroup kernel {shape}, {weights}", weights)
    for shape in Q4_SG_GPU_WIDE + Q4_SG_GPU_WIDE_SPLIT + Q4_SG_GPU_NARROW_SPLIT:  # 4-bit products of long rows, plain and fused with a norm (no tiny model has them)
        sources[q4_linear.sg_shader(False, False, False, shape, Storage(), False, 32)] = (f"4-bit subgroup kernel {shape}", "f32")
        types = {"x": "f32", "scales": ["f32"] * 3, "gamma": "f32", "outs": ["f32"] * 3, "rows": "f32", "gate": "f32", "up": "f32"}
        for count, swiglu in ((3, False), (2, True)):
            shader = q4_fused_linear._shader(q4_fused_linear.SUBGROUP, shape, count, swiglu, True, types, 32)
            sources[shader] = (f"fused 4-bit subgroup kernel {shape}, {count} weights, SwiGLU {swiglu}", "f32")
    aliases = "".join(f"alias {name} = f32;\n" for name in ("XQT", "XKT", "CT", "ST", "OQT", "OKT", "VT", "KCT", "VCT"))
    for paired, shaders in rope.SHADERS_HF.items():  # the rotate-half RoPE (no tiny Llama has one)
        for into_cache, shader in enumerate(shaders):
            sources[aliases + shader] = (f"rotate-half RoPE, into the caches {bool(into_cache)}, paired rows {paired}", "f32")
    added = linear.Storage(added="f32")  # a residual after a bias, every GEMV (ViT's, BERT's: no tiny Llama has one)
    for shader in (linear.gemv_shader(True, True, types=added), linear.gemv_sg_shader(True, linear.SG_GPU, added), linear.gemv_t4_shader(True, added)):
        sources[shader] = ("a GEMV adding a residual after its bias", "f32")
    env = dict(os.environ, PTE_WGPU_BACKEND="dawn", WGPU_BACKEND_TYPE="Null")
    done = subprocess.run([sys.executable, "-c", COMPILE_UNDER_DAWN], input=json.dumps(sources), env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failures, "\n\n".join(f"{where}:\n{error}" for where, error in list(failures.items())[:3])
    assert len(sources) > 100
