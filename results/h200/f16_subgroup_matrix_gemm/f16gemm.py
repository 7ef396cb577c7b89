"""f16 x f16 -> f32 GEMM on Dawn's subgroup matrices: C[M,N] = A[M,K] . W[N,K]^T (W as a linear's weight).
Dawn lists f16 configs on NVIDIA only with its toggle vulkan_enable_f16_on_nvidia (shader-f16 is off there by
default). Tiled: workgroup tiles of BM x BN, K steps of BK halves through double-buffered workgroup memory
(operands read as vec4<u32>, 8 halves a load, one step ahead in registers), each subgroup TM x TN result
matrices of 16 x 16. Checks against numpy (float64 of the same halves), times the shapes given.

python3 f16gemm.py [SGM,SGN,TM,TN,BK[,PAD[,DIRECT]]] ...   env: NOROBUST=1 (Dawn's robustness off), SHAPES="M,N,K ...", REPS_MNK (M * N * K a timed submit, 4e10)
"""
import os
import sys
import time

import numpy as np
import wgpudawn
from wgpudawn.backends.dawn import extras

toggles = ["allow_unsafe_apis", "vulkan_enable_f16_on_nvidia"] + (["disable_robustness"] if os.environ.get("NOROBUST") else [])
extras.set_instance_extras(backends=["Vulkan"], enable_toggles=toggles)
wgpudawn.install_as_wgpu()
import wgpu  # noqa: E402


def source(SGM, SGN, TM, TN, BK, PAD=8, DIRECT=0):
    if DIRECT:
        return direct_source(SGM, SGN, TM, TN)
    threads = 32 * SGM * SGN
    BM, BN = SGM * TM * 16, SGN * TN * 16
    row_vecs = BK // 8  # vec4<u32> loads of a tile row's K step
    lds = BK + PAD
    la, lb = BM * row_vecs // threads, BN * row_vecs // threads
    assert la * threads == BM * row_vecs and lb * threads == BN * row_vecs, (BM, BN, BK, threads)
    acc = "\n".join(f"  var c{i}_{j} = subgroup_matrix_result<f32, 16, 16>();" for i in range(TM) for j in range(TN))
    lefts = "\n".join(f"      let l{i} = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>(&As, a0 + {i * 16 * lds}u + kk, {lds}u);" for i in range(TM))
    rights = "\n".join(f"      let r{j} = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, col_major>(&Bs, b0 + {j * 16 * lds}u + kk, {lds}u);" for j in range(TN))
    mmas = "\n".join(f"      c{i}_{j} = subgroupMatrixMultiplyAccumulate(l{i}, r{j}, c{i}_{j});" for i in range(TM) for j in range(TN))
    stores = "\n".join(f"  subgroupMatrixStore<row_major>(&c, (row0 + {i * 16}u) * p.n + col0 + {j * 16}u, c{i}_{j}, p.n);" for i in range(TM) for j in range(TN))

    def loads(x, count):  # vec4 v = i * threads + li of the tile: row v / row_vecs, 8 halves at 8 * (v % row_vecs)
        return "\n".join(f"    let {x}v{i} = {x}g[(({x}r0 + ({i}u * {threads}u + li) / {row_vecs}u) * p.k + k0) / 8u + ({i}u * {threads}u + li) % {row_vecs}u];"
                         for i in range(count))

    def keep(x, arr, rows, count):
        out = []
        for i in range(count):
            out.append(f"    {{ let v = {i}u * {threads}u + li; let at = buf * {rows * lds}u + (v / {row_vecs}u) * {lds}u + (v % {row_vecs}u) * 8u;")
            for w, comp in enumerate("xyzw"):
                out.append(f"      let h{w} = bitcast<vec2<f16>>({x}v{i}.{comp}); {arr}[at + {2 * w}u] = h{w}.x; {arr}[at + {2 * w + 1}u] = h{w}.y;")
            out.append("    }")
        return "\n".join(out)

    return f"""
enable f16;
enable chromium_experimental_subgroup_matrix;
enable subgroups;
diagnostic(off, subgroup_uniformity);
struct P {{ m: u32, n: u32, k: u32 }}
@group(0) @binding(0) var<storage, read> ag: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> bg: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
var<workgroup> As: array<f16, {2 * BM * lds}>;
var<workgroup> Bs: array<f16, {2 * BN * lds}>;
@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sg: u32) {{
  let sm = sg / {SGN}u;
  let sn = sg % {SGN}u;
  let ar0 = wg.y * {BM}u;
  let br0 = wg.x * {BN}u;
  let row0 = ar0 + sm * {TM * 16}u;
  let col0 = br0 + sn * {TN * 16}u;
{acc}
  let steps = p.k / {BK}u;
  var k0 = 0u;
  var buf = 0u;
  {{
{loads('a', la)}
{loads('b', lb)}
{keep('a', 'As', BM, la)}
{keep('b', 'Bs', BN, lb)}
  }}
  workgroupBarrier();
  for (var t = 0u; t < steps; t++) {{
    let more = t + 1u < steps;
    k0 = select(0u, (t + 1u) * {BK}u, more);
{loads('a', la)}
{loads('b', lb)}
    let a0 = buf * {BM * lds}u + sm * {TM * 16 * lds}u;
    let b0 = buf * {BN * lds}u + sn * {TN * 16 * lds}u;
    for (var kk = 0u; kk < {BK}u; kk += 16u) {{
{lefts}
{rights}
{mmas}
    }}
    buf = 1u - buf;
    if (more) {{
{keep('a', 'As', BM, la)}
{keep('b', 'Bs', BN, lb)}
    }}
    workgroupBarrier();
  }}
{stores}
}}
""", (BM, BN, threads)


def direct_source(SGM, SGN, TM, TN):
    """No workgroup memory: each subgroup loads its matrices straight from the storage buffers."""
    threads = 32 * SGM * SGN
    BM, BN = SGM * TM * 16, SGN * TN * 16
    acc = "\n".join(f"  var c{i}_{j} = subgroup_matrix_result<f32, 16, 16>();" for i in range(TM) for j in range(TN))
    lefts = "\n".join(f"    let l{i} = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>(&ah, (row0 + {i * 16}u) * p.k + k0, p.k);" for i in range(TM))
    rights = "\n".join(f"    let r{j} = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, col_major>(&bh, (col0 + {j * 16}u) * p.k + k0, p.k);" for j in range(TN))
    mmas = "\n".join(f"    c{i}_{j} = subgroupMatrixMultiplyAccumulate(l{i}, r{j}, c{i}_{j});" for i in range(TM) for j in range(TN))
    stores = "\n".join(f"  subgroupMatrixStore<row_major>(&c, (row0 + {i * 16}u) * p.n + col0 + {j * 16}u, c{i}_{j}, p.n);" for i in range(TM) for j in range(TN))
    return f"""
enable f16;
enable chromium_experimental_subgroup_matrix;
enable subgroups;
diagnostic(off, subgroup_uniformity);
struct P {{ m: u32, n: u32, k: u32 }}
@group(0) @binding(0) var<storage, read> ah: array<f16>;
@group(0) @binding(1) var<storage, read> bh: array<f16>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(subgroup_id) sg: u32) {{
  let row0 = wg.y * {BM}u + (sg / {SGN}u) * {TM * 16}u;
  let col0 = wg.x * {BN}u + (sg % {SGN}u) * {TN * 16}u;
{acc}
  for (var k0 = 0u; k0 < p.k; k0 += 16u) {{
{lefts}
{rights}
{mmas}
  }}
{stores}
}}
""", (BM, BN, threads)


def main():
    a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    print(a.summary, flush=True)
    print("features", sorted(a.features), flush=True)
    print("configs", extras.get_adapter_properties(a).get("subgroup_matrix_configs"), flush=True)
    lim = a.limits
    keys = ("max-compute-workgroup-storage-size", "max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
            "max-compute-invocations-per-workgroup")
    d = a.request_device_sync(required_features=["chromium-experimental-subgroup-matrix", "subgroups", "shader-f16"], required_limits={k: lim[k] for k in keys})
    configs = [tuple(int(x) for x in c.split(",")) for c in (sys.argv[1:] or ["2,2,4,4,32", "2,4,4,2,32", "2,2,4,4,32,8,1", "2,4,4,2,32,8,1", "4,2,2,4,32,8,1", "1,1,4,4,32,8,1"])]
    shapes = [tuple(int(x) for x in s.split(",")) for s in os.environ.get("SHAPES", "4096,4096,4096 2048,2048,2048 2048,16384,2048 2048,2048,8192").split()]
    rng = np.random.default_rng(0)

    def run(cfg, M, N, K, reps):
        src, (BM, BN, _) = source(*cfg)
        pipe = d.create_compute_pipeline(layout="auto", compute={"module": d.create_shader_module(code=src), "entry_point": "main"})
        A = rng.uniform(-1, 1, (M, K)).astype(np.float16)
        W = rng.uniform(-1, 1, (N, K)).astype(np.float16)
        ba = d.create_buffer_with_data(data=A.tobytes(), usage=wgpu.BufferUsage.STORAGE)
        bb = d.create_buffer_with_data(data=W.tobytes(), usage=wgpu.BufferUsage.STORAGE)
        bc = d.create_buffer(size=M * N * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        bp = d.create_buffer_with_data(data=np.array([M, N, K, 0], np.uint32).tobytes(), usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_SRC)
        bg = d.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate((ba, bb, bc, bp))])

        def submit(n):
            enc = d.create_command_encoder()
            cp = enc.begin_compute_pass()
            cp.set_pipeline(pipe)
            cp.set_bind_group(0, bg)
            for _ in range(n):
                cp.dispatch_workgroups(N // BN, M // BM)
            cp.end()
            d.queue.submit([enc.finish()])

        submit(1)
        out = np.frombuffer(d.queue.read_buffer(bc), np.float32).reshape(M, N)
        rows = rng.choice(M, 16, replace=False)
        ref = A[rows].astype(np.float64) @ W.T.astype(np.float64)
        err = np.abs(out[rows] - ref).max() / np.abs(ref).max()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            submit(reps)
            d.queue.read_buffer(bp)
            times.append((time.perf_counter() - t) / reps)
        med = sorted(times)[2]
        return err, med, 2 * M * N * K / med / 1e12

    for cfg in configs:
        for M, N, K in shapes:
            try:
                reps = max(3, int(float(os.environ.get("REPS_MNK", 4e10)) / (M * N * K)))
                err, med, tf = run(cfg, M, N, K, reps)
                print(f"cfg {cfg} {M}x{N}x{K}: rel err {err:.1e}  {med * 1e6:9.1f} us  {tf:6.1f} TFLOP/s", flush=True)
            except Exception as e:
                print(f"cfg {cfg} {M}x{N}x{K} failed:", str(e).splitlines()[0][:300], flush=True)


main()
