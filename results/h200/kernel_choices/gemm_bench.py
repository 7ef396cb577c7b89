"""What the standalone GEMM benches share (imported from their folders' scripts): the device with the
adapter's binding limits, buffers, bind groups, timing a pipeline sequence dispatched over and over in
one pass (wall time over the submit, the best of three rounds after one warm-up dispatch), and a
4-bit weight of group 32 with its float64 reference product."""
import struct
import time

import numpy as np
import wgpu

from async_runtime.pipelines import compile_pipeline  # noqa: F401 (the benches' too)
from pte_wgpu.kernels.matmul.q4_linear import LIN_FORMAT, LIN_STRUCT

adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
_lim = adapter.limits
dev = adapter.request_device_sync(required_features=[f for f in ("shader-f16",) if f in adapter.features], required_limits={
    name: _lim[name] for name in ("max-storage-buffer-binding-size", "max-buffer-size", "max-compute-workgroup-storage-size")})
print(adapter.info["device"], flush=True)
U = wgpu.BufferUsage


def buf(a, usage=U.STORAGE):
    return dev.create_buffer_with_data(data=np.ascontiguousarray(a).tobytes(), usage=usage | U.COPY_SRC)


def bind(p, bufs):
    return dev.create_bind_group(layout=p.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(bufs)])


def timed(pipes, bgs, grids, reps, out):
    """Microseconds a pass of `pipes` (bind groups `bgs`, grids `grids`) takes; `out` read back to wait."""
    times = []
    for t in range(4):
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        for _ in range(reps if t else 1):
            for p, bg, grid in zip(pipes, bgs, grids):
                cp.set_pipeline(p)
                cp.set_bind_group(0, bg)
                cp.dispatch_workgroups(*grid)
        cp.end()
        t0 = time.perf_counter()
        dev.queue.submit([enc.finish()])
        dev.queue.read_buffer(out, size=4)
        times.append((time.perf_counter() - t0) / (reps if t else 1))
    return min(times[1:]) * 1e6


def q4_operands(x, N, K, rng, gs=32):
    """(buffers of a random [N, K] 4-bit weight of group `gs` and its scales, by quads of weight rows
    [N / 4, groups, 4] as the kernels read them, the uniform's WGSL (binding after out, p and the
    scratch), its buffer, x @ W.T in float64)."""
    M, wpr, groups = x.shape[0], K // 8, K // gs
    wq = rng.integers(0, 2**32, size=(N, wpr), dtype=np.uint32)
    ws = (rng.random((N // 4, groups, 4), dtype=np.float32) * 0.02).astype(np.float32)
    nib = ((wq[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15).astype(np.float32).reshape(N, K) - 8
    scale = ws.transpose(0, 2, 1).reshape(N, groups)
    ref = x.astype(np.float64) @ (nib * np.repeat(scale, gs, axis=1)).T.astype(np.float64)
    uniform = f"{LIN_STRUCT};\n@group(0) @binding(6) var<uniform> q: Q;\n"
    qb = buf(np.frombuffer(struct.pack(LIN_FORMAT, M, N, K, wpr, groups, gs, wpr), np.uint8), U.UNIFORM)
    return [buf(wq), buf(ws)], uniform, qb, ref


def spin():
    """~0.3 s of GPU work first, so that clocks are up before a case's first tile."""
    from pte_wgpu.kernels.matmul import gemm as G

    n = 2048
    a, w = buf(np.ones((n, n), np.float32)), buf(np.ones((n, n), np.float32))
    out = dev.create_buffer(size=n * n * 4, usage=U.STORAGE | U.COPY_SRC)
    pb = buf(np.frombuffer(G.params_bytes(n, n, n), np.uint8), U.UNIFORM)
    p = compile_pipeline(dev, G.gemm_shader(G.float_load(True), False, "", tile=G.TILE))
    timed([p], [bind(p, [a, w, out, pb, out])], [G.gemm_grid("x", n, n, 1, 1, G.TILE)], 300, out)


def tile_tflops(kind, M, N, K, tiles, quick=False, tol=1e-4, errors=None):
    """{name: TFLOP/s} of an M x N x K product in each of `tiles` ((name, Tile) pairs), timed twice,
    alternately (the better figure), with the runtime's K splits for each: "f32" [N, K] weights
    (weight_load) or "q4" 4-bit weights of group 32 (q4_load); every result checked against numpy."""
    from pte_wgpu.kernels.matmul import gemm as G
    from pte_wgpu.kernels.matmul.q4_linear import q4_load
    from pte_wgpu.kernels.wgsl import flat_grid

    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K)).astype(np.float32)
    extra_wgsl, more = "", []
    if kind == "f32":
        w = rng.standard_normal((N, K)).astype(np.float32)
        ins, ref, load = [buf(x), buf(w)], x.astype(np.float64) @ w.T.astype(np.float64), G.weight_load("f32", "f32", K)
    else:
        weights, extra_wgsl, qb, ref = q4_operands(x, N, K, rng)
        ins, more, load = [buf(x), *weights], [qb], q4_load(False, False, 32, K)
    out = dev.create_buffer(size=M * N * 4, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
    scratch = dev.create_buffer(size=max(4, G.ROW_MAX_SPLITS * M * N * 4), usage=U.STORAGE)
    reps = 2 if quick else max(10, int(25e-3 / (2 * M * N * K / 30e12)))
    if not quick:
        spin()
    res = {}
    for name, tile in list(tiles) * 2:
        splits, kspan = G.gemm_split(M, N, K, 1, tile, dequantizes=kind == "q4")
        pb = buf(np.frombuffer(G.params_bytes(M, N, K, split=(splits, kspan)), np.uint8), U.UNIFORM)
        p = compile_pipeline(dev, G.gemm_shader(load, False, extra_wgsl, tile=tile))
        pipes, bufs, grids = [p], [[*ins, out, pb, scratch, *more]], [G.gemm_grid("x", M, N, 1, splits, tile)]
        if splits > 1:
            r = compile_pipeline(dev, G.gemm_reduce_shader(False))
            pipes.append(r)
            bufs.append([scratch, out, pb])
            grids.append(flat_grid(M * N))
        dev.queue.write_buffer(out, 0, np.zeros(M * N, np.float32).tobytes())
        us = timed(pipes, [bind(p, b) for p, b in zip(pipes, bufs)], grids, reps, out)
        got = np.frombuffer(dev.queue.read_buffer(out), np.float32).reshape(M, N)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < tol, (kind, M, N, K, name, err)
        if errors is not None:
            errors[name] = err
        res[name] = max(res.get(name, 0.0), 2 * M * N * K / us / 1e6)
    return res
