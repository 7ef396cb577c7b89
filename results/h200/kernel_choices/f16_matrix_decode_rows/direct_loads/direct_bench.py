"""A decode-rows f16 product on subgroup matrices reading both operands straight from storage (no
workgroup memory, no barriers), against the runtime's DECODE_MATRIX_TILE: C [64, N] = A [64, K] W [N, K]^T.

env: SHAPES="N,K ..." , M (rows, <= 64), COPIES, VARIANTS="U:SPLITS:COLS ..." (U k-steps of 16 a loop
iteration, SPLITS of K, COLS 16-wide column matrices a subgroup)
"""
import os
import time

import numpy as np

import async_runtime  # noqa: F401
import wgpu
from async_runtime import pipelines
from pte_wgpu.kernels.matmul import gemm
from pte_wgpu.kernels.wgsl import flat_grid

U = wgpu.BufferUsage

DIRECT = """
enable chromium_experimental_subgroup_matrix;
@group(0) @binding(0) var<storage, read> a: array<f16>;
@group(0) @binding(1) var<storage, read> w: array<f16>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
struct P { n: u32, k: u32, kspan: u32, pad: u32 }
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg: u32) {
    let n0 = (wid.x * 4u + sg) * ${COLS16}u;
    let kb = wid.y * p.kspan;
    let ke = min(kb + p.kspan, p.k);
${ACCS}
    for (var k = kb; k < ke; k = k + ${STEP}u) {
${LOADS}
${MMAS}
    }
    let base = wid.y * 64u * p.n;
${STORES}
}
"""


def direct_shader(u, cols):
    accs = [f"    var c{i}_{j} = subgroup_matrix_result<f32, 16, 16>();" for i in range(4) for j in range(cols)]
    loads, mmas = [], []
    for s in range(u):
        kk = f"k + {16 * s}u"
        loads += [f"        let l{s}_{i} = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>(&a, {16 * i}u * p.k + {kk}, p.k);" for i in range(4)]
        loads += [f"        let r{s}_{j} = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, col_major>(&w, (n0 + {16 * j}u) * p.k + {kk}, p.k);" for j in range(cols)]
        mmas += [f"        c{i}_{j} = subgroupMatrixMultiplyAccumulate(l{s}_{i}, r{s}_{j}, c{i}_{j});" for i in range(4) for j in range(cols)]
    stores = [f"    subgroupMatrixStore<row_major>(&c, base + {16 * i}u * p.n + n0 + {16 * j}u, c{i}_{j}, p.n);" for i in range(4) for j in range(cols)]
    return (DIRECT.replace("${COLS16}", str(16 * cols)).replace("${STEP}", str(16 * u)).replace("${ACCS}", "\n".join(accs))
            .replace("${LOADS}", "\n".join(loads)).replace("${MMAS}", "\n".join(mmas)).replace("${STORES}", "\n".join(stores)))


SUM = """
@group(0) @binding(0) var<storage, read> c: array<f32>;
@group(0) @binding(1) var<storage, read_write> o: array<f16>;
struct P { n: u32, m: u32, splits: u32, pad: u32 }
@group(0) @binding(2) var<uniform> p: P;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.m * p.n) { return; }
    var s = 0.0;
    for (var t = 0u; t < p.splits; t = t + 1u) { s = s + c[t * 64u * p.n + i]; }
    o[i] = f16(s);
}
"""


def main():
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    print(adapter.summary, flush=True)
    keys = ("max-compute-workgroup-storage-size", "max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage")
    feats = [f for f in ("chromium-experimental-subgroup-matrix", "subgroups", "subgroup", "shader-f16") if f in adapter.features]
    d = adapter.request_device_sync(required_features=feats, required_limits={k: adapter.limits[k] for k in keys})
    m = int(os.environ.get("M", "64"))
    copies = int(os.environ.get("COPIES", "6"))
    rng = np.random.default_rng(0)
    for shape in os.environ["SHAPES"].split():
        n, k = (int(x) for x in shape.split(","))
        a = np.zeros((64, k), np.float16)
        a[:m] = rng.uniform(-1, 1, (m, k))
        w = rng.uniform(-1, 1, (n, k)).astype(np.float16)
        want = a[:m].astype(np.float64) @ w.T.astype(np.float64)
        ba = d.create_buffer_with_data(data=a.tobytes(), usage=U.STORAGE)
        ws = [d.create_buffer_with_data(data=w.tobytes(), usage=U.STORAGE) for _ in range(copies)]
        bo = d.create_buffer(size=m * n * 2, usage=U.STORAGE | U.COPY_SRC)
        bc = d.create_buffer(size=8 * 64 * n * 4, usage=U.STORAGE)
        done = d.create_buffer(size=16, usage=U.STORAGE | U.COPY_SRC)
        runs = []
        # the runtime's tile, its split
        tile = gemm.DECODE_MATRIX_TILE
        src = gemm.gemm_shader(gemm.weight_load("f16", "f16", k), False, tile=tile, out="f16")
        pipe = d.create_compute_pipeline(layout="auto", compute={"module": pipelines.shader_module(d, pipelines.wgsl_for_device(src)), "entry_point": "main"})
        splits, kspan = gemm.gemm_split(m, n, k, 1, tile)
        bp = d.create_buffer_with_data(data=gemm.params_bytes(m, n, k, split=(splits, kspan)), usage=U.UNIFORM)
        bs = d.create_buffer(size=16 * m * n * 4, usage=U.STORAGE)
        rp = d.create_compute_pipeline(layout="auto", compute={"module": pipelines.shader_module(d, pipelines.wgsl_for_device(gemm.gemm_reduce_shader(False, out="f16"))), "entry_point": "main"})
        bgs = [d.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate((ba, wb, bo, bp, bs))]) for wb in ws]
        rbg = d.create_bind_group(layout=rp.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate((bs, bo, bp))])
        runs.append((f"runtime tile s{splits}", [(pipe, bgs, gemm.gemm_grid("t", m, n, 1, splits, tile))] + ([(rp, [rbg], flat_grid(m * n))] if splits > 1 else [])))
        for v in os.environ.get("VARIANTS", "1:1:2 2:1:2 4:1:2 2:2:2 2:4:2 2:1:1 4:1:1").split():
            u, sp, cols = (int(x) for x in v.split(":"))
            kspan = -(-k // sp // (16 * u)) * 16 * u
            sp = -(-k // kspan)
            try:
                dp = d.create_compute_pipeline(layout="auto", compute={"module": pipelines.shader_module(d, pipelines.wgsl_for_device(direct_shader(u, cols))), "entry_point": "main"})
            except Exception as e:
                print(v, str(e).splitlines()[0])
                continue
            sp_ = d.create_compute_pipeline(layout="auto", compute={"module": pipelines.shader_module(d, pipelines.wgsl_for_device(SUM)), "entry_point": "main"})
            dpar = d.create_buffer_with_data(data=np.array([n, k, kspan, 0], np.uint32).tobytes(), usage=U.UNIFORM)
            spar = d.create_buffer_with_data(data=np.array([n, m, sp, 0], np.uint32).tobytes(), usage=U.UNIFORM)
            dbgs = [d.create_bind_group(layout=dp.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate((ba, wb, bc, dpar))]) for wb in ws]
            sbg = d.create_bind_group(layout=sp_.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate((bc, bo, spar))])
            runs.append((f"direct u{u} s{sp} cols{cols}", [(dp, dbgs, (n // (64 * cols), sp, 1)), (sp_, [sbg], flat_grid(m * n))]))
        for name, steps in runs:
            def submit(reps):
                enc = d.create_command_encoder()
                cp = enc.begin_compute_pass()
                for r in range(reps):
                    for pipe_, groups, grid in steps:
                        cp.set_pipeline(pipe_)
                        cp.set_bind_group(0, groups[r % len(groups)])
                        cp.dispatch_workgroups(*grid)
                cp.end()
                d.queue.submit([enc.finish()])
            submit(1)
            got = np.frombuffer(d.queue.read_buffer(bo), np.float16).reshape(m, n).astype(np.float64)
            err = np.abs(got - want).max() / np.abs(want).max()
            reps = max(3 * copies, int(2e10 / (m * n * k)))
            times = []
            for _ in range(5):
                t = time.perf_counter()
                submit(reps)
                d.queue.read_buffer(done)
                times.append((time.perf_counter() - t) / reps)
            med = sorted(times)[2]
            print(f"{m}x{n}x{k} {name:22s} rel err {err:.1e} {med * 1e6:8.1f} us {2 * n * k * 2 / med / 1e12:5.2f} TB/s of weights", flush=True)


main()
