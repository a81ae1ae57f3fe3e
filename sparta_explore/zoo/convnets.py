"""ResNet-style (residual add) and MobileNet-style (depthwise-separable) conv nets."""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus a shortcut (1x1 conv-BN when shape changes), then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.shortcut(x))


class ResNetMini(nn.Module):
    """Stem conv, one stage of `blocks` BasicBlocks per width (stride 2 between), pool, linear.

    Example:
        >>> ResNetMini()(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, widths: tuple[int, ...] = (16, 32), blocks: int = 1, num_classes: int = 10,
                 in_channels: int = 1) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            for j in range(blocks):
                layers.append(BasicBlock(cin, w, stride=2 if (i > 0 and j == 0) else 1))
                cin = w
        self.stages = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.stages(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


class DepthwiseSeparable(nn.Module):
    """Depthwise 3x3 conv-BN-ReLU6, then pointwise 1x1 conv-BN-ReLU6."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.dw = nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False)
        self.bn_dw = nn.BatchNorm2d(cin)
        self.pw = nn.Conv2d(cin, cout, 1, bias=False)
        self.bn_pw = nn.BatchNorm2d(cout)
        self.act = nn.ReLU6()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn_pw(self.pw(self.act(self.bn_dw(self.dw(x))))))


class MobileNetMini(nn.Module):
    """Stem conv, depthwise-separable blocks, global average pool, dropout, linear.

    `strides` has one entry per block; its length fixes the depth.

    Example:
        >>> MobileNetMini()(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), strides: tuple[int, ...] = (1, 2, 1),
                 stem: int = 16, num_classes: int = 10, in_channels: int = 1, dropout: float = 0.1) -> None:
        super().__init__()
        if len(widths) != len(strides):
            raise ValueError(f"MobileNetMini: widths {widths} and strides {strides} differ in length")
        self.stem = nn.Sequential(nn.Conv2d(in_channels, stem, 3, padding=1, bias=False), nn.BatchNorm2d(stem),
                                  nn.Hardswish())
        blocks, cin = [], stem
        for w, s in zip(widths, strides):
            blocks.append(DepthwiseSeparable(cin, w, s))
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.blocks(self.stem(x))).flatten(1)
        return self.fc(self.dropout(x))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand conv-BN-ReLU6, 3x3 depthwise conv-BN-ReLU6, 1x1 project conv-BN, residual add.

    The residual is added when the block keeps its input's shape (stride 1, same width).
    """

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), nn.ReLU6(),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


# (expand ratio, width, blocks, first stride) per stage: MobileNetV2's table, narrowed for 32x32 inputs
MOBILENETV2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 3, 2), (6, 96, 2, 1))


class MobileNetV2Mini(nn.Module):
    """Stem conv-BN-ReLU6, inverted-residual stages, 1x1 conv-BN-ReLU6 head, global average pool, linear.

    Example:
        >>> MobileNetV2Mini()(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(self, stages: tuple[tuple[int, int, int, int], ...] = MOBILENETV2_STAGES, stem: int = 32,
                 last: int = 320, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, stem, 3, padding=1, bias=False), nn.BatchNorm2d(stem),
                                  nn.ReLU6())
        blocks, cin = [], stem
        for expand, width, n, stride in stages:
            for i in range(n):
                blocks.append(InvertedResidual(cin, width, stride if i == 0 else 1, expand))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.head(self.blocks(self.stem(x))))
        return self.fc(torch.flatten(x, 1))
