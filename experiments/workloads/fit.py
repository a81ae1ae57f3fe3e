"""Training shared by the example workloads: AdamW with a one-cycle schedule, weights cached on disk."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from sparta_explore.cache import atomic_write


def fit_cached(model: nn.Module, path: Path, epoch: Callable[[], Iterable], loss: Callable[[nn.Module, object],
               torch.Tensor], *, epochs: int, lr: float, weight_decay: float, pct_start: float = 0.3) -> nn.Module:
    """`model` with the weights saved at `path`, or trained for `epochs` passes over `epoch()` and saved there.

    Example:
        >>> net = fit_cached(net, cache / "net.pt", epoch, loss, epochs=3, lr=1e-3, weight_decay=0)  # doctest: +SKIP
    """
    if path.exists():
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return model.eval()
    steps = epochs * sum(1 for _ in epoch())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=pct_start)
    model.train()
    for _ in range(epochs):
        for batch in epoch():
            opt.zero_grad()
            loss(model, batch).backward()
            opt.step()
            sched.step()
    model.eval()
    atomic_write(path, lambda f: torch.save(model.state_dict(), f))
    return model
