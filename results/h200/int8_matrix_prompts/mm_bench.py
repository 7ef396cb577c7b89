"""The 8da4w subgroup-matrix route's two kernels alone (kernels/matmul/int8_matrix.py): against an
exact numpy reference where it is small enough, then timed at SmolLM2's and Llama-3.2-1B's
product shapes (medians of 5 submits of 20 quantize + product pairs). KNOBS=nofold,nostore,nozero
take parts out (timing only). PTE_WGPU_BACKEND=dawn python3 mm_bench.py [SGM,SGN,TM,TN ...]"""
import os, sys, time, struct
import numpy as np
import async_runtime  # noqa  (installs Dawn)
import wgpu
from async_runtime.pipelines import wgsl_for_device
from pte_wgpu.kernels.matmul.q4_linear import matrix_heads, Storage, LIN_FORMAT
from pte_wgpu.kernels.matmul import int8_matrix as im

NULL = os.environ.get("WGPU_BACKEND_TYPE") == "Null"
args = [a for a in sys.argv[1:] if not a.startswith("--")]
shapes = [tuple(int(v) for v in a.split(",")) for a in args] or [im.SHAPE]
a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
feats = [f for f in ("subgroups", "chromium-experimental-subgroup-matrix", "timestamp-query") if f in a.features]
d = a.request_device_sync(required_features=feats, required_limits=dict(a.limits))
print(a.summary, flush=True)
qhead, mhead = matrix_heads(True, False, Storage(), False)
rng = np.random.default_rng(0)
U = wgpu.BufferUsage

def buf(arr):
    return d.create_buffer_with_data(data=np.ascontiguousarray(arr).tobytes(), usage=U.STORAGE | U.COPY_SRC)

def problem(M, N, K, gs=32):
    x = (rng.standard_normal((M, K)) * rng.uniform(0.2, 3, (M, 1))).astype(np.float32)
    lo, hi = x.min(1), x.max(1)
    s = ((hi - lo) / 255).astype(np.float32); zp = np.clip(np.round(-128 - lo / s), -128, 127).astype(np.int8)
    kp = -(-K // 8) * 8
    nib = rng.integers(-8, 8, (N, kp)); nib[:, K:] = 0
    groups = -(-K // gs); np_ = -(-N // 4) * 4
    ws = rng.uniform(0.001, 0.02, (groups, np_)).astype(np.float32)
    u = (nib + 8).astype(np.uint32).reshape(N, kp // 8, 8)
    words = np.zeros((N, kp // 8), np.uint32)
    for j in range(8):
        words |= u[:, :, j] << (4 * j)
    # reference: q = clamp(round(x * inv) + zp), sum over groups of ws * sum (q - zp) w, times s
    inv = (np.float32(1) / s).astype(np.float32)
    qx = np.clip(np.round((x * inv[:, None]).astype(np.float32)) + zp[:, None], -128, 127).astype(np.int64) - zp[:, None].astype(np.int64)
    ref = np.zeros((M, N))
    for g in range(groups if M * N * K < 3e8 else 0):
        k0, k1 = g * gs, min(K, (g + 1) * gs)
        ref += (qx[:, k0:k1] @ nib[:, k0:k1].T.astype(np.int64)) * ws[g, :N].astype(np.float64)
    ref *= s[:, None]
    zpw = np.zeros(-(-M // 4) * 4, np.int8); zpw[:M] = zp
    q = struct.pack(LIN_FORMAT, M, N, K, kp // 8, np_, groups, gs, kp // 8)
    bufs = dict(x=buf(x), xs=buf(s), xz=buf(zpw.view(np.uint32)), wq=buf(words), ws=buf(ws),
                out=d.create_buffer(size=M * N * 4, usage=U.STORAGE | U.COPY_SRC),
                q=d.create_buffer_with_data(data=q + bytes(64 - len(q)), usage=U.UNIFORM | U.COPY_SRC),
                xq=d.create_buffer(size=M * (-(-K // 4)) * 4 + 16, usage=U.STORAGE))
    return bufs, ref

def pipeline(src):
    if NULL:
        return d.create_shader_module(code=wgsl_for_device(src))
    return d.create_compute_pipeline(layout="auto", compute={"module": d.create_shader_module(code=wgsl_for_device(src)), "entry_point": "main"})

def group(pipe, bufs, names):
    return d.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": bufs[n]}} for i, n in names])

MAIN = [(0, "x"), (1, "xs"), (2, "xz"), (3, "wq"), (4, "ws"), (5, "out"), (6, "q")]
for shape in shapes:
    src = im.matrix_shader(mhead, 6, shape)
    for knob in os.environ.get("KNOBS", "").split(","):
        if knob == "nofold":
            src = src.replace("if ((t + 1u) % group_steps == 0u || t + 1u == steps) {", "if (t + 1u == steps) {")
        if knob == "nostore":
            src = "\n".join(l for l in src.splitlines() if "subgroupMatrixStore" not in l)
        if knob == "nozero":
            src = src.replace("if (t % group_steps == 0u) {", "if (t == 0u) {")
    t0 = time.perf_counter()
    mat = pipeline(src)
    print("compiled in %.1f s" % (time.perf_counter() - t0), os.environ.get("KNOBS", ""), flush=True)
    qz = pipeline(im.quantize_shader(qhead))
    if NULL:
        print("compiled", shape); continue
    def run(M, N, K, reps):
        bufs, ref = problem(M, N, K)
        bg = group(mat, bufs, [(0, "xs"), (1, "xz"), (2, "wq"), (3, "ws"), (4, "out"), (5, "q"), (6, "xq")])
        qbg = group(qz, bufs, [(0, "x"), (1, "xs"), (2, "xz"), (3, "xq"), (4, "q")])
        grid = im.matrix_grid(M, N, shape)
        words = M * (-(-K // 4))
        def submit(n):
            enc = d.create_command_encoder(); cp = enc.begin_compute_pass()
            for _ in range(n):
                cp.set_pipeline(qz); cp.set_bind_group(0, qbg); cp.dispatch_workgroups(*im.quantize_grid(M, K))
                cp.set_pipeline(mat); cp.set_bind_group(0, bg); cp.dispatch_workgroups(*grid)
            cp.end(); d.queue.submit([enc.finish()])
        submit(1)
        out = np.frombuffer(d.queue.read_buffer(bufs["out"]), np.float32).reshape(M, N)
        err = np.abs(out - ref).max() / np.abs(ref).max() if ref.any() else float("nan")
        times = []
        for _ in range(5):
            t = time.perf_counter(); submit(reps); d.queue.read_buffer(bufs["q"]); times.append((time.perf_counter() - t) / reps)
        med = sorted(times)[2]
        return err, med
    for M, N, K in [(70, 100, 160), (512, 576, 576), (512, 1536, 576), (512, 576, 1536), (2048, 576, 576), (512, 2048, 2048), (512, 8192, 2048), (512, 2048, 8192), (2048, 8192, 2048), (100, 96, 2048)]:
        err, med = run(M, N, K, 20)
        print(f"shape {shape} M,N,K {M},{N},{K}: rel err {err:.2e}  {med*1e6:.1f} us  {2*M*N*K/med/1e12:.1f} TOPS", flush=True)
