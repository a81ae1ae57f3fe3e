"""Metrics on labelled data that several stages score models with (the zoo's training, calibration).

Example:
    >>> top1_accuracy(nn.Identity(), torch.eye(3), torch.tensor([0, 1, 0]))
    0.6666666666666666
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def top1_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> float:
    """Top-1 accuracy of `model` on (x, y), in eval mode, `batch_size` rows a call; the model's mode is restored.

    Example:
        >>> top1_accuracy(nn.Identity(), torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))
        0.0
    """
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(x), batch_size):
        correct += int((model(x[i:i + batch_size]).argmax(dim=1) == y[i:i + batch_size]).sum())
    model.train(was_training)
    return correct / len(x) if len(x) else 0.0
