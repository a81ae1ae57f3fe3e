"""Train the digits models once and cache their weights in the user cache folder.

Weights are never stored in the repository. The cache key covers the model's
architecture, the training recipe, the data split and the torch version, so a change
to any of them retrains instead of loading stale weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.cache import atomic_write, content_key, resolve_cache_dir
from sparta_explore.errors import ConfigError
from sparta_explore.metrics import top1_accuracy as evaluate  # the digits models' metric, by its zoo name
from sparta_explore.zoo.data import DataSplit, load_digits_split
from sparta_explore.zoo.registry import build_model, get_spec


@dataclass(frozen=True)
class TrainConfig:
    """Recipe for a short supervised training run (AdamW, cosine learning rate)."""

    epochs: int = 30
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 1e-4
    seed: int = 0
    # torch threads while training: parallel reductions (a weight gradient sums over the batch)
    # add in an order that depends on the thread count, so a fixed count keeps the trained
    # weights the same whichever test, trial or machine asks first. None: leave it as it is.
    threads: int | None = 1

    def __post_init__(self) -> None:
        for key in ("epochs", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"TrainConfig.{key} must be >= 1, got {getattr(self, key)}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"TrainConfig.threads must be >= 1 or None, got {self.threads}")
        if self.lr <= 0:
            raise ConfigError(f"TrainConfig.lr must be > 0, got {self.lr}")


def train(model: nn.Module, data: DataSplit, config: TrainConfig = TrainConfig(),
          after_step: Callable[[nn.Module], None] | None = None) -> float:
    """Train `model` in place on `data.train_*`; returns test accuracy.

    `after_step(model)` runs after every optimizer step (e.g. re-applying pruning masks,
    so fine-tuning never revives a pruned weight).

    Example:
        >>> train(DigitsMLP(), load_digits_split(), TrainConfig(epochs=5))  # doctest: +SKIP
        0.95
    """
    threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        _fit(model, data, config, after_step)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return evaluate(model, data.test_x, data.test_y)


def _fit(model: nn.Module, data: DataSplit, config: TrainConfig,
         after_step: Callable[[nn.Module], None] | None) -> None:
    g = torch.Generator().manual_seed(config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = -(-len(data.train_x) // config.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=config.epochs * steps_per_epoch)
    model.train()
    for _ in range(config.epochs):
        order = torch.randperm(len(data.train_x), generator=g)
        for i in range(0, len(order), config.batch_size):
            idx = order[i:i + config.batch_size]
            loss = F.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            if after_step is not None:
                after_step(model)


def pretrained(name: str, *, cache_dir: str | os.PathLike | None = None, config: TrainConfig = TrainConfig(),
               data: DataSplit | None = None) -> tuple[nn.Module, float]:
    """Model `name` trained on the digits: loaded from the cache, or trained and cached.

    Returns the model (eval mode) and its test accuracy, measured now.

    Example:
        >>> model, acc = pretrained("digits-cnn")  # doctest: +SKIP
    """
    spec = get_spec(name)
    if spec.task != "digits":
        raise ConfigError(f"model {name!r} has no training task (it is a latency model with random weights)")
    data = data or load_digits_split()
    model = build_model(name, seed=config.seed)
    key = content_key({"name": name, "arch": repr(model), "train": asdict(config), "data": data.name,
                       "n_train": len(data.train_x), "n_test": len(data.test_x), "torch": torch.__version__})
    folder = resolve_cache_dir(cache_dir, "zoo")
    weights = folder / f"{name}-{key}.pt"
    if weights.exists():
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        model.eval()
        return model, evaluate(model, data.test_x, data.test_y)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        acc = train(model, data, config)
    atomic_write(weights, lambda f: torch.save(model.state_dict(), f))
    atomic_write(weights.with_suffix(".json"),
                 lambda f: f.write(json.dumps({"name": name, "test_accuracy": acc, "train": asdict(config)}).encode()))
    return model, acc
