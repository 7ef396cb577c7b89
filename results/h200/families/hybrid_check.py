"""A hybrid family's real-shape export: load, generate 48 greedy tokens with the GPU picking them,
the first 7 against a host loop (logits read back, argmax) on another session; two sessions at
once and a restarted sequence give the tokens they gave alone; the host loop's logits against a
reference run's (`--save` writes them: this runs on lavapipe first, then on the GPU)."""
import sys
import time

import anyio
import numpy as np
import async_runtime as ar

STEPS = 8


async def host_loop(model, prompt, steps):
    logits_seen, pos, ids = [], 0, prompt
    async with model.session() as s:
        for _ in range(steps):
            (logits,) = await s.execute(np.array([ids], np.int64), np.array([pos], np.int64))
            pos += len(ids)
            row = np.asarray(logits, np.float32).reshape(-1, logits.shape[-1])[-1]
            logits_seen.append(row)
            ids = [int(row.argmax())]
    return np.stack(logits_seen)


async def generate(session, prompt, n):
    return [tok async for tok in ar.generate(session, prompt, max_new_tokens=n)]


async def main(path, reference, save):
    t = time.perf_counter()
    async with await ar.load(path) as model:
        load = time.perf_counter() - t
        rng = np.random.default_rng(0)
        p1, p2 = ([int(x) for x in rng.integers(1, 1000, n)] for n in (37, 23))
        async with model.session() as s:
            g = ar.generate(s, p1, max_new_tokens=48)
            alone = [tok async for tok in g]
            again = await generate(s, p1, 48)  # a new sequence on the same session: its state restarted
        logits = await host_loop(model, p1, STEPS)
        host = [int(row.argmax()) for row in logits[:-1]]
        async with model.session() as a, model.session() as b:
            both = {}
            async with anyio.create_task_group() as tg:
                for name, s, p in (("a", a, p1), ("b", b, p2)):
                    async def one(name=name, s=s, p=p):
                        both[name] = await generate(s, p, 48)
                    tg.start_soon(one)
        async with model.session() as s:
            b_alone = await generate(s, p2, 48)
        print(path.split("/")[-1], model.device_info.name, model.precision, model.batching, repr(model.batching_note),
              f"load {load:.1f} s", f"memory {model.memory() / 1e9:.2f} GB", f"{len(alone)} tokens at {g.stats.generate_tokens_per_s:.0f} tok/s",
              "| first 7 equal to the host loop:", alone[:STEPS - 1] == host, "| restarted sequence equal:", again == alone,
              "| two sessions at once equal to each alone:", both["a"] == alone and both["b"] == b_alone,
              "| tokens", alone[:8], b_alone[:8], flush=True)
        if save:
            np.savez_compressed(reference, logits=logits)
        else:
            ref = np.load(reference)["logits"]
            err = np.abs(logits - ref).max(axis=1) / np.abs(ref).max(axis=1)
            print(f"host loop logits against {reference.split('/')[-1]} (max |diff| / max |ref| a step):", np.round(err, 6).tolist(), flush=True)


anyio.run(main, sys.argv[1], sys.argv[2], "--save" in sys.argv)
