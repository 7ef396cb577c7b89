"""The CPU adapters' products alone, at SmolLM2-135M's shapes, by the CPU time of this process (all
its threads, the driver's workers included: on lavapipe the kernels' work), which a machine busy
with other work inflates far less than wall clock. Each kernel is the runtime's own WGSL.

    PYTHONPATH=. python examples/bench_cpu_gemv.py [--reps 5] [--rows 64] [--dtype f32,f16] [--only float,q4]

Rows, for each storage type of the input, weights and output (f32, f16): one input row (decode)
by a weight, the one-invocation-a-row GEMV (GEMV_T_CPU) against the subgroup GEMV
(kernels/matmul/linear.py); `--rows` input rows (a prompt), the tiled GEMM against the subgroup kernel
of SG_GEMM's shape; 4-bit weights (group 32) with activations of that type, one row and `--rows`
rows, the 256-invocation GEMV and the tiled 4-bit GEMM against the subgroup kernels
(kernels/matmul/q4_linear.py). Each output is checked against numpy. Needs an adapter with the
"subgroup" feature (and "shader-f16" for f16). Best of `--reps` (a shared machine only slows runs).
"""

import argparse
import struct
import time

import numpy as np
import wgpu

from pte_wgpu.kernels.matmul import gemm as G
from pte_wgpu.kernels.matmul import linear as L
from pte_wgpu.kernels.matmul import q4_linear as Q

SHAPES = ((49152, 576), (1536, 576), (576, 1536))  # (N, K): the LM head, an MLP up/gate, down


NP = {"f32": np.float32, "f16": np.float16}


def dispatch_time(dev, shader, arrays, out_len, uniform, grid, reps, after=(), out="f32"):
    """(best CPU seconds of one dispatch, its output as float64); `after`: arrays bound after the
    uniform; `out`: the output's storage type."""
    if "f16" in shader:
        shader = "enable f16;\n" + shader
    bufs = [dev.create_buffer_with_data(data=a, usage=wgpu.BufferUsage.STORAGE) for a in arrays]
    size = -(-out_len * np.dtype(NP[out]).itemsize // 4) * 4
    out_buf = dev.create_buffer(size=size, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    u = dev.create_buffer_with_data(data=uniform, usage=wgpu.BufferUsage.UNIFORM)
    extra = [dev.create_buffer_with_data(data=a, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.UNIFORM) for a in after]
    pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=shader), "entry_point": "main"})
    entries = [{"binding": i, "resource": {"buffer": b}} for i, b in enumerate([*bufs, out_buf, u, *extra])]
    group = dev.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)

    def once():
        enc = dev.create_command_encoder()
        p = enc.begin_compute_pass()
        p.set_pipeline(pipeline)
        p.set_bind_group(0, group)
        p.dispatch_workgroups(*grid)
        p.end()
        dev.queue.submit([enc.finish()])
        return np.frombuffer(dev.queue.read_buffer(out_buf), NP[out])[:out_len].astype(np.float64)

    result = once()  # the first dispatch compiles
    best = float("inf")
    for _ in range(reps):
        c = time.process_time()
        once()
        best = min(best, time.process_time() - c)
    return best, result


def float_rows(dev, m, reps, t):
    rng = np.random.default_rng(0)
    types = L.Storage(t, t, t, t)
    for n, k in SHAPES:
        a, w = rng.standard_normal((m, k)).astype(NP[t]), rng.standard_normal((n, k)).astype(NP[t])
        ref = a.astype(np.float64) @ w.T.astype(np.float64)
        if m == 1:
            kernels = [("one invocation a row", L.gemv_shader(True, False, cpu=True, types=types), (L.CPU_WG, L.CPU_GROUP_ROWS))]
            kernels.append(("subgroup GEMV", L.gemv_sg_shader(False, types=types), (L.sg_wg_rows(L.SG_GEMV), 1)))
        else:
            kernels = [("tiled GEMM", G.gemm_shader(G.float_load(True, t, t), False, out=t), None)]
            shader = L.gemv_sg_shader(False, L.SG_GEMM, types)
            kernels.append((f"subgroup {L.SG_GEMM[0]} x {L.SG_GEMM[1]}", shader, (L.sg_wg_rows(L.SG_GEMM), L.SG_GEMM[0])))
        for name, shader, per in kernels:
            grid = G.gemm_grid("bench", m, n, 1) if per is None else L.gemv_grid("bench", n, True, -(-m // per[1]), per[0])
            scratch = [np.zeros(4, np.float32)] if per is None else []  # the GEMM's split-K sums (one split here)
            secs, got = dispatch_time(dev, shader, [a, w], m * n, G.params_bytes(m, n, k), grid, reps, scratch, t)
            err = np.abs(got.reshape(m, n) - ref).max() / np.abs(ref).max()
            rate = f"{n * k * w.itemsize / secs / 1e9:.2f} GB of weights" if m == 1 else f"{2 * m * n * k / secs / 1e9:.2f} GFLOP"
            print(f"{t} {m} x {k} by {n} x {k}, {name}: {secs * 1e3:.1f} CPU-ms, {rate} a CPU-second (rel. error {err:.1e})")


def q4_rows(dev, m, reps, t, gs=32):
    rng = np.random.default_rng(0)
    types = Q.Storage(x=t, out=t)
    for n, k in SHAPES:
        wq = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
        ws = (rng.random((k // gs, n)) * 0.02).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(NP[t])
        nibbles = ((wq[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15).reshape(n, k).astype(np.float64) - 8
        ref = x.astype(np.float64) @ (nibbles * np.repeat(ws.T, gs, axis=1)).T
        uniform = struct.pack(Q.LIN_FORMAT, m, n, k, k // 8, n, k // gs, gs, k // 8)
        sg = Q.Q4_SG_GEMV if m == 1 else Q.Q4_SG_GEMM
        if m == 1:
            kernels = [("256-invocation GEMV", Q.gemv_shader(False, False, False, gs, Q.GEMV_WG, types), (-(-n // Q.gemv_outputs(Q.GEMV_WG)), 1, 1), ())]
        else:  # the GEMM reads the uniform P at binding 4, its scratch at 5 and Q at 6
            load = Q.q4_load(False, False, gs, k, types)
            q_wgsl = f"{Q.LIN_STRUCT};\n@group(0) @binding(6) var<uniform> q: Q;\n"
            shader = G.gemm_shader(load, False, q_wgsl, out=t)
            kernels = [("tiled 4-bit GEMM", shader, G.gemm_grid("bench", m, n, 1), (np.zeros(4, np.float32), np.frombuffer(uniform, np.uint32)))]
        grid = (-(-n // L.sg_wg_rows(sg)), 1, -(-m // sg[0]))
        kernels.append((f"subgroup {sg[0]} x {sg[1]}", Q.sg_shader(False, False, False, sg, types, gs=gs), grid, ()))
        for name, shader, grid, after in kernels:
            params = G.params_bytes(m, n, k) if after else uniform
            secs, got = dispatch_time(dev, shader, [x, wq, ws], m * n, params, grid, reps, after, t)
            err = np.abs(got.reshape(m, n) - ref).max() / np.abs(ref).max()
            print(f"4-bit, {t} {m} x {k} by {n} x {k}, {name}: {secs * 1e3:.1f} CPU-ms, {m * n * k / secs / 1e9:.2f} G weight-products a CPU-second (rel. error {err:.1e})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rows", type=int, default=64, help="input rows of the prompt-shaped products")
    p.add_argument("--dtype", default="f32,f16", help="storage types to run, comma-separated")
    p.add_argument("--only", default="float,q4", help="families to run: float, q4")
    args = p.parse_args()
    adapter = wgpu.gpu.request_adapter_sync()
    if "subgroup" not in adapter.features:
        raise SystemExit(f"{adapter.summary} has no subgroup feature")
    dev = adapter.request_device_sync(required_features=[f for f in ("subgroup", "shader-f16") if f in adapter.features])
    print(adapter.summary)
    for t in args.dtype.split(","):
        for m in (1, args.rows):
            if "float" in args.only:
                float_rows(dev, m, args.reps, t)
            if "q4" in args.only:
                q4_rows(dev, m, args.reps, t)


if __name__ == "__main__":
    main()
