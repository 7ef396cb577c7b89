"""Where ar.load's buffer and upload phases spend their time: seconds in buffer creation, in reading
and converting constants (_constant_bytes, to_storage) and in the uploads' writes and their last
submit, summed over one load (the third of three). usage: python upload_parts.py MODEL.pte"""
import collections
import sys
import time

import anyio

import async_runtime as ar
from async_runtime import model as M

spent = collections.Counter()


def timed(owner, name, key):
    fn = getattr(owner, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[key] += time.perf_counter() - t0
    setattr(owner, name, wrapper)


timed(M.Model, "_create_buffer", "create buffers")
timed(M, "_constant_bytes", "constant bytes")
timed(M, "to_storage", "to_storage")
timed(M, "constant_rows", "constant_rows")
if hasattr(M, "StagedUploads"):
    timed(M.StagedUploads, "write", "staged writes")
    timed(M.StagedUploads, "finish", "staged finish")
else:
    timed(M.Model, "_make_buffers", "make_buffers (all)")
timed(M.Model, "_make_buffers", "make_buffers (all)") if hasattr(M, "StagedUploads") else None


async def main(path):
    for i in range(3):
        spent.clear()
        t0 = time.perf_counter()
        model = await ar.load(path)
        print(i, f"load {time.perf_counter() - t0:.3f} s", {k: round(v, 3) for k, v in spent.items()}, flush=True)
        await model.aclose()


anyio.run(main, sys.argv[1])
