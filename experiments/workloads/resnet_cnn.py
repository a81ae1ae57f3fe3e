"""Workload: a ResNet-style CNN written in plain PyTorch (what CNN users bring), on the digits at 16x16.

What it is, honestly: the bundled 8x8 digits upsampled to 16x16 (bilinear), a small
ResNet (stem conv, three stages of two basic blocks with residual adds, widths
32/64/128, global average pool, linear head) trained once for 15 epochs (~1 minute on
2 cores, cached in the sparta-explore cache), scored by accuracy on the 450 test digits.
Latency at batch 64. Nothing here is sparta-explore specific except the `Workload` at the
end: it is how a user describes their own model, data and metric.

Use it: ``sparta-explore sweep --workload experiments/workloads/resnet_cnn.py:workload --pruner l1norm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from fit import fit_cached
from torch import nn

from sparta_explore.cache import content_key, resolve_cache_dir
from sparta_explore.workload import Workload
from sparta_explore.zoo import load_digits_split


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (32, 64, 128), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def _upsampled(x: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)


def resnet_workload(widths: tuple[int, ...] = (32, 64, 128), epochs: int = 15, cache_dir: str | None = None
                    ) -> Workload:
    """The workload; narrower widths make quick variants.

    Example:
        >>> w = resnet_workload(widths=(8, 16), epochs=1)  # doctest: +SKIP
    """
    data = load_digits_split()
    train_x, train_y, test_x, test_y = _upsampled(data.train_x), data.train_y, _upsampled(data.test_x), data.test_y

    def epoch():
        # whole batches only (drop_last): torch 2.13's 2-thread conv backward was seen to corrupt the heap on
        # this ResNet with a last batch of 3 (AMD EPYC, AVX-512); full batches never did
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(0))
        for i in range(0, len(order) - 63, 64):
            idx = order[i:i + 64]
            yield train_x[idx], train_y[idx]

    def loss(model, batch):
        return F.cross_entropy(model(batch[0]), batch[1])

    def accuracy(model, x, y):
        with torch.no_grad():
            return float((model(x).argmax(1) == y).float().mean())

    def build() -> nn.Module:
        torch.manual_seed(0)
        model = ResNet(widths)
        path = resolve_cache_dir(cache_dir, "workloads") / f"resnet-{content_key([widths, epochs])}.pt"
        return fit_cached(model, path, epoch, loss, epochs=epochs, lr=3e-3, weight_decay=1e-4)

    def latency(batch: int) -> tuple[torch.Tensor]:
        return (test_x.repeat(-(-batch // len(test_x)), 1, 1, 1)[:batch].contiguous(),)

    return Workload(
        name=f"resnet-{'-'.join(map(str, widths))}", model=build, inputs=(test_x[:2],),
        metric=lambda m: accuracy(m, test_x, test_y), metric_name="accuracy", latency_inputs=latency,
        default_batch=64, train_batches=epoch, loss=loss,
        validation_metric=lambda m: accuracy(m, train_x[-384:], train_y[-384:]),
        calibration_inputs=(train_x[:256],), head="fc",
        description="plain-PyTorch ResNet (3 stages x 2 basic blocks, widths 32/64/128) on 16x16 digits")


def workload() -> Workload:
    """The default variant: widths 32/64/128."""
    return resnet_workload()


def tiny() -> Workload:
    """A variant small enough for tests."""
    return resnet_workload(widths=(8, 16), epochs=3)
