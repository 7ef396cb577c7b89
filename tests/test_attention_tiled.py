"""The query-tiled attention kernel (kernels/attention/kv_cache_sdpa.py TILED), which takes passes of more than
SPLIT_MAX_ROWS query rows, against float64 / torch eager attention.

First the kernels alone on raw buffers: the plain form at a start position past 0, and ragged
passes whose tiles span several sessions (prompt chunks, decode rows, padding) over paged caches, for head dims 64
(SmolLM2's), 40 (G = 10, not a power of 2), 128 (Llama 3.1 8B's, Qwen's: each row's dims in two
halves), 88 (halves of 11 vec4s; 128 merges its halves in chunks) and 136 (the whole-range fallback). Then an export:
`llama::sdpa_with_kv_cache` of head dim 64 fed by token embeddings, run step by step at prime row
counts (plain) and as concurrent sessions (ragged passes), against torch eager.
"""

import math
import struct
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch
import wgpu

from async_runtime.device import find_adapter
from pte_wgpu.kernels.attention.kv_cache import KV_BLOCK, table_entries
from pte_wgpu.kernels.attention.kv_cache_sdpa import SPLIT_MAX_ROWS, TILE_ROWS, _whole_range

from .exporting import EXPORT_DIR, export_pte
from .one_kernel import dispatch

pytestmark = pytest.mark.usefixtures("adapter")

HQ, HKV = 6, 2
DIMS = {64: TILE_ROWS, 40: TILE_ROWS, 128: TILE_ROWS, 88: TILE_ROWS, 136: 1}  # head dim: query rows per workgroup (136: the fallback)


@pytest.fixture(scope="module")
def device():
    adapter = find_adapter()
    features = [f for f in ("shader-f16",) if f in adapter.features]
    return adapter.request_device_sync(required_limits=dict(adapter.limits), required_features=features)


def _run_kernel(device, dim, q, kc, vc, pos=0, tables=None, entries=0):
    """The pass's attention output [S, HQ, dim] from the kernel the hook takes for S rows: q is
    [S, HQ, dim]; kc, vc are [1, context, HKV, dim], or with tables (row_pos, row_seq, seq_blocks,
    ragged) pools [positions, HKV, dim] of blocks of KV_BLOCK positions, each sequence's table
    `entries` long. The arrays are float32 or float16 (f16 storage; the output then float16 too)."""
    s, context = q.shape[0], kc.shape[1] if tables is None else entries * KV_BLOCK
    assert s > SPLIT_MAX_ROWS
    shader, rows_per_group = _whole_range(tables is not None, dim)
    assert rows_per_group == DIMS[dim]
    half = q.dtype == np.float16
    if half and "shader-f16" not in device.features:
        pytest.skip("the adapter has no shader-f16")
    storage = "f16" if half else "f32"
    aliases = "".join(f"alias {a} = {storage};\n" for a in ("QT", "KCT", "VCT", "OT"))  # kernels/wgsl.py type_aliases
    shader = ("enable f16;\n" if half else "") + aliases + shader
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    out = device.create_buffer(size=-(-q.nbytes // 4) * 4, usage=usage)
    device.queue.write_buffer(out, 0, np.full(-(-q.nbytes // 4), np.nan, np.float32))
    params = struct.pack("<5If6I", s, pos, HQ, HKV, dim, 1 / math.sqrt(dim), entries, 1, context, 0, 0, 0)
    buffers = [device.create_buffer_with_data(data=_words(a), usage=usage) for a in (q, kc, vc)]
    buffers += [out, device.create_buffer_with_data(data=params, usage=wgpu.BufferUsage.UNIFORM)]
    buffers += [device.create_buffer_with_data(data=t.astype(np.int32), usage=usage) for t in tables or ()]
    dispatch(device, _pipeline(device, shader), buffers, (HQ, -(-s // rows_per_group), 1))
    return np.frombuffer(device.queue.read_buffer(out), q.dtype, q.size).reshape(q.shape)


_PIPELINES = {}  # (device, shader) -> its compute pipeline


def _pipeline(device, shader):
    """The compute pipeline of `shader`, made once: lavapipe compiles a tiled attention kernel for
    4-19 s (its shader cache empty), and a test runs the same one for several passes."""
    key = (id(device), shader)
    if key not in _PIPELINES:
        module = device.create_shader_module(code=shader)
        _PIPELINES[key] = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    return _PIPELINES[key]


def _words(a):
    """The bytes of `a` padded to whole 4-byte words (an odd count of f16 values)."""
    raw = a.tobytes()
    return raw + bytes(-len(raw) % 4)


def _attend(q, k, v, positions):
    """float64 causal attention: row i of q [S, HQ, d] at absolute position positions[i] over the
    keys 0..positions[i] of k, v [context, HKV, d]."""
    d = q.shape[-1]
    k, v = (np.repeat(t.astype(np.float64), HQ // HKV, axis=1) for t in (k, v))
    scores = np.einsum("shd,thd->sht", q.astype(np.float64), k) / math.sqrt(d)
    hidden = np.arange(k.shape[0])[None, :] > np.asarray(positions)[:, None]
    scores = np.where(hidden[:, None, :], -np.inf, scores)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("sht,thd->shd", w / w.sum(-1, keepdims=True), v)


# dtype -> tolerance (rtol = atol) against float64 attention of the same values: f16 storage
# rounds each output to 11 bits (half an ulp is 1e-3 of the value) after f32 arithmetic.
TOLERANCE = {np.float32: 1e-5, np.float16: 2e-3}


@pytest.mark.parametrize("dtype", TOLERANCE)
@pytest.mark.parametrize("dim", DIMS)
def test_plain_pass_past_the_start(device, dim, dtype):
    rng = np.random.default_rng(dim)
    context = 224
    kc, vc = (rng.standard_normal((1, context, HKV, dim), dtype=np.float32).astype(dtype) for _ in range(2))
    for s, pos in [(97, 113), (37, 0), (61, 163)]:
        q = (rng.standard_normal((s, HQ, dim), dtype=np.float32) * 2).astype(dtype)
        got = _run_kernel(device, dim, q, kc, vc, pos=pos)
        want = _attend(q, kc[0], vc[0], np.arange(pos, pos + s))
        tol = TOLERANCE[dtype]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"s={s} pos={pos}")


@pytest.mark.parametrize("dtype", TOLERANCE)
@pytest.mark.parametrize("dim", DIMS)
def test_ragged_pass_of_several_sessions(device, dim, dtype):
    """Tiles of rows of several sequences over paged caches: a long prompt chunk past position 0,
    decode rows, chunks of other prompts, and padding rows at the end (sequence -1), in a random
    order of sequences, each sequence's blocks scattered over the pool in a random order."""
    rng = np.random.default_rng(dim + 1)
    seqs, context = 6, 200
    entries = table_entries(context)
    caches = [rng.standard_normal((seqs, context, HKV, dim), dtype=np.float32).astype(dtype) for _ in range(2)]
    pieces = [(2, 101, 67), (0, 199, 1), (1, 0, 31), (3, 5, 1), (5, 17, 13), (4, 150, 2)]  # (sequence, start, rows)
    rng.shuffle(pieces)
    held = [table_entries(start + n) for _, start, n in sorted(pieces)]  # blocks each sequence holds
    blocks = rng.permutation(sum(held) + 3)  # and 3 no sequence holds
    tables, pools = np.zeros((seqs, entries), np.int32), [np.zeros((len(blocks) * KV_BLOCK, HKV, dim), dtype) for _ in caches]
    for b, n in enumerate(held):
        tables[b, :n], blocks = blocks[:n], blocks[n:]
        for i, block in enumerate(tables[b, :n]):
            for pool, cache in zip(pools, caches):
                pool[block * KV_BLOCK : (block + 1) * KV_BLOCK] = np.pad(cache[b], ((0, entries * KV_BLOCK - context), (0, 0), (0, 0)))[i * KV_BLOCK : (i + 1) * KV_BLOCK]
    pad = 13
    row_seq = np.concatenate([np.full(n, b) for b, _, n in pieces] + [np.full(pad, -1)])
    row_pos = np.concatenate([np.arange(start, start + n) for _, start, n in pieces] + [np.zeros(pad, int)])
    q = (rng.standard_normal((len(row_pos), HQ, dim), dtype=np.float32) * 2).astype(dtype)
    got = _run_kernel(device, dim, q, *pools, tables=(row_pos, row_seq, tables.reshape(-1)), entries=entries)
    tol = TOLERANCE[dtype]
    first = 0
    for b, start, n in pieces:
        rows = slice(first, first + n)
        want = _attend(q[rows], caches[0][b], caches[1][b], row_pos[rows])
        np.testing.assert_allclose(got[rows], want, rtol=tol, atol=tol, err_msg=f"sequence {b}, rows {rows}")
        first += n
    assert np.isfinite(got[first:]).all()  # padding rows: unused, but nothing undefined


# -- an export: token embeddings as q, k, v, attended over the KV cache ----------------------------

DIM, CONTEXT, VOCAB = 64, 192, 89
S_MAX = 127


class EmbeddedAttention(torch.nn.Module):
    """q, k, v looked up per token (HQ / HKV heads of DIM), `llama::sdpa_with_kv_cache` over the
    module's KV cache: the rows' attention outputs [1, S, HQ * DIM]."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Embedding(VOCAB, HQ * DIM)
        self.k = torch.nn.Embedding(VOCAB, HKV * DIM)
        self.v = torch.nn.Embedding(VOCAB, HKV * DIM)
        self.register_buffer("k_cache", torch.zeros(1, CONTEXT, HKV, DIM))
        self.register_buffer("v_cache", torch.zeros(1, CONTEXT, HKV, DIM))

    def forward(self, tokens, input_pos):
        s = tokens.shape[1]
        pos = input_pos[0].item()
        torch._check_is_size(pos)
        torch._check(pos + s <= CONTEXT)
        q = self.q(tokens).view(1, s, HQ, DIM)
        k = self.k(tokens).view(1, s, HKV, DIM)
        v = self.v(tokens).view(1, s, HKV, DIM)
        y = torch.ops.llama.sdpa_with_kv_cache(q, k, v, self.k_cache, self.v_cache, pos, s, None, 0, True)
        return y.view(1, s, HQ * DIM)


def _export():
    if not (EXPORT_DIR and (Path(EXPORT_DIR) / "attention_d64.pte").exists()):
        pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")  # registers llama::
    sample = (torch.randint(0, VOCAB, (1, 41)), torch.tensor([5]))
    dynamic = ({1: torch.export.Dim("s", min=1, max=S_MAX)}, None)
    return export_pte("attention_d64", EmbeddedAttention, sample, dynamic)


PREBUILD = [_export]  # tests/prebuild.py


def _eager(module, history, pos, s):
    """torch eager attention of the rows at positions pos..pos+s-1 of the token `history`."""
    with torch.no_grad():
        tokens = torch.from_numpy(np.asarray(history[: pos + s], np.int64))
        q, k, v = (e(tokens).double().view(pos + s, -1, DIM).transpose(0, 1) for e in (module.q, module.k, module.v))
        k, v = (t.repeat_interleave(HQ // HKV, dim=0) for t in (k, v))
        visible = torch.arange(pos + s)[None, :] <= torch.arange(pos, pos + s)[:, None]
        y = torch.nn.functional.scaled_dot_product_attention(q[:, pos:], k, v, attn_mask=visible)
    return y.transpose(0, 1).reshape(1, s, HQ * DIM).float().numpy()


async def _steps(session, module, history, counts):
    """Feed `history` in steps of `counts` rows; each step's output must match eager."""
    pos = 0
    for s in counts:
        (got,) = await session.execute(np.asarray(history[pos : pos + s], np.int64)[None], np.array([pos], np.int64))
        np.testing.assert_allclose(got, _eager(module, history, pos, s), rtol=1e-4, atol=1e-5, err_msg=f"{s} rows at {pos}")
        pos += s


PLANS = [[97, 1, 37, 41], [37, 61, 1, 53, 2], [61, 1, 1, 89], [127, 3, 59]]  # rows per step


@pytest.mark.anyio
async def test_export_plain_steps(load_pte, kernel_variants):
    """Decode steps (up to SPLIT_MAX_ROWS rows) take each adapter class's split-K variant."""
    pte, module = _export()
    rng = np.random.default_rng(3)
    model = await load_pte(pte, batch_submits=False)
    assert model.kernels == kernel_variants
    for i in rng.permutation(len(PLANS)):
        counts = PLANS[i]
        history = rng.integers(0, VOCAB, sum(counts))
        async with model.session() as session:
            await _steps(session, module, history, counts)


@pytest.mark.anyio
async def test_export_ragged_sessions(load_pte, kernel_variants):
    """Concurrent sessions: their steps share ragged passes of up to S_MAX rows, whose tiles span
    sessions (a prompt's chunks beside other prompts and decode rows). With GPU variants, passes of
    33 to RAGGED_SPLIT_MAX_ROWS rows take split-K (one workgroup per row and key range)."""
    pte, module = _export()
    rng = np.random.default_rng(4)
    model = await load_pte(pte)
    assert model.batching == "ragged"

    async def run(counts):
        async with model.session() as session:
            await _steps(session, module, rng.integers(0, VOCAB, sum(counts)), counts)

    async with anyio.create_task_group() as tg:
        for counts in PLANS:
            tg.start_soon(run, counts)
    stats = model.statistics()
    assert stats.executes == sum(map(len, PLANS)) and stats.submits < stats.executes


@pytest.mark.anyio
@pytest.mark.parametrize("apart", [False, True])
async def test_split_k_heads_of_a_group_are_each_as_alone(load_pte, kernel_variants, monkeypatch, apart):
    """With GPU variants, a split-K workgroup takes the query heads of one key-value head (3 here:
    kv_cache_sdpa.py's q_group), each bitwise what a workgroup of that head alone gives, its key
    ranges merged by the last workgroup to arrive or (`apart`, where Dawn compiles) by a second
    dispatch: steps of 1 to 37 rows over up to 190 keys (1 to 3 ranges of 64), against a load
    whose workgroups take one head."""
    import async_runtime.backend as backend
    from pte_wgpu.kernels.attention import kv_cache_sdpa

    if kernel_variants != "gpu":
        pytest.skip("split-K's GPU variant")
    monkeypatch.setattr(backend, "MERGE_APART", apart)
    assert kv_cache_sdpa.q_group(HQ, HKV) == 3
    pte, _ = _export()
    counts = [37, 1, 5, 1, 29, 31, 1, 2, 31, 1, 17, 1, 29, 2]
    history = np.random.default_rng(6).integers(0, VOCAB, sum(counts))
    outputs = []
    for alone in (False, True):
        if alone:
            monkeypatch.setattr(kv_cache_sdpa, "q_group", lambda hq, hkv: 1)
        model = await load_pte(pte, batch_submits=False)
        pos, got = 0, []
        async with model.session() as session:
            for s in counts:
                got += await session.execute(np.asarray(history[pos : pos + s], np.int64)[None], np.array([pos], np.int64))
                pos += s
        outputs.append(got)
    for s, grouped, alone in zip(counts, *outputs):
        np.testing.assert_array_equal(grouped, alone, err_msg=f"{s} rows")
