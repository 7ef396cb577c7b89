"""Not kept: routes.py's Q4_SG_GPU_WIDE as ((1, 4, 2), (2, 4, 2), (4, 8, 2)) (run from the checkout root)."""
PATH = "kernels/matmul/routes.py"
OLD = "Q4_SG_GPU_WIDE = ((1, 4, 2), (2, 4, 2), (4, 4, 2))"
text = open(PATH).read()
assert OLD in text
open(PATH, "w").write(text.replace(OLD, "Q4_SG_GPU_WIDE = ((1, 4, 2), (2, 4, 2), (4, 8, 2))"))
