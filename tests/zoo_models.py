"""The non-CNN-classifier architectures of ExecuTorch's model zoo, written out because the packages
the zoo imports them from (torchvision, timm, torchsr, torchaudio) are not installed or cannot
import with this CPU torch: ViT-B/16 and DeiT-tiny (one ViT, two sizes), EDSR and wav2letter.
MobileBERT comes from transformers, as in the zoo, with random weights. Nothing here needs
ExecuTorch."""

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Multi-head self-attention with one qkv projection (timm's layout; torchvision's
    nn.MultiheadAttention computes the same with its in_proj)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))


class EncoderBlock(nn.Module):
    def __init__(self, dim, heads, mlp):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Dosovitskiy et al. 2021: 16x16 patches, a class token, learned positions, pre-norm encoder
    blocks, the class token's final norm to the head. The image size fixes the number of patches."""

    def __init__(self, image=224, dim=768, depth=12, heads=12, mlp=3072, patch=16, classes=1000):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[EncoderBlock(dim, heads, mlp) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, classes)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], 1) + self.pos
        return self.head(self.norm(self.blocks(tokens))[:, 0])


def vit_b16(image=224, classes=1000):
    return ViT(image, 768, 12, 12, 3072, classes=classes)


def deit_tiny(image=224, classes=1000):
    """timm's deit_tiny_patch16_224: a ViT of width 192, 3 heads."""
    return ViT(image, 192, 12, 3, 768, classes=classes)


class ResBlock(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(features, features, 3, padding=1), nn.ReLU(), nn.Conv2d(features, features, 3, padding=1))

    def forward(self, x):
        return x + self.body(x)


class EDSR(nn.Module):
    """Lim et al. 2017, torchsr's edsr_r16f64 (the zoo's): the RGB mean subtracted, a head conv, 16
    residual blocks and a conv under a long skip, a conv + pixel-shuffle upsampler per factor 2, a
    tail conv, the mean added back."""

    def __init__(self, scale=2, blocks=16, features=64):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.4488, 0.4371, 0.4040]).view(1, 3, 1, 1))
        self.head = nn.Conv2d(3, features, 3, padding=1)
        self.body = nn.Sequential(*[ResBlock(features) for _ in range(blocks)], nn.Conv2d(features, features, 3, padding=1))
        ups = []
        for _ in range(scale.bit_length() - 1):
            ups += [nn.Conv2d(features, 4 * features, 3, padding=1), nn.PixelShuffle(2)]
        self.tail = nn.Sequential(*ups, nn.Conv2d(features, 3, 3, padding=1))

    def forward(self, x):
        y = self.head(x - self.mean)
        return self.tail(y + self.body(y)) + self.mean


class Wav2Letter(nn.Module):
    """Collobert et al. 2016 as torchaudio builds it for waveforms: a 250-wide 1-D conv front end
    (window 250, hop 160), then the acoustic model's convolutions, all ReLU, and a log-softmax over
    the classes."""

    def __init__(self, classes=40):
        super().__init__()
        layers = [(1, 250, 250, 160, 45), (250, 250, 11, 2, 5)] + [(250, 250, 7, 1, 3)] * 7
        layers += [(250, 2000, 32, 1, 16), (2000, 2000, 1, 1, 0), (2000, classes, 1, 1, 0)]
        mods = []
        for cin, cout, k, s, p in layers:
            mods += [nn.Conv1d(cin, cout, k, s, p), nn.ReLU()]
        self.acoustic = nn.Sequential(*mods)

    def forward(self, waveform):
        return F.log_softmax(self.acoustic(waveform), dim=1)


class MobileBert(nn.Module):
    """transformers' MobileBertModel (Sun et al. 2020; 24 bottleneck layers, NoNorm, ReLU) with
    its default configuration and random weights; the sequence output from token ids."""

    def __init__(self, **config):
        super().__init__()
        from transformers import MobileBertConfig, MobileBertModel

        self.bert = MobileBertModel(MobileBertConfig(**config), add_pooling_layer=False)

    def forward(self, input_ids):
        return self.bert(input_ids=input_ids, return_dict=False)[0]
