"""What the event loop's thread calls: no wgpu call that waits for the GPU may run there."""

import sys
import threading


def record_gpu_waits_on_this_thread(monkeypatch):
    """Wraps every wgpu method that waits for the GPU or a shader compiler (*_sync, sync waits,
    synchronous readbacks, pipeline builds) to record its name when this thread calls it."""
    import wgpu  # (after async_runtime, which chose the backend that answers to this name)

    waits, here = [], threading.get_ident()
    blocking = {"sync_wait", "_sync_wait", "read_buffer", "read_texture", "create_shader_module", "create_compute_pipeline"}

    def recording(name, method):
        def call(*args, **kwargs):
            if threading.get_ident() == here:
                waits.append(name)
            return method(*args, **kwargs)

        return call

    for module in {sys.modules[type(wgpu.gpu).__module__], wgpu._classes}:
        for cls in [c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__]:
            for name, method in list(vars(cls).items()):
                if callable(method) and (name in blocking or name.endswith("_sync")):
                    monkeypatch.setattr(cls, name, recording(f"{cls.__name__}.{name}", method))
    return waits
