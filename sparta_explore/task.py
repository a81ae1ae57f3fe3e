"""Task: what compressors may train and score a model with (batches, loss, metrics, calibration inputs).

Pruners and quantizers come before exploration in the flow, so they never import
`sparta_explore.workload`; they take any value with these attributes. Every `Workload`
is a `Task` (it has them all), and so is any stand-in a test or a user builds.

Example:
    >>> from sparta_explore.workload import Workload
    >>> isinstance(Workload("w", nn.Identity(), (), metric=lambda m: 1.0), Task)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class Task(Protocol):
    """The part of a workload a compressor reads; see the module docstring.

    * `train_batches()` (one epoch, a fresh iterable per call) and `loss(model, batch)`:
      what NNI's training-aware compressors train with; `can_train` says both are there.
    * `evaluate(model, validation=...)`: the metric, or the validation metric that
      calibration and PTQ steer by (`validation_metric` is None when there is none).
    * `calibration_inputs` (or `inputs`): what calibration runs the model on.

    Example:
        >>> isinstance(object(), Task)
        False
    """

    name: str
    inputs: Any
    train_batches: Callable[[], Iterable[Any]] | None
    loss: Callable[[nn.Module, Any], torch.Tensor] | None
    validation_metric: Callable[[nn.Module], float] | None
    calibration_inputs: Any

    @property
    def can_train(self) -> bool: ...

    def evaluate(self, model: nn.Module, *, validation: bool = False) -> float: ...
