"""Not kept (and not bitwise: a row of a pass sums otherwise than alone): routes.py's
Q4_SG_GPU_WIDE_SPLIT split K at one row only, its subgroups taking their own weight rows past it
(run from the checkout root)."""
PATH = "kernels/matmul/routes.py"
OLD = "Q4_SG_GPU_WIDE_SPLIT = tuple((rows, weights, 1) for rows, weights, _ in Q4_SG_GPU_WIDE)"
text = open(PATH).read()
assert OLD in text
open(PATH, "w").write(text.replace(OLD, "Q4_SG_GPU_WIDE_SPLIT = ((1, 4, 1), (2, 4, 2), (4, 4, 2))"))
