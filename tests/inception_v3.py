"""Inception V3 (Szegedy et al. 2016) as torchvision builds it (eval: no auxiliary head, no input
transform): convolutions with batch norm (eps 1e-3) and ReLU, and the five Inception modules."""

import torch
import torch.nn.functional as F
from torch import nn

from .vision_models import conv_bn


def conv(cin, cout, kernel, stride=1, padding=0):
    return conv_bn(cin, cout, kernel, stride, act=nn.ReLU, padding=padding, eps=1e-3)


def chain(cin, *layers):
    """conv layers given as (cout, kernel[, stride[, padding]]), each reading the one before."""
    mods = []
    for cout, *rest in layers:
        mods.append(conv(cin, cout, *rest))
        cin = cout
    return nn.Sequential(*mods)


def avg_pool_branch(cin, cout):
    return nn.Sequential(nn.AvgPool2d(3, 1, 1), conv(cin, cout, 1))


class Concat(nn.Module):
    def __init__(self, *branches):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], 1)


def inception_a(cin, pool):
    return Concat(chain(cin, (64, 1)), chain(cin, (48, 1), (64, 5, 1, 2)),
                  chain(cin, (64, 1), (96, 3, 1, 1), (96, 3, 1, 1)), avg_pool_branch(cin, pool))  # fmt: skip


def inception_b(cin):
    return Concat(chain(cin, (384, 3, 2)), chain(cin, (64, 1), (96, 3, 1, 1), (96, 3, 2)), nn.MaxPool2d(3, 2))


def inception_c(cin, c7):
    row, col = ((1, 7), 1, (0, 3)), ((7, 1), 1, (3, 0))
    return Concat(
        chain(cin, (192, 1)),
        chain(cin, (c7, 1), (c7, *row), (192, *col)),
        chain(cin, (c7, 1), (c7, *col), (c7, *row), (c7, *col), (192, *row)),
        avg_pool_branch(cin, 192),
    )


def inception_d(cin):
    row, col = ((1, 7), 1, (0, 3)), ((7, 1), 1, (3, 0))
    return Concat(chain(cin, (192, 1), (320, 3, 2)), chain(cin, (192, 1), (192, *row), (192, *col), (192, 3, 2)),
                  nn.MaxPool2d(3, 2))  # fmt: skip


class SplitPair(nn.Module):
    """A stem, then its output through a 1x3 and a 3x1 conv side by side (inception_e's branches)."""

    def __init__(self, stem, cin):
        super().__init__()
        self.stem, self.row, self.col = stem, conv(cin, 384, (1, 3), padding=(0, 1)), conv(cin, 384, (3, 1), padding=(1, 0))

    def forward(self, x):
        y = self.stem(x)
        return torch.cat([self.row(y), self.col(y)], 1)


def inception_e(cin):
    return Concat(chain(cin, (320, 1)), SplitPair(chain(cin, (384, 1)), 384),
                  SplitPair(chain(cin, (448, 1), (384, 3, 1, 1)), 384), avg_pool_branch(cin, 192))  # fmt: skip


class InceptionV3(nn.Module):
    """Any input of at least 75 x 75 pixels (299 in the paper)."""

    def __init__(self, classes=1000):
        super().__init__()
        self.features = nn.Sequential(
            conv(3, 32, 3, 2), conv(32, 32, 3), conv(32, 64, 3, padding=1), nn.MaxPool2d(3, 2),
            conv(64, 80, 1), conv(80, 192, 3), nn.MaxPool2d(3, 2),
            inception_a(192, 32), inception_a(256, 64), inception_a(288, 64), inception_b(288),
            inception_c(768, 128), inception_c(768, 160), inception_c(768, 160), inception_c(768, 192),
            inception_d(768), inception_e(1280), inception_e(2048),
        )  # fmt: skip
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))
