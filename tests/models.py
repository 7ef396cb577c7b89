"""Small torch modules the tests export, odd and prime dims throughout, and the dynamic exports
that several test files share."""

import torch

from .exporting import export_pte


class Elementwise(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x * y + x) - torch.sigmoid(y)


class MLP(torch.nn.Module):
    def __init__(self, d_in=13, d_hidden=29, d_out=7):
        super().__init__()
        self.l1 = torch.nn.Linear(d_in, d_hidden)
        self.l2 = torch.nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


class Block(torch.nn.Module):
    """Attention-style block: linear, split, view, permute, bmm, softmax, gelu, residual add."""

    def __init__(self, dim=15, heads=3):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).permute(0, 2, 1, 3) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)
        y = (a @ v).permute(0, 2, 1, 3).reshape(b, s, d)
        return torch.nn.functional.gelu(self.proj(y)) + x


class RMSNorm(torch.nn.Module):
    """The RMSNorm of ExecuTorch's Llama example (the partitioner fuses it into et_vk.rms_norm),
    written here so exported tests need no ExecuTorch at run time."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x = x.float()
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


# -- exports several test files share: (pte bytes, eager module), cached per session ---------------
# Each sample is the inputs at their maximum shapes; with its dynamic_shapes spec it is what
# `async_runtime.testing.dynamic_shape_calls` draws live calls from.

EW_S = torch.export.Dim("S", min=1, max=9)
EW_SAMPLE = (torch.randn(3, 9, 7), torch.randn(9, 1))
EW_DYNAMIC = ({1: EW_S}, {0: EW_S})  # x's dim 1 and y's dim 0 are one size
BATCH = torch.export.Dim("batch", min=1, max=23)
MLP_SAMPLE = (torch.randn(23, 13),)
MLP_DYNAMIC = ({0: BATCH},)
BLOCK_S = torch.export.Dim("S", min=1, max=11)
BLOCK_SAMPLE = (torch.randn(1, 11, 15),)
BLOCK_DYNAMIC = ({1: BLOCK_S},)


def elementwise_dynamic():
    return export_pte("ew_dyn", Elementwise, EW_SAMPLE, dynamic_shapes=EW_DYNAMIC)


def mlp_dynamic():
    return export_pte("mlp_dyn", MLP, MLP_SAMPLE, dynamic_shapes=MLP_DYNAMIC)


def block_dynamic():
    return export_pte("block_dyn", Block, BLOCK_SAMPLE, dynamic_shapes=BLOCK_DYNAMIC)


class HalfBlock(torch.nn.Module):
    """A pre-norm transformer block without convolutions for the fp16 exports: layer norm,
    attention (3 heads of 7), a GELU MLP of 37, two residual adds."""

    def __init__(self, dim=21, heads=3, hidden=37):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.up, self.down = torch.nn.Linear(dim, hidden), torch.nn.Linear(hidden, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5, dim=-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


HALF_S = torch.export.Dim("S", min=1, max=13)
HALF_SAMPLE = (torch.randn(2, 13, 21),)
HALF_DYNAMIC = ({1: HALF_S},)


def half_block():
    """HalfBlock cast with `.half()` before export: float16 weights, inputs and outputs."""
    return export_pte("half_block_fp16", lambda: HalfBlock().half(), (HALF_SAMPLE[0].half(),),
                      dynamic_shapes=HALF_DYNAMIC)


def forced_fp16_block():
    """The float32 HalfBlock with the partitioner's force_fp16 (same weights as half_block's
    before the cast: same seed)."""
    return export_pte("half_block_forced", HalfBlock, HALF_SAMPLE, dynamic_shapes=HALF_DYNAMIC, force_fp16=True)
