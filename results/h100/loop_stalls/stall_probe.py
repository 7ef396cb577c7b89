"""Where the event loop stalls: a watchdog thread prints the loop thread's stack whenever a 2 ms
ticker has not run for 30 ms, while a model loads, executes and generates."""
import sys, threading, time, traceback
import anyio, numpy as np
import async_runtime as ar

main_id = threading.get_ident()
beat = [time.perf_counter()]
stalls = []

def watchdog():
    last_reported = None
    while True:
        time.sleep(0.005)
        b = beat[0]
        gap = time.perf_counter() - b
        if gap > 0.03 and last_reported != b:
            frames = sys._current_frames()
            stack = "".join(f"  [thread {tid}{' (loop)' if tid == main_id else ''}]\n" + "".join(traceback.format_stack(f)[-4:])
                            for tid, f in frames.items() if tid != threading.get_ident())
            stalls.append((gap, stack))
            last_reported = b

threading.Thread(target=watchdog, daemon=True).start()

async def main(path):
    async def ticker():
        while True:
            beat[0] = time.perf_counter()
            await anyio.sleep(0.002)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        t = time.perf_counter()
        async with await ar.load(path) as model:
            print("loaded", round(time.perf_counter() - t, 2), "s", model.device_info.backend, flush=True)
            rng = np.random.default_rng(0)
            for i in range(5):
                async with model.session() as s:
                    await s.execute(rng.integers(0, 1000, (1, 17)), np.array([0]))
            async with model.session() as s:
                async for _ in ar.generate(s, list(range(20)), max_new_tokens=40):
                    pass
        tg.cancel_scope.cancel()
    print(f"{len(stalls)} stalls over 30 ms", flush=True)
    for gap, stack in sorted(stalls, key=lambda x: -x[0])[:4]:
        print(f"--- {gap * 1e3:.0f} ms (at least), loop thread at:\n{stack}", flush=True)

anyio.run(main, sys.argv[1], backend=sys.argv[2])
