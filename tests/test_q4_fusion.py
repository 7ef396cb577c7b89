"""The 4-bit linears fused at load (kernels/fusion.py, kernels/matmul/q4_fused_linear.py): a graph whose
q/k/v, SwiGLU and residual linears are `et_vk.linear_q4gsw` runs them as the fused ops, in fewer
dispatches, and every output is bitwise the unfused graph's (the 4-bit rewrites turned off, every
other fusion kept) at one row, a few rows and prompt-sized row counts, with both kernel variant sets
(on lavapipe: the CPU adapters' subgroup kernels, and the GPUs' GEMV and GEMM routes),
f32 and f16 activations."""

import functools

import numpy as np
import pytest
import torch
from pte_wgpu.kernels import build_node, fusion
from pte_wgpu.kernels.matmul import gemm, routes

from async_runtime import model as model_module

from .exporting import export_pte
from .test_linear_ops import FusedLinears
from .test_llama import CONFIGS, CONTEXT, _store, recorded
from .test_quantized_ops import quantized

pytestmark = pytest.mark.usefixtures("adapter", "kernel_variants")

LLAMA = {"4w": CONFIGS["4w"], "4w_fp16": {**CONFIGS["4w"], "dtype": "fp16"}}
# Each session's steps (rows a step, positions from 0, within the context): one row, a few rows,
# past the GEMV's 16 and 32 rows, the whole context; each followed by decode steps
SESSIONS = [(1, 3, 5, 16, 1, 1), (17, 1, 1), (33, 2, 1), (CONTEXT - 1,)]
# K = 2,048 (a 1B's width, one layer): past the subgroup kernels' 16 rows the fused q/k/v and SwiGLU
# products run as one GEMM over their columns that splits K
WIDE = dict(dim=2048, n_heads=32, n_kv_heads=8, n_layers=1, vocab_size=260, qmode="4w", model_args=(("hidden_dim", 256),))
FUSED_OPS = ("pte_wgpu.rms_q4_linear_group_rope", "pte_wgpu.rms_q4_linear_silu_mul", "pte_wgpu.q4_linear_residual")


def start_exports(tmp_path_factory):
    """Start this file's tiny Llama exports that are not stored (see tests/conftest.py), niced as
    test_fp16's."""
    from .llama import start_export

    for name, config in {**LLAMA, "4w_wide": WIDE}.items():
        if _store(f"{name}.npz") is None or not _store(f"{name}.npz").exists():
            start_export(tmp_path_factory.mktemp("llama"), max_len=CONTEXT, nice=5, **config)


async def _load(load_pte, pte, fuse_q4, monkeypatch, subgroups=True):
    with monkeypatch.context() as m:
        if not fuse_q4:
            m.setattr(fusion, "Q4_LINEAR", "-")  # no 4-bit linear matches: the rewrites skip them all
        if not subgroups:  # every op built as for a device without the feature
            m.setattr(model_module, "build_node", lambda graph, name, args, kernels, _, *rest: build_node(graph, name, args, kernels, False, *rest))
        return await load_pte(pte)


async def _steps(model, sessions, vocab):
    """Every step's logits, and the dispatches of the first step (one row)."""
    rng, outs, dispatches = np.random.default_rng(3), [], None
    for rows in sessions:
        async with model.session() as s:
            pos = 0
            for m in rows:
                before = model.statistics().dispatches
                (logits,) = await s.execute(rng.integers(0, vocab, (1, m)), np.array([pos]))
                dispatches = dispatches or model.statistics().dispatches - before
                outs.append(logits)
                pos += m
    return outs, dispatches


@pytest.mark.parametrize("name", list(LLAMA))
async def test_a_4w_llama_fuses_its_linears_bitwise(name, tmp_path_factory, load_pte, monkeypatch, kernel_variants):
    config = LLAMA[name]
    pte, _ = recorded(name, tmp_path_factory, config)
    fused, plain = await _load(load_pte, pte, True, monkeypatch), await _load(load_pte, pte, False, monkeypatch)
    if name == "4w_fp16":
        assert fused.precision == plain.precision == ("f16" if "shader-f16" in fused.device_info.features else "f32")
    layers = config["n_layers"]
    names = [n for n, _ in fused.graph.calls]
    rope = fused.device_info.max_storage_buffers >= 16  # the group with the RoPE binds 16 storage buffers (a lean epilogue)
    group = FUSED_OPS[0] if rope else FUSED_OPS[0].removesuffix("_rope")
    assert [names.count(op) for op in (group, *FUSED_OPS[1:])] == [layers, layers, 2 * layers]
    assert names.count("et_vk.linear_q4gsw.default") == 1  # the LM head
    assert fused.fused == plain.fused + (6 + rope) * layers  # q/k/v, SwiGLU, two residuals, two norms, the RoPE a layer
    vocab = config["vocab_size"]
    (got, fused_dispatches), (want, plain_dispatches) = await _steps(fused, SESSIONS, vocab), await _steps(plain, SESSIONS, vocab)
    # a decode step: per layer, two linears of q/k/v, two of SwiGLU and its gate, two adds, and the
    # two norms and the RoPE, except on CPU adapters with subgroups (kernels/matmul/routes.py's
    # fused_norm_rows; their subgroup kernels have no RoPE epilogue)
    norms_and_rope = 0 if kernel_variants == "cpu" and fused.subgroups else 2 + rope
    assert fused_dispatches == plain_dispatches - (6 + norms_and_rope) * layers, (fused_dispatches, plain_dispatches)
    steps = [m for rows in SESSIONS for m in rows]
    for m, g, w in zip(steps, got, want):
        np.testing.assert_array_equal(g, w, err_msg=f"{m} rows")


async def test_a_wide_4w_llama_rotates_and_gates_in_split_ks_reduce(tmp_path_factory, load_pte, monkeypatch, kernel_variants):
    """At K = 2,048, passes of more rows than the subgroup kernels take run the fused q/k/v and SwiGLU
    products as one GEMM over their columns that splits K, whose reduce rotates q and k, stores k and
    v in the caches and gates SwiGLU (q4_fused_linear.py's rope_reduce, fused_linear.py's
    swiglu_reduce), where the unfused graph runs the RoPE's and the gate's dispatches after its
    GEMMs: those passes' logits bitwise the unfused graph's, and the decode steps after them, which
    attend to the keys they cached, too (to rounding where a GPU's subgroup kernels fold the norm)."""
    pte, _ = recorded("4w_wide", tmp_path_factory, WIDE)
    fused, plain = await _load(load_pte, pte, True, monkeypatch), await _load(load_pte, pte, False, monkeypatch)
    shaders = [d.shader or "" for d in fused.graph.dispatches]
    rotating = [text for text in shaders if "let c0 = 2u * (i % np);" in text]  # rope_reduce's
    gating = [text for text in shaders if "finished[i] = " in text]  # swiglu_reduce's
    assert bool(rotating) == bool(gating) == (kernel_variants == "gpu")  # CPU adapters' subgroup kernels take every row count
    sessions = [(17, 1, 1), (33, 2, 1), (CONTEXT - 1, 1)]
    (got, _), (want, _) = await _steps(fused, sessions, WIDE["vocab_size"]), await _steps(plain, sessions, WIDE["vocab_size"])
    folds = kernel_variants == "gpu" and fused.subgroups
    for m, g, w in zip([m for rows in sessions for m in rows], got, want):
        if folds and m <= 16:
            np.testing.assert_allclose(g, w, rtol=0, atol=2e-6 * float(np.abs(w).max()), err_msg=f"{m} rows")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{m} rows")


class QLinears(FusedLinears):
    """FusedLinears on 2-D rows, 4-bit: K = 64 and 32 (o), a wide SwiGLU (N = 1056)."""

    def __init__(self, qkv_bias=False):
        super().__init__(64, 32, 20, 1056, qkv_bias)


PROMPT_ROWS = 263  # past gemm.py's WIDEN_MIN_ROWS: GPUs widen a large product's weights to f32 first


def _export(half, bias=False):
    make = quantized((lambda: QLinears(bias).half()) if half else functools.partial(QLinears, bias), "4w", 32)
    x = torch.randn(PROMPT_ROWS, 64, dtype=torch.float16 if half else torch.float32)
    name = f"q4_fused_{PROMPT_ROWS}{'_f16' if half else ''}{'_qkv_bias' if bias else ''}"
    return export_pte(name, make, [x], ({0: torch.export.Dim("m", min=1, max=PROMPT_ROWS)},))


class NormedQLinears(torch.nn.Module):
    """QLinears behind RMS norms at a 1B model's K = 2,048: the fused q/k/v and SwiGLU normalize
    their rows themselves, a lane taking 4 weights at a step (kernels/matmul/q4_linear.py's
    gemv_step)."""

    def __init__(self, qkv_bias=False):
        super().__init__()
        self.lin = FusedLinears(2048, 64, 32, 96, qkv_bias)
        self.g1, self.g2 = (torch.nn.Parameter(torch.rand(2048) + 0.5) for _ in range(2))

    @staticmethod
    def _norm(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * g

    def forward(self, x):
        lin, n = self.lin, self._norm(x, self.g1)
        q, k, v = lin.q(n), lin.k(n), lin.v(n)
        h = x + lin.o(q * 0.5)
        n2 = self._norm(h, self.g2)
        return q, k, v, h + lin.down(torch.nn.functional.silu(lin.gate(n2)) * lin.up(n2))


def _export_normed(half, bias=False):
    make = quantized((lambda: NormedQLinears(bias).half()) if half else functools.partial(NormedQLinears, bias), "4w", 32)
    x = torch.randn(24, 2048, dtype=torch.float16 if half else torch.float32)
    name = f"q4_fused_normed{'_f16' if half else ''}{'_qkv_bias' if bias else ''}"
    return export_pte(name, make, [x], ({0: torch.export.Dim("m", min=1, max=24)},))


PREBUILD = [functools.partial(f, half, bias) for f in (_export, _export_normed) for half in (False, True) for bias in (False, True)]  # tests/prebuild.py


@pytest.mark.parametrize("subgroups, bias", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("half", [False, True])
async def test_fused_4bit_products_without_views_and_wide_swiglu(half, subgroups, bias, load_pte, monkeypatch):
    """The fused ops on 2-D rows (no views between them), a wide SwiGLU, group 32, at 1 to 40 rows
    and a prompt's (the GPU variants' GEMMs over weights widened to f32 from gemm.py's
    WIDEN_MIN_ROWS, here at any size) in shuffled order; with the device's subgroups and as built
    without them (the GEMV at up to 32 rows on either variant set); `bias`: q, k and v with biases,
    one `pte_wgpu.q4_linear_bias_group`."""
    pte, _ = _export(half, bias)
    monkeypatch.setattr(gemm, "WIDEN_MIN_WORK", 0)  # the prompt's products widen their weights, small as they are
    fused, plain = [await _load(load_pte, pte, fuse, monkeypatch, subgroups) for fuse in (True, False)]
    names = [n for n, _ in fused.graph.calls]
    # a .half() module's SiLU runs through casts to float32, which the gate's rewrite does not
    # match: its gate and up become a group
    group = "pte_wgpu.q4_linear_bias_group" if bias else "pte_wgpu.q4_linear_group"
    fused_ops = (group, "pte_wgpu.q4_linear_residual") + (() if half else ("pte_wgpu.q4_linear_silu_mul",))
    assert all(op in names for op in fused_ops), names
    # the biased .half() module exports q * 0.5 as f32, and so the block after it: its last sum, the
    # down product's f32 into an f16 output, stays apart (a fused residual rounds to one type)
    assert names.count("et_vk.linear_q4gsw.default") == (half and bias)
    # subgroup kernels: CPU adapters' at every row count, GPUs' for 17-64 rows
    assert any("subgroupAdd" in (d.shader or "") for d in fused.graph.dispatches) == (subgroups and fused.subgroups)
    rng = np.random.default_rng(11)
    for m in (1, 40, 17, PROMPT_ROWS, 2, 32, 5, 33, 255, 16, 1, 256):
        x = rng.standard_normal((m, 64)).astype(np.float16 if half else np.float32)
        got, want = await fused.execute(x), await plain.execute(x)
        for i, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(g, w, err_msg=f"{m} rows, output {i}")


@pytest.mark.parametrize("split, bias", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("half", [False, True])
async def test_fused_4bit_norms_at_wide_k(half, split, bias, load_pte, monkeypatch, kernel_variants):
    """At K = 2,048 the fused ops that normalize their rows (q/k/v, SwiGLU) and the residual ones,
    at 1 to 24 rows in shuffled order: bitwise the unfused graph's where they normalize as the norm
    does (the GEMV to 16 rows, the GEMM past); where a GPU's subgroup kernels fold the norm in (to
    16 rows: one row in the products, more in a dispatch before them, which repeats the fold's
    sums) the unfused graph's to rounding, each row of a pass bitwise the row alone; and the
    unfused graph is torch's to 4-bit rounding. `split`: the GPUs' subgroup kernels split K among
    a workgroup's subgroups (a 1B's q/k/v), else each subgroup walks all of it (its SwiGLU).
    `bias`: q, k and v with biases (`pte_wgpu.rms_q4_linear_bias_group`)."""
    pte, module = _export_normed(half, bias)
    if not split:
        monkeypatch.setattr(routes, "Q4_SPLIT_K_MAX_N", 0)
    fused, plain = [await _load(load_pte, pte, fuse, monkeypatch) for fuse in (True, False)]
    names = [n for n, _ in fused.graph.calls]
    group = "pte_wgpu.rms_q4_linear_bias_group" if bias else "pte_wgpu.rms_q4_linear_group"
    assert all(op in names for op in (group, "pte_wgpu.q4_linear_residual")), names
    folds = kernel_variants == "gpu" and fused.subgroups
    shaders = [d.shader or "" for d in fused.graph.dispatches]
    assert any("sq0 = sq0 + e0a * e0a" in s for s in shaders) == folds  # one row's squares summed in the products
    assert any("rstd[row] = " in s for s in shaders) == folds  # more rows' in a dispatch of their own
    assert any("rstd[row] = inverseSqrt(c0 " in s for s in shaders) == (folds and split)  # the split's subgroups' sums added
    rng = np.random.default_rng(17)
    pool = rng.standard_normal((16, 2048)).astype(np.float16 if half else np.float32)
    alone = [await fused.execute(pool[i : i + 1]) for i in range(16)]
    for m in (1, 24, 16, 2, 17, 9, 1):
        rows = rng.permutation(16)[:m] if m <= 16 else None
        x = np.ascontiguousarray(pool[rows]) if m <= 16 else rng.standard_normal((m, 2048)).astype(pool.dtype)
        got, want = await fused.execute(x), await plain.execute(x)
        for i, (g, w) in enumerate(zip(got, want)):
            if folds and m <= 16:
                np.testing.assert_array_equal(g, np.concatenate([alone[r][i] for r in rows]), err_msg=f"{m} rows, output {i}")
                scale = float(np.abs(w.astype(np.float32)).max())
                np.testing.assert_allclose(g, w, rtol=0, atol=(4e-3 if half else 2e-6) * scale, err_msg=f"{m} rows, output {i}")
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"{m} rows, output {i}")
        if not half:
            with torch.no_grad():
                eager = module(torch.from_numpy(x))
            for g, e in zip(got, eager):
                np.testing.assert_allclose(g, e.numpy(), rtol=1e-3, atol=1e-3 * float(e.abs().max()))
