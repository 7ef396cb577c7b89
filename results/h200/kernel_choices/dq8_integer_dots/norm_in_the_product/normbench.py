"""Per-dispatch time of the one-row RMS-norm + int8 quantization kernel and variants with parts taken out."""
import sys
import time
import numpy as np
import wgpu
from pte_wgpu.kernels.wgsl import DIV_RN, QP_SIZE, QP_STRUCT, QPARAMS, XQ, RowQuantizer, fill, qp_bytes, vec4_loader, int8_rows_dim
from pte_wgpu.kernels.quant.quantized_rows import QUANTIZED_ROWS

K = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
device = adapter.request_device_sync(required_limits={})

OLD_DIV = open(__file__.rsplit("/", 1)[0] + "/restoring_div_rn.wgsl").read()  # DIV_RN before


def shader(inv=256, edit=lambda s: s, norm=True, div=DIV_RN):
    q = RowQuantizer(K, "f32", "f32", "f32(i32(qp.y))", norm, 1, inv)
    gamma = "@group(0) @binding(3) var<storage, read> gamma: array<vec4<f32>>;\n" + vec4_loader("gamma", "f32") if norm else ""
    body = fill(QUANTIZED_ROWS, X4="vec4<f32>", OUT="vec4<u32>", GAMMA=gamma, WG=inv)
    return edit(QP_STRUCT + div + QPARAMS + XQ + vec4_loader("x", "f32") + q.wgsl() + body)

EMPTY = """@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<u32>>;
@compute @workgroup_size(256) fn main(@builtin(local_invocation_index) lid: u32) { if (lid == 0u) { out[0] = bitcast<vec4<u32>>(x[0]); } }
"""
rng = np.random.default_rng(0)
x = rng.standard_normal(K).astype(np.float32)
g = rng.standard_normal(K).astype(np.float32)
U = wgpu.BufferUsage
bx = device.create_buffer_with_data(data=x, usage=U.STORAGE)
bg = device.create_buffer_with_data(data=g, usage=U.STORAGE)
bo = device.create_buffer(size=4 * int8_rows_dim(K) + 64, usage=U.STORAGE | U.COPY_SRC)
bp = device.create_buffer_with_data(data=qp_bytes(0, -128, 127, 2.0**-126, 1, K, 1e-5) + bytes(64 - QP_SIZE), usage=U.UNIFORM)

def time_kernel(src, n=3000, rounds=3):
    mod = device.create_shader_module(code=src)
    pipe = device.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})
    layout = pipe.get_bind_group_layout(0)
    res = [bx, bo, bp, bg]
    entries = []
    for i, b in enumerate(res):
        if f"@binding({i})" in src:
            entries.append({"binding": i, "resource": {"buffer": b}})
    group = device.create_bind_group(layout=layout, entries=entries)
    best = 1e9
    for r in range(rounds):
        enc = device.create_command_encoder()
        p = enc.begin_compute_pass()
        p.set_pipeline(pipe); p.set_bind_group(0, group)
        for _ in range(n):
            p.dispatch_workgroups(1)
        p.end()
        t = time.perf_counter(); device.queue.submit([enc.finish()]); device.queue.read_buffer(bo, 0, 16); dt = time.perf_counter() - t
        best = min(best, dt / n * 1e6)
    return best

V = {
    "empty": EMPTY,
    "as built (256)": shader(),
    "64 invocations": shader(64),
    "old div_rn": shader(div=OLD_DIV),
    "64 invocations, old div_rn": shader(64, div=OLD_DIV),
    "no norm": shader(norm=False),
    "no qparams": shader(edit=lambda s: s.replace("let qp = qparams(qr_lo[0], qr_hi[0]);", "let qp = vec2<f32>(max(qr_hi[0] - qr_lo[0], 1e-9) * 0.0039215, 0.0);").replace("let inv = div_rn(1.0, s);", "let inv = 1.0 / s;")),
    "qparams, no div_rn(1,s)": shader(edit=lambda s: s.replace("let inv = div_rn(1.0, s);", "let inv = 1.0 / s;")),
    "stores: scale only": None,
}
# stores: keep only lane 0's scale write
s2 = shader()
a = s2.index("let inv = div_rn(1.0, s);") + len("let inv = div_rn(1.0, s);")
b = s2.index("\n}\n", a)
V["stores: scale only"] = s2[:a] + "\n    if (li == 0u) { out[0].x = bitcast<u32>(s) + u32(zp) + u32(inv); }" + s2[b:]
# gamma prefetched with x
V["gamma with x"] = shader(edit=lambda s: s.replace("if (j < ${Q}u) { v[e] = x4(base + j); }".replace("${Q}", str(K // 4)),
    "if (j < ${Q}u) { v[e] = x4(base + j); gg[e] = gamma4(j); }".replace("${Q}", str(K // 4))).replace(
    "var v: array<vec4<f32>, ", "var gg: array<vec4<f32>, 8>; var v: array<vec4<f32>, ").replace("v[e] * rstd * gamma4(j)", "v[e] * rstd * gg[e]"))
for name, src in V.items():
    try:
        print(f"{name:28s} {time_kernel(src):7.2f} us", flush=True)
    except Exception as e:
        print(name, "failed", str(e)[:300])
