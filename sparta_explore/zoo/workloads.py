"""The embedded digits models as built-in workloads: trained once (cached), scored on the held-out digits.

Each digits model (`model_names(task="digits")`) is a `Workload`:

* model: trained on the digits train split on first use, cached (`zoo.training.pretrained`);
* metric "accuracy" on the 450 test digits (never seen by training, fine-tuning or calibration);
* training: cross-entropy over shuffled batches of 64 of the train split;
* calibration: the first 256 train images as inputs, accuracy on the last 384 as the
  validation metric (so the test split never picks bits);
* latency inputs: real test images, repeated up to the batch;
* architecture: the model untrained, so a wrong `prunable` name is found before training.

Example:
    >>> w = load_workload("digits-mlp")   # doctest: +SKIP
    >>> w.evaluate(w.dense_model())      # doctest: +SKIP
    0.9755
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.workload import Workload, register_workload
from sparta_explore.zoo.registry import build_model, get_spec, model_names

VALIDATION = 384   # last train examples: calibration's accuracy
CALIBRATION = 256  # first train examples: calibration's inputs
BATCH = 64


def repeat_to(x: torch.Tensor, batch: int) -> torch.Tensor:
    """`batch` rows of `x`, repeated if it has fewer (real data for timing).

    Example:
        >>> repeat_to(torch.arange(3.0).reshape(3, 1), 5).flatten().tolist()
        [0.0, 1.0, 2.0, 0.0, 1.0]
    """
    reps = -(-batch // len(x))
    return x.repeat(reps, *([1] * (x.dim() - 1)))[:batch].contiguous()


def digits_workload(name: str, *, cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Workload:
    """The built-in workload of the embedded digits model `name`.

    Example:
        >>> digits_workload("digits-cnn").metric_name  # doctest: +SKIP
        'accuracy'
    """
    from sparta_explore.zoo.data import load_digits_split
    from sparta_explore.zoo.training import evaluate, pretrained

    spec = get_spec(name)
    data = load_digits_split()
    train_x, train_y = data.train_x, data.train_y

    def build() -> nn.Module:
        model, _ = pretrained(name, cache_dir=cache_dir, data=data)
        return model

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(seed))
        for i in range(0, len(order), BATCH):
            idx = order[i:i + BATCH]
            yield train_x[idx], train_y[idx]

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    return Workload(
        name=name, model=build, inputs=(data.test_x[:1],),
        metric=lambda m: evaluate(m, data.test_x, data.test_y), metric_name="accuracy",
        latency_inputs=lambda batch: (repeat_to(data.test_x, batch),), default_batch=spec.default_batch,
        train_batches=batches, loss=loss,
        validation_metric=lambda m: evaluate(m, train_x[-VALIDATION:], train_y[-VALIDATION:]),
        calibration_inputs=(train_x[:CALIBRATION],), description=spec.description,
        architecture=lambda: build_model(name))


def _register(name: str) -> None:
    register_workload(name)(lambda cache_dir=None: digits_workload(name, cache_dir=cache_dir))


for _name in model_names(task="digits"):
    _register(_name)
