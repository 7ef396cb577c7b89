"""The GEMM template with its tiles in workgroup memory as f16 and each K step's products summed in
f16 (vec4<f16> fma), added to the f32 sums once a K step, against the f32 template, standalone.
usage: python f16.py [quick]"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gemm_bench  # noqa: E402

from pte_wgpu.kernels.matmul import gemm as G  # noqa: E402

QUICK = "quick" in sys.argv
_plain = G.gemm_shader


class F16(G.Tile):
    pass


def f16_products(text):
    text = text.replace("var<workgroup> As: array<vec4<f32>,", "var<workgroup> As: array<vec4<f16>,")
    text = text.replace("var<workgroup> Bs: array<vec4<f32>,", "var<workgroup> Bs: array<vec4<f16>,")
    text = re.sub(r"(\b[AB]s\[[^\]]*\]\[[^\]]*\]) = (r[ab]\w*\[\d\]);", r"\1 = f16(\2);", text)
    text = re.sub(r"(\b[AB]s\[[^\]]*\]) = (r[ab]\w*);", r"\1 = vec4<f16>(\2);", text)
    accs = sorted(set(re.findall(r"\bc(\d+_\d+_\d+) = c\1 \+", text)))
    text = re.sub(r"\bc(\d+_\d+_\d+) = c\1 \+ (x\d+)\.([xyzw]) \* (y\d+);", r"h\1 = fma(vec4<f16>(\2.\3), \4, h\1);", text)
    parts = text.split("workgroupBarrier();")
    assert len(parts) == 3, len(parts)
    zero = " ".join(f"var h{a} = vec4<f16>(0.0h);" for a in accs)
    fold = " ".join(f"c{a} = c{a} + vec4<f32>(h{a});" for a in accs)
    return "enable f16;\n" + parts[0] + "workgroupBarrier();\n        " + zero + parts[1] + fold + "\n        workgroupBarrier();" + parts[2]


def gemm_shader(load, *args, tile=G.TILE, **kw):
    text = _plain(load, *args, tile=tile, **kw)
    return f16_products(text) if isinstance(tile, F16) else text


G.gemm_shader = gemm_shader


def f16(t):
    return F16(**{f.name: getattr(t, f.name) for f in G.dataclasses.fields(t)})


def case(kind, M, N, K, tiles):
    errors = {}
    res = gemm_bench.tile_tflops(kind, M, N, K, tiles, QUICK, tol=3e-2, errors=errors)
    print(f"{kind} {M}x{N}x{K}: " + "  ".join(f"{n} {v:5.1f} (err {errors[n]:.1e})" for n, v in res.items()) + " TFLOP/s", flush=True)


def both(*tiles):
    return [x for name, t in tiles for x in ((name, t), (name + " f16", f16(t)))]


if QUICK:
    case("q4", 67, 256, 96, both(("4x4", G.TILE), ("8x4", G.MID_TILE), ("big", G.BIG_TILE)))
    case("f32", 67, 256, 96, both(("4x4", G.TILE), ("big", G.BIG_TILE)))
else:
    case("f32", 4096, 4096, 4096, both(("big", G.BIG_TILE)))
    for M in (2047, 512):
        for N, K in ((16384, 2048), (2048, 8192), (3072, 2048)):
            case("q4", M, N, K, both(("big", G.BIG_TILE), ("8x4", G.MID_TILE)))
    for N, K in ((16384, 2048), (128256, 2048), (2048, 8192), (3072, 2048)):
        case("q4", 64, N, K, both(("4x4", G.TILE), ("8x4", G.MID_TILE)))
