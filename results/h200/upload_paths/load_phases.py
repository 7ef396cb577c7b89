"""ar.load's phases of one export, loaded LOADS times in one process (the first compiles into a cold
pipeline cache): seconds per phase and the upload's GB/s; then the last load's greedy tokens for a
fixed prompt (the same under every version). usage: python load_phases.py MODEL.pte [LOADS]"""
import json
import sys
import time

import anyio

import async_runtime as ar


class Phases:
    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.seconds, self.totals = {}, {}

    def __call__(self, phase, done, total):
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
        self.totals[phase], self.last = total, now


async def main(path, loads):
    for i in range(loads):
        phases = Phases()
        model = await ar.load(path, progress=phases)
        row = {p: round(s, 3) for p, s in phases.seconds.items()}
        row["load_s"] = round(time.perf_counter() - phases.start, 3)
        row["upload_gb_s"] = round(phases.totals["upload"] / phases.seconds["upload"] / 1e9, 2)
        print(json.dumps({"load": i, **row}), flush=True)
        if i == loads - 1:
            async with model.session() as s:
                print("tokens", [t async for t in ar.generate(s, [1, 17, 400, 9000, 128000, 5], max_new_tokens=16)], flush=True)
        await model.aclose()


anyio.run(main, sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
