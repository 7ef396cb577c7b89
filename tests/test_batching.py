"""Continuous batching across sessions (async_runtime.ragged, async_runtime.batching).

Sessions of a KV-cache decoder run their steps as one ragged pass; each must get what it gets
alone. The reference is the same file loaded with `batch_submits=False` (every step its own pass,
no ragged rewrite), one session at a time. Scenarios mix prompts of prime lengths with decode
steps, late joins, early leaves (their slots reused), a cancelled caller and chunked prefill.
"""

import anyio
import numpy as np
import pytest

import async_runtime as ar
from async_runtime.batching import _bucket
from async_runtime.errors import InputError
from pte_wgpu.kernels.matmul.routes import BITWISE_ROWS

from .test_llama import CONFIGS, CONTEXT, ROPE_GROUP_BUFFERS, recorded

pytestmark = pytest.mark.usefixtures("adapter")

# Every kernel computes a row the same way whatever the other rows are, as long as a pass has at
# most BITWISE_ROWS rows (matrix products then run each row as its own GEMV): with that token
# budget a session's results are bitwise what it gets alone (its prompt in steps of as many
# rows), quantized activations included. Beyond it (subgroup kernels on a GPU,
# GEMM tiles) or against a long prompt run whole the sum order differs: within 1e-5.
CHUNKED_ATOL = 1e-5


async def _alone(model, prompt, decode_steps, chunk=None):
    """Logits of a prompt then greedy decode steps, on a fresh session of `model`; with `chunk`,
    the prompt goes in steps of at most that many rows, as a ragged model with that token budget
    cuts it."""
    chunk = chunk or len(prompt)
    async with model.session() as s:
        for start in range(0, len(prompt), chunk):
            (out,) = await s.execute(prompt[None, start : start + chunk], np.array([start]))
        logits, pos = [out], len(prompt)
        for _ in range(decode_steps):
            (out,) = await s.execute(np.array([[int(out.argmax())]]), np.array([pos]))
            logits.append(out)
            pos += 1
    return logits


def _same(got, want, what, atol=0.0):
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{what}, step {k}: shape {g.shape} != {w.shape}"
        assert int(g.argmax()) == int(w.argmax()), f"{what}, step {k}: greedy token differs"
        np.testing.assert_allclose(g, w, atol=atol, rtol=0, err_msg=f"{what}, step {k}")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return {name: recorded(name, tmp_path_factory)[0] for name in ("fp32", "8da4w")}


@pytest.mark.anyio
async def test_which_graphs_batch_ragged(llama):
    from .models import block_dynamic

    async with await ar.load(llama["fp32"]) as model, await ar.load(llama["fp32"], batch_submits=False) as off:
        assert model.batching == "ragged" and off.batching == "off"
        names = [name for name, _ in model.graph.calls]
        # attention over the slot pool, the q/k/v products taking the RoPE (where their kernel's
        # storage buffers fit the device), which stores k and v into it
        rope = model.device_info.max_storage_buffers >= ROPE_GROUP_BUFFERS["fp32"]
        assert names.count("pte_wgpu.ragged_sdpa_cached") == 2
        assert names.count("pte_wgpu.rms_linear_group_rope") == 2 * rope
    async with await ar.load(block_dynamic()[0]) as block:  # a float activation in, no KV cache
        assert block.batching == "submits"
        assert "not ragged" in block.batching_note


@pytest.mark.anyio
@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
async def test_rope_in_the_qkv_products_is_the_rope_op(llama, kernels, monkeypatch):
    """q/k/v products that take the RoPE (`pte_wgpu.rms_linear_group_rope`: on GPUs the GEMV's
    epilogue rotates and fills the caches, and the subgroup kernel's for SG_GPU_ROWS rows on a
    device with subgroups; else rope_into_cache's own dispatch) give every step's logits bitwise as
    the separate RoPE op does: prompts of 1, 13 and 37 rows (GEMV, GEMV, the subgroup kernel or the
    GEMM), then decode steps."""
    from async_runtime import device

    monkeypatch.setenv("PTE_WGPU_KERNELS", kernels)
    rng = np.random.default_rng(9)
    prompts = [rng.integers(0, CONFIGS["fp32"]["vocab_size"], n) for n in (1, 13, 37)]
    async with await ar.load(llama["fp32"], max_batch=2) as model:
        if model.device_info.max_storage_buffers < ROPE_GROUP_BUFFERS["fp32"]:
            pytest.skip(f"the device's kernels bind at most {model.device_info.max_storage_buffers} storage buffers")
        assert "pte_wgpu.rms_linear_group_rope" in {name for name, _ in model.graph.calls}
        got = [await _alone(model, p, 4) for p in prompts]
    # a device whose kernels bind fewer storage buffers than the group with its RoPE keeps the RoPE apart
    opened = device._open_in_worker_thread
    fewer = ROPE_GROUP_BUFFERS["fp32"] - 1

    def fewer_storage_buffers(*args):
        adapter, gpu, features, limits = opened(*args)
        return adapter, gpu, features, {**limits, "max-storage-buffers-per-shader-stage": fewer}

    monkeypatch.setattr(device, "_open_in_worker_thread", fewer_storage_buffers)
    async with await ar.load(llama["fp32"], max_batch=2) as model:
        assert model.device_info.max_storage_buffers == fewer
        names = {name for name, _ in model.graph.calls}
        assert "pte_wgpu.rms_linear_group_rope" not in names and "pte_wgpu.rope_into_cache" in names
        want = [await _alone(model, p, 4) for p in prompts]
    for p, g, w in zip(prompts, got, want):
        _same(g, w, f"prompt of {len(p)}")


@pytest.mark.anyio
@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
async def test_sessions_opened_while_others_decode(llama, kernels, monkeypatch):
    """Six sessions opened at once, four of them while the first two decode (greedy bursts): the
    sampler's rows grow 1 -> 2 -> 4 -> 8 meanwhile, each session gets a slot of its own and picks
    the tokens it picks alone. (Opened in worker threads, the growth rebound buffers while passes
    were encoded: a bind group met another kernel's pipeline.)"""
    monkeypatch.setenv("PTE_WGPU_KERNELS", kernels)
    prompt = np.array([5, 1, 4])
    async with await ar.load(llama["fp32"]) as model:
        async with model.session() as s:
            (logits,) = await s.execute(prompt[None], np.array([0]))
            want = [int(logits.argmax())] + (await s.greedy(np.array([[int(logits.argmax())]]), np.array([3]), n=9)).tolist()
        first = [await model.open_session() for _ in range(2)]
        sessions, got = first + [None] * 4, [None] * 6

        async def run(i):
            if sessions[i] is None:
                sessions[i] = await model.open_session()
            s = sessions[i]
            (logits,) = await s.execute(prompt[None], np.array([0]))
            token = int(logits.argmax())
            got[i] = [token] + (await s.greedy(np.array([[token]]), np.array([3]), n=9)).tolist()

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(run, i)
        assert len({s.slot for s in sessions}) == 6
        for s in sessions:
            await s.aclose()
    assert got == [want] * 6


@pytest.mark.anyio
@pytest.mark.parametrize("batch_submits", [True, False])
async def test_a_step_submitted_in_pieces_is_the_same_step(llama, batch_submits, monkeypatch):
    """A long step goes to the GPU in pieces as it is encoded (encoding.Pieces). With pieces of 1,
    2 and then 3 dispatches, a prompt of 7 and 4 decode steps give bitwise the logits they give in one
    piece (this tiny model's steps are shorter than a piece), through the ragged batch and, with
    `batch_submits=False`, the scheduler's own submits; every encoder begun is submitted."""
    from async_runtime import encoding

    prompt = np.array([3, 1, 4, 1, 5, 9, 2])
    async with await ar.load(llama["fp32"], batch_submits=batch_submits) as model:
        want = await _alone(model, prompt, 4)
        begun, submitted = [], []
        real_init, real_submit = encoding.Pieces.__init__, encoding.Pieces.submit

        def init(self, device):
            real_init(self, device)
            begun.append(self)

        def submit(self):
            submitted.append(self)
            real_submit(self)

        monkeypatch.setattr(encoding, "FIRST_PIECE", 1)
        monkeypatch.setattr(encoding, "MAX_PIECE", 3)
        monkeypatch.setattr(encoding, "PIECE_TAIL", 1)
        monkeypatch.setattr(encoding.Pieces, "__init__", init)
        monkeypatch.setattr(encoding.Pieces, "submit", submit)
        got = await _alone(model, prompt, 4)
        steps = model.statistics()
    _same(got, want, "in pieces")
    assert len(begun) == 5 and all(p.encoder is None for p in begun)  # each finished
    assert len(submitted) >= 5 * 5  # each step in more than five pieces
    assert steps.submits == steps.executes  # the statistics count passes, not pieces


@pytest.mark.anyio
@pytest.mark.parametrize("option", [{"max_batch": 0}, {"token_budget": -3}, {"max_batch": 2.5}])
async def test_batching_options_are_checked(llama, option):
    with pytest.raises(ValueError, match=f"{next(iter(option))} must be a positive int"):
        await ar.load(llama["fp32"], **option)


@pytest.mark.anyio
async def test_batch_invariant_is_a_bool(llama):
    with pytest.raises(ValueError, match="batch_invariant must be True or False, got 'no'"):
        await ar.load(llama["fp32"], batch_invariant="no")


@pytest.mark.anyio
@pytest.mark.parametrize("variant, kernels, invariant", [("fp32", None, True), ("8da4w", None, True), ("8da4w", "gpu", True), ("fp32", "gpu", False)])
async def test_concurrent_sessions_get_what_they_get_alone(llama, variant, kernels, invariant, monkeypatch):
    """With the GPU variants too (on lavapipe: 8da4w's one-row GEMVs normalizing the row for the
    norm after them, test_one_row_passes_normalize_in_the_residual_products). A model loaded with
    batch_invariant=False that has no products on f16 matrices (here: none) stays invariant
    (test_fp16_linear.py's batch-variant test: those products)."""
    if kernels:
        monkeypatch.setenv("PTE_WGPU_KERNELS", kernels)
    vocab = CONFIGS[variant]["vocab_size"]
    rng = np.random.default_rng(5)
    plans = [(n, d) for n, d in ((29, 3), (1, 9), (7, 5), (13, 2), (2, 7), (11, 4))]  # prompt, decode steps
    rng.shuffle(plans)
    prompts = [rng.integers(0, vocab, n) for n, _ in plans]
    async with await ar.load(llama[variant], batch_submits=False) as ref:
        want = [await _alone(ref, p, d, BITWISE_ROWS) for p, (_, d) in zip(prompts, plans)]
    async with await ar.load(llama[variant], max_batch=4, token_budget=BITWISE_ROWS, batch_invariant=invariant) as model:
        got = [None] * len(plans)
        joined = [anyio.Event() for _ in plans]

        async def run(i):
            if i >= 3:  # late joiners: after an earlier session's first step
                await joined[i - 3].wait()
            joined[i].set()
            got[i] = await _alone(model, prompts[i], plans[i][1])

        async with anyio.create_task_group() as tg:
            for i in range(len(plans)):
                tg.start_soon(run, i)
        stats = model.statistics()
        assert stats.executes == sum(d + 1 for _, d in plans)
    for i, (n, d) in enumerate(plans):
        _same(got[i], want[i], f"session {i} (prompt {n}, {d} decode steps)")
    assert stats.submits < stats.executes  # passes were shared


def test_passes_are_padded_to_powers_of_two_and_quarter_steps_to_32():
    """Row and sequence counts of a ragged pass: powers of two, from 17 to 32 in steps of 4 (an fp16
    export's subgroup kernels take time by the row there), at most the model's bound."""
    assert [_bucket(n, 64) for n in (1, 3, 5, 9, 16, 17, 20, 21, 25, 29, 32, 33, 48)] == [1, 4, 8, 16, 16, 20, 20, 24, 28, 32, 32, 64, 64]
    assert _bucket(21, 22) == 22 and _bucket(40, 48) == 48


@pytest.mark.anyio
@pytest.mark.parametrize("apart", [False, True])
async def test_one_row_passes_normalize_in_the_residual_products(llama, apart, monkeypatch):
    """8da4w with the GPU variants, whose GEMV takes a decode row at these widths: in a pass of one
    row, each residual product's last workgroup to arrive normalizes and quantizes the row for the
    RMS norm after it (kernels/matmul/q4_linear.py's normalized_row), whose dispatch then does not
    run (the first layer's norm and the last, after other ops, still do); passes of more rows run
    the norms (each row bitwise as alone: test_concurrent_sessions_get_what_they_get_alone).
    Where workgroups merge apart (Dawn's compiler), no product does."""
    import async_runtime.backend as backend

    monkeypatch.setattr(backend, "MERGE_APART", apart)
    monkeypatch.setenv("PTE_WGPU_KERNELS", "gpu")
    layers = CONFIGS["8da4w"]["n_layers"]
    async with await ar.load(llama["8da4w"], batch_submits=False) as model:
        if model.int8_matrices:  # Dawn on NVIDIA: the products quantize their own rows (kernels/fusion.py)
            pytest.skip("with int8 subgroup matrices no row is quantized ahead of its products")
        for rows in (1, 3, 1, 2):
            await model.execute(np.arange(rows)[None], np.array([0]))
            grids = model._default.state.grids
            running = [d for i, d in enumerate(model.graph.dispatches) if d.shader and all(grids[i])]
            tails = sum("quantize_row(0u, li)" in d.shader for d in running)
            norms = sum(d.op == "pte_wgpu.rms_norm_quantized_rows" for d in running)
            normalized = 2 * layers - 1 if rows == 1 and not apart else 0
            assert (tails, norms) == (normalized, 2 * layers + 1 - normalized), rows


@pytest.mark.anyio
async def test_chunked_prefill_keeps_decodes_flowing(llama):
    vocab = CONFIGS["fp32"]["vocab_size"]
    rng = np.random.default_rng(11)
    long_prompt, short_prompt = rng.integers(0, vocab, 37), rng.integers(0, vocab, 3)
    async with await ar.load(llama["fp32"], batch_submits=False) as ref:
        want_long = await _alone(ref, long_prompt, 2)
        want_short = await _alone(ref, short_prompt, 8)
    async with await ar.load(llama["fp32"], token_budget=5) as model:
        got = {}
        async with model.session() as decoder, model.session() as prefiller:
            (out,) = await decoder.execute(short_prompt[None], np.array([0]))
            got["short"] = [out]

            async def decode():
                out, pos = got["short"][0], 3
                for _ in range(8):
                    (out,) = await decoder.execute(np.array([[int(out.argmax())]]), np.array([pos]))
                    got["short"].append(out)
                    pos += 1

            async def prefill():
                (out,) = await prefiller.execute(long_prompt[None], np.array([0]))
                got["long"], pos = [out], 37
                for _ in range(2):
                    (out,) = await prefiller.execute(np.array([[int(out.argmax())]]), np.array([pos]))
                    got["long"].append(out)
                    pos += 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(prefill)
                tg.start_soon(decode)
            # 37 rows at 5 per pass (fewer while the decoder's row shares it): at least 8 passes
            assert prefiller.statistics().submits >= 8 + 2
            assert decoder.statistics().submits == 9
    _same(got["long"], want_long, "chunked prompt", CHUNKED_ATOL)
    _same(got["short"], want_short, "decoder beside a chunked prompt", CHUNKED_ATOL)


@pytest.mark.anyio
async def test_leaves_cancellations_and_bad_input_leave_the_others_exact(llama):
    vocab = CONFIGS["fp32"]["vocab_size"]
    rng = np.random.default_rng(17)
    prompts = [rng.integers(0, vocab, n) for n in (5, 19, 3)]
    async with await ar.load(llama["fp32"], batch_submits=False) as ref:
        want = [await _alone(ref, p, 6, BITWISE_ROWS) for p in prompts]
    async with await ar.load(llama["fp32"], token_budget=BITWISE_ROWS) as model:
        got = [None] * 3

        async def run(i):
            got[i] = await _alone(model, prompts[i], 6)

        async def leaver():  # runs two steps, then closes mid-stream: its slot is freed and reused
            async with model.session() as s:
                await s.execute(prompts[0][None], np.array([0]))
                await s.execute(np.array([[1]]), np.array([5]))

        async def cancelled():
            async with model.session() as s:
                with anyio.move_on_after(0):
                    await s.execute(prompts[1][None], np.array([0]))
                with pytest.raises(InputError, match="do not fit the KV cache of 48 positions"):
                    await s.execute(np.array([[1, 2]]), np.array([CONTEXT - 1]))
                await s.execute(prompts[2][None], np.array([0]))  # the session still works

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(run, i)
            tg.start_soon(leaver)
            tg.start_soon(cancelled)
        late = await _alone(model, prompts[1], 6)  # a session after all that: a reused, reset slot
    for i in range(3):
        _same(got[i], want[i], f"session {i}")
    _same(late, want[1], "late session")
