"""Not kept: q4_linear.py's nibbles and dq4 turning a nibble n into the float n - 8 by its exponent bits
(2^23 + n as a float's bits, less 2^23 + 8; bitwise the same values), not an int-to-float conversion
(run from the checkout root)."""
PATH = "kernels/matmul/q4_linear.py"
CONVERTED = "vec4<f32>({bits}) - vec4<f32>(8.0)"
BY_EXPONENT = "bitcast<vec4<f32>>({bits} | vec4<u32>(0x4B000000u)) - vec4<f32>(8388616.0)"
BITS = [
    "(v >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)",
    "(v >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)",
    "(vec4<u32>(bits) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)",
]
text = open(PATH).read()
for bits in BITS:
    old = CONVERTED.format(bits=bits)
    assert old in text, old
    text = text.replace(old, BY_EXPONENT.format(bits=f"({bits})"))
open(PATH, "w").write(text)
