"""Tools around the runtime: the command line (`cli`), the benchmarks (`bench`) and the GPU profiler.

They sit on top of everything else and may import any room of `async_runtime`; nothing imports
them, except `session.py`, which only calls a `Profiler` that a tool has set on it.
"""
