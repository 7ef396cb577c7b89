"""The query-tiled attention kernel (TILED, "old") against product_tiles.py ("new"), alone: ViT-B/16's
attention (197 tokens, 96 and 12 heads; every key), causal prompts of 2,047 rows (9 heads, as SmolLM2;
32 query heads over 8 kv heads, as Llama-3.2-1B), head dim 64, f32; timed and checked against float64.
usage (from the checkout's root): python3 attbench.py VARIANT [S]; run each variant in a process of its own."""
import math
import struct
import sys

import numpy as np

sys.path.insert(0, "results/h200/kernel_choices")
sys.path.insert(0, "results/h200/kernel_choices/attention_product_tiles")
from gemm_bench import U, bind, buf, dev, timed  # noqa: E402
from pte_wgpu.kernels.attention import kv_cache_sdpa as K  # noqa: E402

from async_runtime.pipelines import compile_pipeline  # noqa: E402


def run(variant, hq, hkv, s, causal, dim=64):
    if variant == "old":
        src = K.tiled_shader(False, dim, encoder=not causal)
    elif variant.startswith("h2"):  # TILED with its dims in two halves at dim 64: "h2s<subs>[kv<KV_BYTES>]"
        subs, _, kvb = variant[3:].partition("kv")
        K.KV_BYTES = int(kvb or K.KV_BYTES)
        bk = K.KV_BYTES // (8 * dim + 4 * K.TILE_ROWS * 2) // int(subs) * int(subs)
        K.tiled_shape = lambda d: K.TiledShape(d, 2, int(subs), bk)
        src = K.tiled_shader(False, dim, encoder=not causal)
    else:
        import product_tiles
        src = (product_tiles.unrolled if variant == "unrolled" else product_tiles.shader)(not causal)
    src = "alias QT = f32;\nalias KCT = f32;\nalias VCT = f32;\nalias OT = f32;\n" + src
    rng = np.random.default_rng(0)
    q = rng.standard_normal((hq, s, dim)).astype(np.float32)
    k = rng.standard_normal((hkv, s, dim)).astype(np.float32)
    v = rng.standard_normal((hkv, s, dim)).astype(np.float32)
    out = dev.create_buffer(size=q.nbytes, usage=U.STORAGE | U.COPY_SRC)
    scale = 1 / math.sqrt(dim)
    if causal:  # a plain cache [rows, heads, dim]
        qb, kb, vb = (buf(np.ascontiguousarray(a.transpose(1, 0, 2))) for a in (q, k, v))
        p = struct.pack("<5If6I", s, 0, hq, hkv, dim, scale, 0, 0, 0, 0, 0, 0)
        binds = [qb, kb, vb, out, buf(np.frombuffer(p, np.uint8), U.UNIFORM)]
    else:
        qb, kb, vb = buf(q), buf(k), buf(v)
        p = struct.pack("<5If6I", s, s, hq, hkv, dim, scale, 0, 0, 0, 0, 0, 0)
        e = struct.pack("<16I", hq, 0, s, 1, 0, 0, s, 1, 0, 0, s, 1, 0, 0, 0, 0)
        binds = [qb, kb, vb, out, buf(np.frombuffer(p, np.uint8), U.UNIFORM), buf(np.frombuffer(e, np.uint8), U.UNIFORM)]
    pipe = compile_pipeline(dev, src)
    grid = (hq, -(-s // 32), 1)
    us = timed([pipe], [bind(pipe, binds)], [grid], int(__import__("os").environ.get("REPS", 50)), out)
    got = np.frombuffer(dev.queue.read_buffer(out), np.float32).reshape((s, hq, dim) if causal else q.shape)
    if causal:
        got = got.transpose(1, 0, 2)
    kk = np.repeat(k, hq // hkv, axis=0).astype(np.float64)
    vv = np.repeat(v, hq // hkv, axis=0).astype(np.float64)
    sc = np.einsum("hsd,hld->hsl", q.astype(np.float64), kk) * scale
    if causal:
        sc = sc + np.triu(np.full((s, s), -np.inf), 1)
    pr = np.exp(sc - sc.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    ref = np.einsum("hsl,hld->hsd", pr, vv)
    err = np.abs(got - ref).max()
    flops = 4 * hq * s * s * dim / (2 if causal else 1)
    print(f"{variant:4s} heads {hq:3d}/{hkv:2d} s {s:5d} causal {causal:d}: {us:8.1f} us {flops / us / 1e6:6.2f} TFLOP/s err {err:.1e}", flush=True)
    assert err < 1e-4, err


variant = sys.argv[1]
S = int(sys.argv[2]) if len(sys.argv) > 2 else 2047
for hq, hkv, s, causal in ((96, 96, 197, False), (12, 12, 197, False), (9, 3, S, True), (32, 8, S, True)):
    run(variant, hq, hkv, s, causal)
