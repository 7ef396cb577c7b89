"""int8 x int8 -> int32 GEMM on Dawn's subgroup matrices: C[M,N] = A[M,K] . W[N,K]^T (W as a linear's weight).
Tiled: workgroup tiles of BM x BN, K steps of BK through double-buffered workgroup memory, each subgroup
TM x TN result matrices of 16 x 16. Checks exactness against numpy, times 4096^3. TOGGLES: more of Dawn's
instance toggles (comma-separated)."""
import os, sys, time, itertools
import numpy as np
NULL = os.environ.get("WGPU_BACKEND_TYPE") == "Null"
import wgpudawn
from wgpudawn.backends.dawn import extras
toggles = ["allow_unsafe_apis"] + (["disable_robustness"] if os.environ.get("NOROBUST") else []) + [t for t in os.environ.get("TOGGLES", "").split(",") if t]
extras.set_instance_extras(**({} if NULL else {"backends": ["Vulkan"]}), enable_toggles=toggles)
wgpudawn.install_as_wgpu()
import wgpu

SG = 128 if NULL else 32

def source(SGM, SGN, TM, TN, BK, PAD=4, NT=16, ORDER=0, RAST=0):
    THREADS = SG * SGM * SGN // (SG // 32) if NULL else 32 * SGM * SGN
    BM, BN = SGM * TM * 16, SGN * TN * NT
    KW = BK // 4  # words of a row of a K step
    LDS = KW + PAD
    la = BM * KW // 4 // THREADS  # vec4 loads of A a thread per K step
    lb = BN * KW // 4 // THREADS
    assert la * THREADS * 4 == BM * KW and lb * THREADS * 4 == BN * KW, (BM, BN, KW, THREADS)
    acc = "\n".join(f"  var c{i}_{j} = subgroup_matrix_result<i32, {NT}, 16>();" for i in range(TM) for j in range(TN))
    lefts = "\n".join(f"      let l{i} = subgroupMatrixLoad<subgroup_matrix_left<i8, 32, 16>, row_major>(&As, a0 + {i * 16 * LDS}u + kk, {LDS}u);" for i in range(TM))
    rights = "\n".join(f"      let r{j} = subgroupMatrixLoad<subgroup_matrix_right<i8, {NT}, 32>, col_major>(&Bs, b0 + {j * NT * LDS}u + kk, {LDS}u);" for j in range(TN))
    mmas = "\n".join(f"      c{i}_{j} = subgroupMatrixMultiplyAccumulate(l{i}, r{j}, c{i}_{j});" for i in range(TM) for j in range(TN))
    if ORDER:  # the rights first, then each left just before its row of products
        rows = [[l] + [m for m in mmas.splitlines() if m.strip().startswith(f"c{i}_")] for i, l in enumerate(lefts.splitlines())]
        lefts, mmas = "", "\n".join(line for row in rows for line in row)
    if RAST:  # workgroups walk M in groups of RAST tiles (L2 reuse of the right matrix's columns)
        grid = f"  let lin = wg.x + wg.y * nw.x; let per = {RAST}u * nw.x; let ty = (lin / per) * {RAST}u + (lin % per) % {RAST}u; let tx = (lin % per) / {RAST}u;"
    else:
        grid = "  let tx = wg.x; let ty = wg.y;"
    stores = "\n".join(f"  subgroupMatrixStore<row_major>(&c, (row0 + {i * 16}u) * p.n + col0 + {j * NT}u, c{i}_{j}, p.n);" for i in range(TM) for j in range(TN))
    def loads(name, rows, count):
        # thread t loads vec4 number t + THREADS * i of the tile: row = v / (KW/4), word = 4 * (v % (KW/4))
        return "\n".join(
            f"    let {name}v{i} = {name}g[(({name}r0 + ({i}u * {THREADS}u + li) / {KW // 4}u) * p.k + k0) / 16u + (({i}u * {THREADS}u + li) % {KW // 4}u)];"
            for i in range(count))
    def stores_ws(name, arr, count):
        out = []
        for i in range(count):
            out.append(f"    {{ let v = {i}u * {THREADS}u + li; let at = buf * {(BM if name == 'a' else BN) * LDS}u + (v / {KW // 4}u) * {LDS}u + (v % {KW // 4}u) * 4u;")
            out.append(f"      {arr}[at] = {name}v{i}.x; {arr}[at + 1u] = {name}v{i}.y; {arr}[at + 2u] = {name}v{i}.z; {arr}[at + 3u] = {name}v{i}.w; }}")
        return "\n".join(out)
    return f"""
enable chromium_experimental_subgroup_matrix;
enable subgroups;
diagnostic(off, subgroup_uniformity);
struct P {{ m: u32, n: u32, k: u32 }}
@group(0) @binding(0) var<storage, read> ag: array<vec4<i32>>;
@group(0) @binding(1) var<storage, read> bg: array<vec4<i32>>;
@group(0) @binding(2) var<storage, read_write> c: array<i32>;
@group(0) @binding(3) var<uniform> p: P;
var<workgroup> As: array<i32, {2 * BM * LDS}>;
var<workgroup> Bs: array<i32, {2 * BN * LDS}>;
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(num_workgroups) nw: vec3u, @builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sgid: u32) {{
{grid}
  let sg = sgid;
  let sm = sg / {SGN}u;
  let sn = sg % {SGN}u;
  let ar0 = ty * {BM}u;
  let br0 = tx * {BN}u;
  let row0 = ar0 + sm * {TM * 16}u;
  let col0 = br0 + sn * {TN * NT}u;
{acc}
  let steps = p.k / {BK}u;
  var k0 = 0u;
  var buf = 0u;
  {{
{loads('a', BM, la)}
{loads('b', BN, lb)}
{stores_ws('a', 'As', la)}
{stores_ws('b', 'Bs', lb)}
  }}
  workgroupBarrier();
  for (var t = 0u; t < steps; t++) {{
    let more = t + 1u < steps;
    k0 = (t + 1u) * {BK}u;
    if (!more) {{ k0 = 0u; }}
{loads('a', BM, la)}
{loads('b', BN, lb)}
    let a0 = buf * {BM * LDS}u + sm * {TM * 16 * LDS}u;
    let b0 = buf * {BN * LDS}u + sn * {TN * NT * LDS}u;
    for (var kk = 0u; kk < {KW}u; kk += 8u) {{
{lefts}
{rights}
{mmas}
    }}
    buf = 1u - buf;
    if (more) {{
{stores_ws('a', 'As', la)}
{stores_ws('b', 'Bs', lb)}
    }}
    workgroupBarrier();
  }}
{stores}
}}
""", (BM, BN, THREADS)

def main():
    a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    print(a.summary, flush=True)
    if not NULL:
        print("configs", extras.get_adapter_properties(a).get("subgroup_matrix_configs"))
    lim = a.limits
    print("limits: storage/stage", lim["max-storage-buffers-per-shader-stage"], "wg storage", lim["max-compute-workgroup-storage-size"],
          "binding", lim["max-storage-buffer-binding-size"], "buffer", lim["max-buffer-size"], "invocations", lim["max-compute-invocations-per-workgroup"], flush=True)
    d = a.request_device_sync(required_features=["chromium-experimental-subgroup-matrix", "subgroups", "timestamp-query"],
                              required_limits={k: lim[k] for k in ("max-compute-workgroup-storage-size", "max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage", "max-compute-invocations-per-workgroup")})
    configs = [tuple(int(x) for x in c.split(",")) for c in (sys.argv[1:] or ["2,2,4,4,64", "4,2,2,4,64", "2,4,4,2,64", "2,2,2,2,64", "4,2,4,4,32", "2,2,4,4,32", "4,4,2,2,64"])]
    rng = np.random.default_rng(0)
    def run(cfg, M, N, K, reps, check):
        src, (BM, BN, T) = source(*cfg)
        mod = d.create_shader_module(code=src)
        pipe = d.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})
        if NULL:
            return None
        A = rng.integers(-128, 128, (M, K), dtype=np.int8); W = rng.integers(-128, 128, (N, K), dtype=np.int8)
        ba = d.create_buffer_with_data(data=A.tobytes(), usage=wgpu.BufferUsage.STORAGE)
        bb = d.create_buffer_with_data(data=W.tobytes(), usage=wgpu.BufferUsage.STORAGE)
        bc = d.create_buffer(size=M * N * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        bp = d.create_buffer_with_data(data=np.array([M, N, K, 0], np.uint32).tobytes(), usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_SRC)
        bg = d.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": i, "resource": {"buffer": b}} for i, b in enumerate((ba, bb, bc, bp))])
        def submit(n):
            enc = d.create_command_encoder(); cp = enc.begin_compute_pass()
            cp.set_pipeline(pipe); cp.set_bind_group(0, bg)
            for _ in range(n):
                cp.dispatch_workgroups(N // BN, M // BM)
            cp.end(); d.queue.submit([enc.finish()])
        submit(1)
        out = np.frombuffer(d.queue.read_buffer(bc), np.int32).reshape(M, N)
        rows = rng.choice(M, 8, replace=False) if not check else np.arange(M)
        ref = A[rows].astype(np.int64) @ W.T.astype(np.int64)
        exact = np.array_equal(out[rows], ref)
        times = []
        for _ in range(5):
            t = time.perf_counter(); submit(reps); d.queue.read_buffer(bp); times.append((time.perf_counter() - t) / reps)
        med = sorted(times)[2]
        return exact, med, 2 * M * N * K / med / 1e12
    for cfg in configs:
        try:
            r = run(cfg, 512, 768, 1024, 1, True)
            r2 = run(cfg, 4096, 4096, 4096, 20, False) if r is not None else None
            print("cfg SGM,SGN,TM,TN,BK", cfg, "| 512x768x1024 exact", r and r[0], "| 4096^3 exact rows", r2 and r2[0], "%.3f ms %.1f TOPS" % (r2[1] * 1e3, r2[2]) if r2 else "", flush=True)
        except Exception as e:
            print("cfg", cfg, "failed:", str(e).splitlines()[0][:300], flush=True)

main()
