"""The CNNs of ExecuTorch's model zoo (MobileNet V2 and V3-small, ResNet-18 and -50, Inception V3,
DeepLab V3) written out from their papers' layer tables as torchvision builds them, since
torchvision (which the zoo imports them from) cannot import with this CPU torch. Random weights;
the batch norms get random running statistics so that folding them into the convolutions matters.
Nothing here needs ExecuTorch: examples/bench_vision.py builds the same modules for torch on CUDA."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.utils import _pair


def conv_bn(cin, cout, kernel, stride=1, groups=1, act=nn.ReLU6, dilation=1, padding=None, eps=1e-5):
    """Convolution (no bias), batch norm, activation; "same" padding unless given."""
    if padding is None:
        padding = tuple(dilation * (k // 2) for k in _pair(kernel))
    conv = nn.Conv2d(cin, cout, kernel, stride, padding, dilation, groups=groups, bias=False)
    layers = [conv, nn.BatchNorm2d(cout, eps=eps)]
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


def make_divisible(v, divisor=8):
    """The channel rounding of MobileNet V2/V3: the nearest multiple of 8, never 10% below `v`."""
    rounded = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * v else rounded


class SqueezeExcite(nn.Module):
    def __init__(self, channels):
        super().__init__()
        squeezed = make_divisible(channels // 4)
        self.fc1, self.fc2 = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)

    def forward(self, x):
        scale = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(torch.relu(self.fc1(scale))))


class MobileNetV3Block(nn.Module):
    """Expand (1x1, when wider), depthwise (k x k), squeeze-excite, project; residual at stride 1."""

    def __init__(self, cin, kernel, hidden, cout, se, act, stride):
        super().__init__()
        layers = [conv_bn(cin, hidden, 1, act=act, eps=1e-3)] if hidden != cin else []
        layers.append(conv_bn(hidden, hidden, kernel, stride, groups=hidden, act=act, eps=1e-3))
        layers += [SqueezeExcite(hidden)] if se else []
        layers.append(conv_bn(hidden, cout, 1, act=None, eps=1e-3))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


# (in, kernel, expanded, out, squeeze-excite, activation, stride), Howard et al. 2019, table 2
MOBILENET_V3_SMALL = [
    (16, 3, 16, 16, True, nn.ReLU, 2), (16, 3, 72, 24, False, nn.ReLU, 2), (24, 3, 88, 24, False, nn.ReLU, 1),
    (24, 5, 96, 40, True, nn.Hardswish, 2), (40, 5, 240, 40, True, nn.Hardswish, 1),
    (40, 5, 240, 40, True, nn.Hardswish, 1), (40, 5, 120, 48, True, nn.Hardswish, 1),
    (48, 5, 144, 48, True, nn.Hardswish, 1), (48, 5, 288, 96, True, nn.Hardswish, 2),
    (96, 5, 576, 96, True, nn.Hardswish, 1), (96, 5, 576, 96, True, nn.Hardswish, 1),
]


class MobileNetV3Small(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        layers = [conv_bn(3, 16, 3, 2, act=nn.Hardswish, eps=1e-3)]
        layers += [MobileNetV3Block(*row) for row in MOBILENET_V3_SMALL]
        layers.append(conv_bn(96, 576, 1, act=nn.Hardswish, eps=1e-3))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(1024, classes))

    def forward(self, x):
        return self.classifier(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class Bottleneck(nn.Module):
    """1x1 down, 3x3 (the stride, ResNet v1.5; dilated in DeepLab's backbone), 1x1 up x4."""

    def __init__(self, cin, width, stride, dilation=1):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            conv_bn(cin, width, 1, act=nn.ReLU),
            conv_bn(width, width, 3, stride, act=nn.ReLU, dilation=dilation),
            conv_bn(width, cout, 1, act=None),
        )
        self.shortcut = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet50(nn.Module):
    """He et al. 2016, 50 layers: bottleneck stages of 3, 4, 6, 3 blocks. `dilate` (DeepLab V3's
    output stride 8) replaces the strides of stages 3 and 4 by dilations 2 and 4, as torchvision's
    replace_stride_with_dilation does (each stage's first block keeps the dilation before it)."""

    def __init__(self, classes=1000, dilate=False):
        super().__init__()
        layers, cin, dilation = [conv_bn(3, 64, 7, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1)], 64, 1
        for i, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
            stride, previous = (1 if i == 0 else 2), dilation
            if dilate and i >= 2:
                dilation, stride = dilation * stride, 1
            layers.append(Bottleneck(cin, width, stride, previous))
            layers += [Bottleneck(width * 4, width, 1, dilation) for _ in range(blocks - 1)]
            cin = width * 4
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, classes) if classes else None

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling (Chen et al. 2017): a 1x1, three dilated 3x3 and an image
    pool branch, concatenated and projected to 256 channels."""

    def __init__(self, cin, rates=(12, 24, 36), cout=256):
        super().__init__()
        self.branches = nn.ModuleList(
            [conv_bn(cin, cout, 1, act=nn.ReLU)] + [conv_bn(cin, cout, 3, act=nn.ReLU, dilation=r) for r in rates]
        )
        self.pool = conv_bn(cin, cout, 1, act=nn.ReLU)
        self.project = nn.Sequential(conv_bn(cout * (len(rates) + 2), cout, 1, act=nn.ReLU), nn.Dropout(0.5))

    def forward(self, x):
        pooled = F.interpolate(self.pool(F.adaptive_avg_pool2d(x, 1)), size=x.shape[-2:], mode="bilinear")
        return self.project(torch.cat([b(x) for b in self.branches] + [pooled], 1))


class DeepLabV3(nn.Module):
    """torchvision's deeplabv3_resnet50 without the auxiliary head: a dilated ResNet-50 (output
    stride 8), ASPP, a 3x3 conv and a 1x1 classifier, upsampled bilinearly to the input size."""

    def __init__(self, classes=21):
        super().__init__()
        self.backbone = ResNet50(classes=0, dilate=True).features
        self.head = nn.Sequential(ASPP(2048), conv_bn(256, 256, 3, act=nn.ReLU), nn.Conv2d(256, classes, 1))

    def forward(self, x):
        return F.interpolate(self.head(self.backbone(x)), size=x.shape[-2:], mode="bilinear")


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
