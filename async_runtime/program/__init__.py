"""Reading a `.pte` and turning it into one linked program: the file formats and the plan of memory.

`flatbuf` reads FlatBuffers, `pte` ExecuTorch's program (its plan, values and delegate calls),
`vkgraph` the Vulkan delegate's `VH00`/`VK00` graph, `graph` links them into one `Graph` whose ops
are built through the kernel registry, and `planning` decides which tensors share memory. Nothing
here touches the GPU or an event loop. It may import `resize`, `kernels` and `async_runtime.errors`;
the runtime core above it imports it, never the other way round.
"""
