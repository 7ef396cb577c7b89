"""MobileNet V2 and ResNet-18 written out from their papers' layer tables, since torchvision (which
ExecuTorch's model zoo imports them from) cannot import with this CPU torch. Random weights; the
batch norms get random running statistics so that folding them into the convolutions matters."""

import torch
from torch import nn


def conv_bn(cin, cout, kernel, stride=1, groups=1, act=nn.ReLU6):
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """Expand (1x1), depthwise (3x3), project (1x1, linear); a residual when shapes allow."""

    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        layers = [conv_bn(cin, hidden, 1)] if expand != 1 else []
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden), conv_bn(hidden, cout, 1, act=None)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


# (expansion t, channels c, repeats n, first stride s), Sandler et al. 2018, table 2
MOBILENET_V2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


class MobileNetV2(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        layers, cin = [conv_bn(3, 32, 3, 2)], 32
        for t, c, n, s in MOBILENET_V2:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x):
        return self.classifier(nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, cout, 3, stride, act=nn.ReLU), conv_bn(cout, cout, 3, act=None))
        self.shortcut = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet18(nn.Module):
    """He et al. 2016: a 7x7/2 stem, a 3x3/2 max pool, four stages of two basic blocks."""

    def __init__(self, classes=1000):
        super().__init__()
        layers, cin = [conv_bn(3, 64, 7, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1)], 64
        for i, c in enumerate((64, 128, 256, 512)):
            layers += [BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)]
            cin = c
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        return self.fc(nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


def randomize_batch_norms(module, seed=0):
    """Random running statistics and affine parameters for every BatchNorm2d of `module`."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return module
