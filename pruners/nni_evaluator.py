"""NNI `TorchEvaluator`s built from a workload (any `Task`: its batches, loss and metric).

NNI's training-aware pruners and all its quantizers train through an evaluator. NNI
calls `training_func(model, optimizer, training_step, lr_schedulers, max_steps, max_epochs)`
with its own wrapped model and a re-created optimizer; the function must stop at
`max_steps`, or NNI silently returns masks computed from too few steps.

Example:
    >>> ev = resolve_evaluator(model, load_workload("digits-cnn"))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import nni
import torch
from nni.compression import TorchEvaluator
from nni.compression.utils.evaluator import Evaluator
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.task import Task


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


def workload_evaluator(model: nn.Module, workload: Task, *, lr: float = 1e-3,
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
    """`evaluator` itself (an NNI `Evaluator`, or None), or an NNI evaluator built from a workload (a `Task`).

    Anything else is a `ConfigError` here, not an obscure failure inside NNI.

    Example:
        >>> resolve_evaluator(None, None) is None
        True
    """
    if evaluator is None or isinstance(evaluator, Evaluator):
        return evaluator
    if isinstance(evaluator, Task):
        return workload_evaluator(model, evaluator, eval_split=eval_split)
    raise ConfigError(f"evaluator must be an NNI Evaluator or a workload that can train (train_batches, loss, "
                      f"evaluate), got {type(evaluator).__name__}")
