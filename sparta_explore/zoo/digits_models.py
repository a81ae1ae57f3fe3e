"""Small classifiers for the 8x8 digits: a CNN and an MLP (inputs (N, 1, 8, 8))."""

from __future__ import annotations

import torch
from torch import nn


class DigitsCNN(nn.Module):
    """conv-BN-ReLU x2, max-pool, then a two-layer classifier head.

    Example:
        >>> DigitsCNN()(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, channels: tuple[int, int] = (16, 32), hidden: int = 64, num_classes: int = 10,
                 in_channels: int = 1, image_size: int = 8) -> None:
        super().__init__()
        c1, c2 = channels
        self.conv1 = nn.Conv2d(in_channels, c1, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c2)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(c2 * (image_size // 2) ** 2, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        x = torch.flatten(x, 1)
        return self.fc2(torch.relu(self.fc1(x)))


class DigitsMLP(nn.Module):
    """Flatten, then Linear-ReLU layers.

    Example:
        >>> DigitsMLP()(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, hidden: tuple[int, ...] = (256, 128), num_classes: int = 10, in_features: int = 64) -> None:
        super().__init__()
        sizes = (in_features, *hidden)
        self.flatten = nn.Flatten()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.head = nn.Linear(sizes[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.flatten(x)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)
