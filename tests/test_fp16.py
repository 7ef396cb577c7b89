"""Half-precision exports against torch eager, with f16 storage and with the f32 fallback.

- A transformer block cast with `.half()` before export (float16 in and out, float16 weights), and
  the same fp32 block lowered with the partitioner's `force_fp16` (float32 in and out, float16
  inside the delegates); dynamic sequence length, calls from 1 to 13 in shuffled order.
- ExecuTorch's Llama export in fp16 (`backend.vulkan.force_fp16=true`, the route ExecuTorch
  1.5.1 has: it refuses `model.dtype_override=fp16` for Vulkan) and 4-bit weights with fp16
  activations: greedy tokens and logits at every step of a prompt and 32 decode steps against
  the eager program (fp32: the program force_fp16 lowers is the fp32 one).
- The batching path (batched results bitwise equal to a session alone) and the server path.

Every test runs with `precision="auto"` (f16 storage where the adapter has shader-f16) and
`precision="f32"` (every float16 tensor widened to f32 on the device).

Tolerances (|got - want| <= atol + rtol * |want|), values of order 1: against eager of the same
fp16 program atol 2e-2, rtol 1e-2 (a float16 ulp is 1e-3 at 1, 4e-3 at 4; eager rounds each op's
output to fp16, f16 storage rounds where it stores); against fp32 eager atol 3e-2, rtol 2e-2 (the
fp16 rounding of the weights and inputs on top). The Llama logits are about 0.1 in size (weights
drawn with std 0.02): atol 5e-3, rtol 2e-2 against the fp32 program.
"""

import copy

import anyio
import httpx
import numpy as np
import pytest

import async_runtime as ar
from async_runtime.testing import assert_matches_eager, dynamic_shape_calls
from pte_wgpu.kernels.matmul.routes import BITWISE_ROWS

from .byte_tokenizer import ByteTokenizer
from .models import HALF_DYNAMIC, HALF_SAMPLE, forced_fp16_block, half_block
from .test_batching import _alone, _same
from .test_llama import CONFIGS, CONTEXT, SCENARIOS, _store, generate_and_check, recorded
from .test_server import running, tiny_app

pytestmark = pytest.mark.usefixtures("adapter")

FP16 = dict(atol=2e-2, rtol=1e-2)  # against eager of the same fp16 program
FP32 = dict(atol=3e-2, rtol=2e-2)  # against fp32 eager on the same weights
LLAMA_FP32 = dict(atol=5e-3, rtol=2e-2)
# test_llama's fp32 and 4w configs (same seed, so the same weights) exported in fp16
LLAMA = {"fp16": {**CONFIGS["fp32"], "dtype": "fp16"}, "4w_fp16": {**CONFIGS["4w"], "dtype": "fp16"}}


@pytest.fixture
def anyio_backend():
    """asyncio only: both backends are covered elsewhere, and this file runs every test twice."""
    return "asyncio"


@pytest.fixture(params=["auto", "f32"])
def precision(request):
    return request.param


def chosen(model, precision):
    """The storage `precision` must pick on this model's adapter."""
    return "f16" if precision == "auto" and "shader-f16" in model.device_info.features else "f32"


def start_exports(tmp_path_factory):
    """Start the fp16 Llama exports that are not stored (see tests/conftest.py), and the same
    configs with the embedding outside the delegate, niced as test_llama.start_exports nices those
    not in FIRST_NEEDED."""
    from .llama import start_export

    for name, config in LLAMA.items():
        if _store(f"{name}.npz") is None or not _store(f"{name}.npz").exists():
            start_export(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, nice=5, **config)
        start_export(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, nice=5, embedding_outside=True, **config)  # the first norm's test


async def test_half_module_matches_eager_in_fp16_and_fp32(precision, load_pte):
    pte, module = half_block()
    model = await load_pte(pte, precision=precision)
    assert model.precision == chosen(model, precision)
    assert model.inputs[0].dtype == model.outputs[0].dtype == "float16"
    calls = dynamic_shape_calls(HALF_SAMPLE[0].half(), HALF_DYNAMIC, n=6)  # S = 1, 13, then random
    await assert_matches_eager(model, module, calls, **FP16)
    # float32 arrays for the float16 input are converted; fp32 eager on the same weights
    wide = [c.float().numpy() for c in calls]
    await assert_matches_eager(model, copy.deepcopy(module).float(), wide, **FP32)
    (out,) = await model.execute(wide[1])
    assert out.dtype == np.float16 and out.shape == (2, 13, 21)


async def test_force_fp16_export_matches_eager_in_fp32_and_fp16(precision, load_pte):
    pte, module = forced_fp16_block()
    model = await load_pte(pte, precision=precision)
    assert model.precision == chosen(model, precision)
    # force_fp16 keeps the delegates' staging dtype, so the method's inputs and outputs stay float32
    assert model.inputs[0].dtype == model.outputs[0].dtype == "float32"
    calls = dynamic_shape_calls(HALF_SAMPLE, HALF_DYNAMIC, n=6)
    await assert_matches_eager(model, module, calls, **FP32)
    half = copy.deepcopy(module).half()
    await assert_matches_eager(model, lambda x: half(x.half()), calls, **FP16)


async def test_float_inputs_are_rounded_to_float16_and_ints_refused(precision, load_pte):
    model = await load_pte(half_block()[0], precision=precision)
    with pytest.raises(ar.InputError, match="dtype int64 given, expected float16"):
        await model.execute(np.ones((2, 5, 21), np.int64))
    x = np.random.default_rng(0).standard_normal((2, 5, 21))
    (exact,) = await model.execute(x.astype(np.float16))
    for given in (x, x.astype(np.float32)):  # float64 and float32: converted to the input's float16
        (got,) = await model.execute(given)
        np.testing.assert_array_equal(got, exact, err_msg=f"{given.dtype} input")


@pytest.mark.parametrize("name", list(LLAMA))
async def test_llama_fp16_greedy_tokens_and_logits_match_eager(name, precision, tmp_path_factory, load_pte):
    pte, runs = recorded(name, tmp_path_factory, LLAMA[name])
    model = await load_pte(pte, precision=precision)
    assert model.precision == chosen(model, precision)
    assert model.outputs[0].dtype == "float32"  # force_fp16: float16 inside, float32 logits out
    ids, logits = runs["short"]  # a prompt of 7, then 32 greedy steps of the eager (fp32) program
    await generate_and_check(model, ids, logits, SCENARIOS["short"][0], **LLAMA_FP32)


@pytest.mark.parametrize("name", list(LLAMA))
async def test_an_fp16_llama_folds_its_first_norm_over_an_f32_embedding(name, precision, tmp_path_factory, load_pte):
    """ExecuTorch leaves a Llama 3's 128k-token embedding outside the delegate, in f32, while an
    fp16 export's norms write halves: the first layer's RMS norm still joins its q/k/v group, as
    every other layer's does, and greedy tokens and logits match the eager (fp32) program's, a
    session alone and sessions together."""
    from .llama import export_llama
    from .test_llm_families import eager_greedy, generate_together

    config = LLAMA[name]
    path, ref = export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, embedding_outside=True, **config)
    model = await load_pte(path, precision=precision)
    names = [op for op, _ in model.graph.calls]
    assert "aten::embedding.out" in names and model.graph.values[model.graph.calls[names.index("aten::embedding.out")][1][-1]].dtype == "float32"
    groups = [n for n in names if n.startswith(("pte_wgpu.rms_q4_linear_group", "pte_wgpu.rms_linear_group"))]
    assert len(groups) == config["n_layers"] and names.count("et_vk.rms_norm.default") == 1, names  # the last norm: before the LM head
    prompt = np.random.default_rng(11).integers(0, config["vocab_size"], (1, 7))
    ref.reset()
    ids, logits = ref.greedy(prompt, 12)
    async with model.session() as s:
        await generate_and_check(s, np.concatenate([prompt[0], ids]), logits, prompt.shape[1], **LLAMA_FP32)
    # ... and in ragged passes of several rows (the normalized rows written apart, or the fold's)
    assert model.batching == "ragged", model.batching_note
    prompts = [prompt[0].tolist(), prompt[0, :3].tolist(), [*prompt[0], *ids[:4]]]
    assert await generate_together(model, prompts, 6) == eager_greedy(ref, prompts, 6)


async def test_fp16_sessions_batched_get_bitwise_what_they_get_alone(precision, tmp_path_factory):
    pte, _ = recorded("fp16", tmp_path_factory, LLAMA["fp16"])
    rng = np.random.default_rng(7)
    plans = [(11, 3), (1, 5), (6, 4)]  # prompt length, decode steps
    prompts = [rng.integers(0, LLAMA["fp16"]["vocab_size"], n) for n, _ in plans]
    async with await ar.load(pte, batch_submits=False, precision=precision) as ref:
        want = [await _alone(ref, p, d) for p, (_, d) in zip(prompts, plans)]
    async with await ar.load(pte, max_batch=4, token_budget=BITWISE_ROWS, precision=precision) as model:
        assert model.batching == "ragged" and model.precision == chosen(model, precision), model.batching_note
        got = [None] * len(plans)

        async def run(i):
            got[i] = await _alone(model, prompts[i], plans[i][1])

        async with anyio.create_task_group() as tg:
            for i in range(len(plans)):
                tg.start_soon(run, i)
        stats = model.statistics()
    for i, (n, d) in enumerate(plans):
        _same(got[i], want[i], f"session {i} (prompt {n}, {d} decode steps)")
    assert stats.submits < stats.executes  # passes were shared


async def test_fp16_model_serves_a_completion(precision, tmp_path_factory):
    pte, _ = recorded("fp16", tmp_path_factory, LLAMA["fp16"])
    tokenizer = ByteTokenizer()
    async with await ar.load(pte, precision=precision) as model:
        assert model.precision == chosen(model, precision)
        stream = ar.generate(model.session(), tokenizer.encode("hello"), max_new_tokens=5, stop=tokenizer.stop_ids)
        greedy = [t async for t in stream]
        async with running(tiny_app(model)) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
            r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": len(greedy), "total_tokens": 5 + len(greedy)}
    assert body["choices"][0]["finish_reason"] == ("stop" if greedy[-1] in tokenizer.stop_ids else "length")
