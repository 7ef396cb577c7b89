"""LLM exports beyond SmolLM2's graph: what ExecuTorch leaves outside the Vulkan delegate still
runs ragged, with continuous batching and GPU sampling, and matches ExecuTorch's eager program."""

import anyio
import numpy as np
import pytest

import async_runtime as ar

from .llama import export_llama
from .test_llama import CONFIGS

pytestmark = pytest.mark.usefixtures("adapter")

CONTEXT = 40


@pytest.fixture(scope="module")
def portable_embedding(tmp_path_factory):
    """A tiny Llama whose token embedding ExecuTorch runs with its portable kernel (as it does
    with a Llama 3's 128k-token embedding, past the Vulkan partitioner's buffer limit)."""
    return export_llama(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, embedding_outside=True, **CONFIGS["fp32"])


async def test_an_embedding_outside_the_delegate_batches_ragged(portable_embedding, load_pte):
    path, ref = portable_embedding
    model = await load_pte(path)
    assert "aten::embedding.out" in {name for name, _ in model.graph.calls}
    assert model.batching == "ragged" and model.gpu_sampling, model.batching_note
    vocab = CONFIGS["fp32"]["vocab_size"]
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, vocab, n).tolist() for n in (5, 1, 11, 7)]
    want = []
    for prompt in prompts:  # ExecuTorch's eager program, greedy
        ref.reset()
        ids, _ = ref.greedy(np.array([prompt]), 12)
        want.append([int(t) for t in ids])
    got = [None] * len(prompts)

    async def run(i):
        async with model.session() as s:
            got[i] = [t async for t in ar.generate(s, prompts[i], max_new_tokens=12)]

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(run, i)
    assert got == want
