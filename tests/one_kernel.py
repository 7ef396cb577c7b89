"""One WGSL kernel run over numpy arrays on the test's adapter, for tests of single kernels."""

import numpy as np


def dispatch(device, pipeline, buffers, grid):
    """Run `pipeline` once over `grid` workgroups with buffers[i] at binding i of group 0."""
    group = device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0),
        entries=[{"binding": i, "resource": {"buffer": buf}} for i, buf in enumerate(buffers)],
    )
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    compute.dispatch_workgroups(*grid)
    compute.end()
    device.queue.submit([encoder.finish()])


def run_kernel(src, inputs, out_dtype, n, workgroup=64, features=()):
    """Binding i of `src` holds inputs[i] (read-only storage), the binding after them an output of
    `n` elements of `out_dtype`; `src`'s entry point `main` runs n / workgroup workgroups once, on
    a device with `features`. Returns the output."""
    import wgpu  # (after async_runtime, which chose the backend that answers to this name)

    device = wgpu.gpu.request_adapter_sync().request_device_sync(required_features=list(features))
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    buffers = [device.create_buffer_with_data(data=x, usage=usage) for x in inputs]
    buffers.append(device.create_buffer(size=np.dtype(out_dtype).itemsize * n, usage=usage))
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": device.create_shader_module(code=src), "entry_point": "main"})
    dispatch(device, pipeline, buffers, (n // workgroup,))
    return np.frombuffer(device.queue.read_buffer(buffers[-1]), out_dtype)
