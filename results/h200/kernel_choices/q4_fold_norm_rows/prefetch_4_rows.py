"""Not kept: q4_linear.py's PREFETCH_ROWS 4, the 4-row shapes loading a step ahead too (run from the
checkout root)."""
PATH = "kernels/matmul/q4_linear.py"
OLD = "PREFETCH_ROWS = 2\n"
text = open(PATH).read()
assert OLD in text
open(PATH, "w").write(text.replace(OLD, "PREFETCH_ROWS = 4\n"))
