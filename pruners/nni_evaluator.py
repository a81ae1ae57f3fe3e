"""NNI `TorchEvaluator`s built from a `Workload` (its batches, loss and metric) or a classification `DataSplit`.

NNI's training-aware pruners and all its quantizers train through an evaluator. NNI
calls `training_func(model, optimizer, training_step, lr_schedulers, max_steps, max_epochs)`
with its own wrapped model and a re-created optimizer; the function must stop at
`max_steps`, or NNI silently returns masks computed from too few steps.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import nni
import torch
import torch.nn.functional as F
from nni.compression import TorchEvaluator
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.workload import Workload
from sparta_explore.zoo.data import DataSplit
from sparta_explore.zoo.training import evaluate


@contextlib.contextmanager
def quiet_nni() -> Iterator[None]:
    """Silence NNI's colour logging to stdout and torch's notes on NNI's patched optimizer."""
    logger = logging.getLogger("nni")
    level = logger.level
    logger.setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*optimizer.step\\(\\)` has been overridden.*")
        warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        try:
            yield
        finally:
            logger.setLevel(level)


def _torch_evaluator(model: nn.Module, epoch: Callable[[], Iterable[Any]], loss: Callable[[nn.Module, Any], Any],
                     evaluating_func: Callable[[nn.Module], float], steps_per_epoch: int, lr: float) -> TorchEvaluator:
    """A TorchEvaluator training with `loss` over repeated passes of `epoch()` batches."""
    def batches() -> Iterator[Any]:
        while True:
            yield from epoch()

    def training_step(batch: Any, model: nn.Module) -> torch.Tensor:
        return loss(model, batch)

    def training_func(model: nn.Module, optimizers: Any, training_step: Any, lr_schedulers: Any = None,
                      max_steps: int | None = None, max_epochs: int | None = None) -> None:
        if max_steps is None:
            max_steps = (max_epochs or 1) * steps_per_epoch
        elif max_epochs is not None:
            max_steps = min(max_steps, max_epochs * steps_per_epoch)
        model.train()
        stream = batches()
        for _ in range(max_steps):
            optimizers.zero_grad()
            training_step(next(stream), model).backward()
            optimizers.step()
            if lr_schedulers is not None:
                lr_schedulers.step()

    # NNI 3.0 cannot name a root-level parameter (e.g. a position embedding) when it adds
    # quantizer parameters to a param group (IndexError in find_param_group); it stops at
    # the first group holding the module, so root-level parameters go in a second group.
    nested = [p for n, p in model.named_parameters() if "." in n]
    root = [p for n, p in model.named_parameters() if "." not in n]
    groups = [{"params": nested}] + ([{"params": root}] if root else [])
    optimizer = nni.trace(torch.optim.Adam)(groups, lr=lr)
    return TorchEvaluator(training_func, optimizer, training_step, evaluating_func=evaluating_func)


def classification_evaluator(model: nn.Module, data: DataSplit, *, batch_size: int = 64, lr: float = 1e-3,
                             seed: int = 0, eval_split: str = "test") -> TorchEvaluator:
    """A TorchEvaluator that fine-tunes `model` with Adam on `data.train_*` (cross-entropy)
    and reports accuracy on `eval_split` from `evaluating_func`. PtqQuantizer calibrates
    through `evaluating_func`, so it gets ``eval_split="train"`` (no test data in calibration).

    Example:
        >>> ev = classification_evaluator(model, load_digits_split())  # doctest: +SKIP
        >>> TaylorPruner(model, config_list, ev, training_steps=20)    # doctest: +SKIP
    """
    if eval_split not in ("train", "test"):
        raise ValueError(f"eval_split must be 'train' or 'test', got {eval_split!r}")
    g = torch.Generator().manual_seed(seed)

    def epoch() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(data.train_x), generator=g)
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            yield data.train_x[idx], data.train_y[idx]

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch[0]), batch[1])

    eval_x, eval_y = (data.train_x, data.train_y) if eval_split == "train" else (data.test_x, data.test_y)
    return _torch_evaluator(model, epoch, loss, lambda m: evaluate(m, eval_x, eval_y),
                            -(-len(data.train_x) // batch_size), lr)


def workload_evaluator(model: nn.Module, workload: Workload, *, lr: float = 1e-3,
                       eval_split: str = "test") -> TorchEvaluator:
    """A TorchEvaluator training on the workload's batches and loss, scoring with its metric.

    With ``eval_split="train"`` (PTQ calibrates through `evaluating_func`) it scores with the
    workload's validation metric, so held-out data never steers a compressor.

    Example:
        >>> ev = workload_evaluator(model, load_workload("digits-cnn"))  # doctest: +SKIP
    """
    if not workload.can_train:
        raise ConfigError(f"workload {workload.name!r} has no train_batches / loss: NNI's training-aware "
                          "compressors cannot train it")
    validation = eval_split == "train" and workload.validation_metric is not None
    steps = sum(1 for _ in workload.train_batches())
    return _torch_evaluator(model, workload.train_batches, workload.loss,
                            lambda m: workload.evaluate(m, validation=validation), max(1, steps), lr)


def resolve_evaluator(model: nn.Module, evaluator: Any, eval_split: str = "test") -> Any:
    """`evaluator` itself, or an NNI evaluator built from a `Workload` or a `DataSplit`."""
    if isinstance(evaluator, Workload):
        return workload_evaluator(model, evaluator, eval_split=eval_split)
    if isinstance(evaluator, DataSplit):
        return classification_evaluator(model, evaluator, eval_split=eval_split)
    return evaluator
