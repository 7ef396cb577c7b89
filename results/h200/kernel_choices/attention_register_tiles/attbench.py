"""The query-tiled attention kernels alone: ViT-B/16's attention (197 tokens, 96 and 12 heads), a causal
2,047-row prompt (9 heads; with "kv" variants also 8 heads of dim 128), timed and checked against float64.
usage (from the checkout's root): python3 attbench.py VARIANT ...; VARIANT "kvN": TILED with KV_BYTES = N;
with register_tiles.patch applied, "old" (TILED), "new", or names with "loop", "dyn", "k16", "skippv",
"skips" (the patch's experiment switches ATT_LOOP, ATT_DYN, ATT_KEYS=16, ATT_SKIP)."""
import math
import os
import struct
import sys
import numpy as np
sys.path.insert(0, "results/h200/kernel_choices")
from gemm_bench import dev, buf, bind, timed, U
from async_runtime.pipelines import compile_pipeline
from pte_wgpu.kernels.attention import kv_cache_sdpa as K


def run(variant, heads, s, dim, causal):
    if variant.startswith("kv"):
        K.KV_BYTES = int(variant[2:])
    else:
        from pte_wgpu.kernels.attention import register_tiles as R  # the patch's
        orig = R.takes
        if variant == "old":
            R.takes = lambda d: False
    src = "alias QT = f32;\nalias KCT = f32;\nalias VCT = f32;\nalias OT = f32;\n" + K.tiled_shader(False, dim, encoder=not causal)
    if not variant.startswith("kv"):
        R.takes = orig
    rng = np.random.default_rng(0)
    q = rng.standard_normal((heads, s, dim)).astype(np.float32)
    k = rng.standard_normal((heads, s, dim)).astype(np.float32)
    v = rng.standard_normal((heads, s, dim)).astype(np.float32)
    out = dev.create_buffer(size=q.nbytes, usage=U.STORAGE | U.COPY_SRC)
    scale = 1 / math.sqrt(dim)
    if causal:  # plain cache [rows, heads, dim], one kv head a q head
        qb, kb, vb = (buf(np.ascontiguousarray(a.transpose(1, 0, 2))) for a in (q, k, v))
        p = struct.pack("<5If6I", s, 0, heads, heads, dim, scale, 0, 0, 0, 0, 0, 0)
        binds = [qb, kb, vb, out, buf(np.frombuffer(p, np.uint8), U.UNIFORM)]
    else:
        qb, kb, vb = buf(q), buf(k), buf(v)
        p = struct.pack("<5If6I", s, s, heads, heads, dim, scale, 0, 0, 0, 0, 0, 0)
        e = struct.pack("<16I", heads, 0, s, 1, 0, 0, s, 1, 0, 0, s, 1, 0, 0, 0, 0)
        binds = [qb, kb, vb, out, buf(np.frombuffer(p, np.uint8), U.UNIFORM), buf(np.frombuffer(e, np.uint8), U.UNIFORM)]
    pipe = compile_pipeline(dev, src)
    bg = bind(pipe, binds)
    grid = (heads, -(-s // 32), 1)
    us = timed([pipe], [bg], [grid], int(__import__("os").environ.get("REPS", 50)), out)
    got = np.frombuffer(dev.queue.read_buffer(out), np.float32).reshape(q.shape if not causal else (s, heads, dim))
    if causal:
        got = got.transpose(1, 0, 2)
    sc = np.einsum("hsd,hld->hsl", q.astype(np.float64), k) * scale
    if causal:
        sc = sc + np.triu(np.full((s, s), -np.inf), 1)
    pr = np.exp(sc - sc.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    ref = np.einsum("hsl,hld->hsd", pr, v)
    err = np.abs(got - ref).max()
    flops = 4 * heads * s * s * dim / (2 if causal else 1)
    print(f"{variant:8s} heads {heads:3d} s {s:5d} causal {causal:d}: {us:8.1f} us {flops / us / 1e6:6.2f} TFLOP/s err {err:.1e}", flush=True)

for variant in sys.argv[1:] or ["old", "new"]:
    os.environ.pop("ATT_LOOP", None)
    os.environ.pop("ATT_DYN", None)
    if "loop" in variant:
        os.environ["ATT_LOOP"] = "1"
    os.environ.pop("ATT_SKIP", None)
    if "skip" in variant:
        os.environ["ATT_SKIP"] = variant.split("skip")[1]
    os.environ.pop("ATT_KEYS", None)
    if "k16" in variant:
        os.environ["ATT_KEYS"] = "16"
    if "dyn" in variant:
        os.environ["ATT_DYN"] = "1"
    cases = ((96, 197, False, 64), (12, 197, False, 64), (9, 2047, True, 64)) + (((8, 2047, True, 128),) if variant.startswith("kv") else ())
    for heads, s, causal, dim in cases:
        run(variant, heads, s, dim, causal)
