"""The main job: export a small transformer block with a dynamic sequence length through
ExecuTorch's VulkanPartitioner, run it on the WebGPU adapter at several live lengths, and check
every result against torch eager.

    bash examples/setup.sh python examples/demo.py
"""

import logging
import time
import warnings

import anyio
import numpy as np
import torch

import async_runtime as ar

DIM, HEADS, MAX_SEQ = 63, 7, 97
warnings.filterwarnings("ignore")
logging.disable(logging.INFO)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.norm = torch.nn.LayerNorm(DIM)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, HEADS, d // HEADS).permute(0, 2, 1, 3) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // HEADS) ** 0.5, dim=-1)
        y = (a @ v).permute(0, 2, 1, 3).reshape(b, s, d)
        return torch.nn.functional.gelu(self.proj(y)) + x


def export():
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    module = Block().eval()
    seq = torch.export.Dim("seq", min=1, max=MAX_SEQ)
    ep = torch.export.export(module, (torch.randn(1, MAX_SEQ, DIM),), dynamic_shapes=({1: seq},))
    program = to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner({"require_dynamic_shapes": True})])
    return module, program.to_executorch().buffer


async def main():
    t0 = time.perf_counter()
    module, pte = export()
    print(f"exported a transformer block (dim {DIM}, {HEADS} heads, sequence 1..{MAX_SEQ}): "
          f"{len(pte) / 1024:.0f} KiB in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    async with await ar.load(pte) as model:
        print(f"loaded on {model.device_info.name} in {time.perf_counter() - t0:.2f} s")
        rng = np.random.default_rng(0)
        for seq in (MAX_SEQ, 1, 17, 61, 2, MAX_SEQ):
            x = rng.standard_normal((1, seq, DIM), dtype=np.float32)
            t0 = time.perf_counter()
            (out,) = await model.execute(x)
            ms = (time.perf_counter() - t0) * 1e3
            with torch.no_grad():
                ref = module(torch.from_numpy(x)).numpy()
            err = float(np.abs(out - ref).max())
            status = "ok" if err < 1e-4 else "MISMATCH"
            print(f"  seq {seq:3d}: output {list(out.shape)} in {ms:7.2f} ms, max |wgpu - torch| = {err:.1e}  {status}")
        s = model.statistics()
        print(f"{s.executes} executes, {s.resize_events} input resizes, {s.hook_calls} resize hooks run, "
              f"{s.submits} submits, {s.bytes_up} bytes up, {s.bytes_down} bytes down")


if __name__ == "__main__":
    anyio.run(main)
