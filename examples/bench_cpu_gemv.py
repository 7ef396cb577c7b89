"""The CPU adapters' products alone, at SmolLM2-135M's shapes, by the CPU time of this process (all
its threads, the driver's workers included: on lavapipe the kernels' work), which a machine busy
with other work inflates far less than wall clock. Each kernel is the runtime's own WGSL.

    PYTHONPATH=. python examples/bench_cpu_gemv.py [--reps 5] [--rows 64]

Rows: fp32 one input row (decode) by a weight, the one-invocation-a-row GEMV (GEMV_T_CPU) against
the subgroup GEMV (kernels/linear.py); fp32 `--rows` input rows (a prompt), the tiled GEMM against
the subgroup kernel of SG_GEMM's shape; 4-bit weights (group 32), one row, the 256-invocation
GEMV against the subgroup GEMV (kernels/quantized.py). Each output is checked against numpy.
Needs an adapter with the "subgroup" feature. Best of `--reps` (a shared machine only slows runs).
"""

import argparse
import struct
import time

import numpy as np
import wgpu

from kernels import gemm as G
from kernels import linear as L
from kernels import quantized as Q

SHAPES = ((49152, 576), (1536, 576), (576, 1536))  # (N, K): the LM head, an MLP up/gate, down


def dispatch_time(dev, shader, arrays, out_len, uniform, grid, reps, after=()):
    """(best CPU seconds of one dispatch, its output); `after`: arrays bound after the uniform."""
    bufs = [dev.create_buffer_with_data(data=a, usage=wgpu.BufferUsage.STORAGE) for a in arrays]
    out = dev.create_buffer(size=4 * out_len, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    u = dev.create_buffer_with_data(data=uniform, usage=wgpu.BufferUsage.UNIFORM)
    extra = [dev.create_buffer_with_data(data=a, usage=wgpu.BufferUsage.STORAGE) for a in after]
    pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=shader), "entry_point": "main"})
    group = dev.create_bind_group(
        layout=pipeline.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate([*bufs, out, u, *extra])]
    )

    def once():
        enc = dev.create_command_encoder()
        p = enc.begin_compute_pass()
        p.set_pipeline(pipeline)
        p.set_bind_group(0, group)
        p.dispatch_workgroups(*grid)
        p.end()
        dev.queue.submit([enc.finish()])
        return np.frombuffer(dev.queue.read_buffer(out), np.float32)

    result = once()  # the first dispatch compiles
    best = float("inf")
    for _ in range(reps):
        c = time.process_time()
        once()
        best = min(best, time.process_time() - c)
    return best, result


def fp32_rows(dev, m, reps):
    rng = np.random.default_rng(0)
    for n, k in SHAPES:
        a, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
        ref = a.astype(np.float64) @ w.T.astype(np.float64)
        if m == 1:
            kernels = [("one invocation a row", L.gemv_shader(True, False, cpu=True), (L.CPU_WG, L.CPU_GROUP_ROWS))]
            kernels.append(("subgroup GEMV", L.gemv_sg_shader(False), (L.sg_wg_rows(L.SG_GEMV), 1)))
        else:
            kernels = [("tiled GEMM", G.gemm_shader(G.float_load(True), False), None)]
            kernels.append((f"subgroup {L.SG_GEMM[0]} x {L.SG_GEMM[1]}", L.gemv_sg_shader(False, L.SG_GEMM), (L.sg_wg_rows(L.SG_GEMM), L.SG_GEMM[0])))
        for name, shader, per in kernels:
            grid = G.gemm_grid("bench", m, n, 1) if per is None else L.gemv_grid("bench", n, True, -(-m // per[1]), per[0])
            scratch = [np.zeros(4, np.float32)] if per is None else []  # the GEMM's split-K sums (one split here)
            t, got = dispatch_time(dev, shader, [a, w], m * n, G.params_bytes(m, n, k), grid, reps, scratch)
            err = np.abs(got.reshape(m, n) - ref).max() / np.abs(ref).max()
            rate = f"{n * k * 4 / t / 1e9:.2f} GB of weights" if m == 1 else f"{2 * m * n * k / t / 1e9:.2f} GFLOP"
            print(f"fp32 {m} x {k} by {n} x {k}, {name}: {t * 1e3:.1f} CPU-ms, {rate} a CPU-second (rel. error {err:.1e})")


def q4_rows(dev, reps, gs=32):
    rng = np.random.default_rng(0)
    for n, k in SHAPES:
        wq = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32)
        ws = (rng.random((k // gs, n)) * 0.02).astype(np.float32)
        x = rng.standard_normal(k).astype(np.float32)
        nibbles = ((wq[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15).reshape(n, k).astype(np.float64) - 8
        ref = (nibbles * np.repeat(ws.T, gs, axis=1)) @ x
        uniform = struct.pack(Q.LIN_FORMAT, 1, n, k, k // 8, n, k // gs, gs, k // 8)
        for name, shader, per in (
            ("256-invocation GEMV", Q.gemv_shader(False, False, False, True), Q.GEMV_ROWS),
            ("subgroup GEMV", Q.sg_gemv_shader(False, False, False), L.sg_wg_rows(L.SG_GEMV)),
        ):
            t, got = dispatch_time(dev, shader, [x, wq, ws], n, uniform, (-(-n // per), 1, 1), reps)
            err = np.abs(got - ref).max() / np.abs(ref).max()
            print(f"4-bit 1 x {k} by {n} x {k}, {name}: {t * 1e3:.1f} CPU-ms, {n * k / t / 1e9:.2f} G weights a CPU-second (rel. error {err:.1e})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rows", type=int, default=64, help="input rows of the prompt-shaped products")
    args = p.parse_args()
    adapter = wgpu.gpu.request_adapter_sync()
    if "subgroup" not in adapter.features:
        raise SystemExit(f"{adapter.summary} has no subgroup feature")
    dev = adapter.request_device_sync(required_features=["subgroup"])
    print(adapter.summary)
    fp32_rows(dev, 1, args.reps)
    fp32_rows(dev, args.rows, args.reps)
    q4_rows(dev, args.reps)


if __name__ == "__main__":
    main()
