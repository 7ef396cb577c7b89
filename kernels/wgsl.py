"""What every WGSL kernel shares: storage types, the folded flat index, parameter packing."""

import struct

from resize.shapes import broadcast_strides, fold_grid

WG = 64  # workgroup size of the flat elementwise-style kernels

# How each tensor dtype is stored on the GPU: 4-byte elements, except raw bytes of packed weights.
STORAGE = {
    "float32": "f32",
    "float64": "f32",
    "float16": "f32",
    "int32": "i32",
    "int64": "i32",
    "int16": "i32",
    "bool": "u32",
    "uint8": "u32",  # packed: 4 bytes per u32 word
    "int8": "u32",
}
PACKED = {"uint8", "int8"}


def elem_bytes(dtype):
    return 1 if dtype in PACKED else 4


def wgsl_type(dtype):
    return STORAGE[dtype]


def is_float(dtype):
    return STORAGE[dtype] == "f32"


# The flat invocation index of a folded (x, y) grid; `WG` must match the kernel's workgroup size.
FLAT_INDEX = """
fn flat_index(gid: vec3<u32>, nwg: vec3<u32>, wg: u32) -> u32 {
    return gid.x + gid.y * nwg.x * wg;
}
"""


def flat_grid(threads, wg=WG):
    """Folded grid covering `threads` invocations of a `wg`-wide kernel."""
    return fold_grid(-(-threads // wg))


def pack_u32x8(values):
    """Up to 8 u32s as the 32 bytes of a WGSL `array<vec4<u32>, 2>`; unused slots are 0."""
    values = list(values)
    if len(values) > 8:
        raise ValueError(f"rank {len(values)} exceeds 8")
    return struct.pack("<8I", *(values + [0] * (8 - len(values))))


def pack_strides(shape, out_shape):
    return pack_u32x8(broadcast_strides(shape, out_shape))


# Turning a flat output index into input offsets through broadcast strides (see pack_strides).
STRIDED = """
fn at8(a: array<vec4<u32>, 2>, i: u32) -> u32 { return a[i / 4u][i % 4u]; }
"""
