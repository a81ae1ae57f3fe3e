"""Calibration on a workload, or on a labelled split: calibration batch, accuracy data and a held-out set, disjoint.

`calibrate_workload` is what exploration runs: the workload (any `Task`) says what to
calibrate on and what to steer by. The rest studies calibration on labelled data: any
`LabelledSplit` (``train_x``, ``train_y``, ``test_x``, ``test_y``, e.g. the zoo's digits).

The calibration batch always comes from the train split. The accuracy `calibrate` steers
by comes from one of two places (`val_source`):

* ``"train"``: the train examples outside the calibration batch. The whole test split stays
  held out, but a model trained on the train split is near 100% there, so drops measured
  there are optimistic: the held-out drop can exceed the threshold at aggressive widths.
* ``"test"``: a seeded half of the test split, which the model never trained on; the other
  half is the held-out check. Faithful, but each half is small (225 digits: one example is
  0.44 points), so the held-out drop carries that much sampling noise.

What calibration promises: the accuracy drop on the data `eval_fn` scores (the validation
data) is at most the threshold, exactly, because every accepted step was measured there.
On data it never saw, the drop differs from the validation drop by sampling noise alone;
`held_out_margin` bounds that noise (a few standard errors of the difference of two
sample means), so ``held-out drop <= threshold + margin`` holds with high probability.

Example:
    >>> cd = calibration_data(load_digits_split(), val_source="test")   # doctest: +SKIP
    >>> r = calibrate_on_split(model, None, cd)                        # doctest: +SKIP
    >>> accuracy_on(cd.held_x, cd.held_y)(r.model)                     # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from sparta_explore.errors import ConfigError
from sparta_explore.graph import Graph
from sparta_explore.metrics import top1_accuracy
from sparta_explore.quality import quality
from sparta_explore.quantizers.calibrate import CalibrationResult, EvalFn, calibrate
from sparta_explore.quantizers.calibrate_config import CalibrationConfig
from sparta_explore.task import Task
from sparta_explore.tesa import TeSA

VAL_SOURCES = ("train", "test")


class LabelledSplit(Protocol):
    """Train and test examples with their labels (the zoo's `DataSplit` is one)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def accuracy_on(x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> EvalFn:
    """An `eval_fn` for `calibrate`: top-1 accuracy of a model on (x, y).

    Example:
        >>> accuracy_on(torch.zeros(4, 3), torch.tensor([0, 0, 1, 1]))(torch.nn.Identity())
        0.5
    """
    if len(x) != len(y) or not len(x):
        raise ConfigError(f"accuracy_on needs as many labels as inputs (and at least one), got {len(x)} and {len(y)}")
    return lambda model: top1_accuracy(model, x, y, batch_size=batch_size)


def flip_rate(before: torch.nn.Module, after: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of examples whose correctness differs between two models (the variance of a paired drop).

    Example:
        >>> flip_rate(torch.nn.Identity(), torch.nn.Identity(), torch.eye(3), torch.tensor([0, 1, 2]))
        0.0
    """
    with torch.no_grad():
        right = [(m(x).argmax(dim=1) == y) for m in (before, after)]
    return float((right[0] != right[1]).float().mean()) if len(y) else 0.0


def held_out_margin(flips: float, n_val: int, n_held: int, z: float = 3.0) -> float:
    """How much more than its validation drop a model may lose on held-out data by chance alone.

    Each example's change in correctness is -1, 0 or +1, non-zero with probability `flips`,
    so the validation and held-out drops (means over `n_val` and `n_held` examples) differ
    with variance at most ``flips * (1/n_val + 1/n_held)``; the margin is `z` standard
    deviations of that (z = 3: about one chance in 700 of exceeding it).

    Example:
        >>> round(held_out_margin(0.02, 225, 225), 4)
        0.04
        >>> held_out_margin(0.0, 225, 225)
        0.0
    """
    if n_val < 1 or n_held < 1 or not 0.0 <= flips <= 1.0:
        raise ConfigError(f"held_out_margin needs n_val, n_held >= 1 and flips in [0, 1], got {n_val}, {n_held}, "
                          f"{flips}")
    return z * math.sqrt(flips * (1.0 / n_val + 1.0 / n_held))


@dataclass(frozen=True)
class CalibrationData:
    """Disjoint calibration inputs, validation (accuracy) data and held-out data drawn from one split."""

    calib_x: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    held_x: torch.Tensor
    held_y: torch.Tensor
    val_source: str


def calibration_data(data: LabelledSplit, calib_size: int = 256, val_source: str = "train",
                     seed: int = 0) -> CalibrationData:
    """Draw the calibration batch from the train split, and validation / held-out data as `val_source` says.

    Example:
        >>> from types import SimpleNamespace
        >>> d = SimpleNamespace(train_x=torch.rand(10, 1), train_y=torch.zeros(10, dtype=torch.long),
        ...                     test_x=torch.rand(4, 1), test_y=torch.zeros(4, dtype=torch.long))
        >>> cd = calibration_data(d, calib_size=4, val_source="test")
        >>> len(cd.calib_x), len(cd.val_x), len(cd.held_x)
        (4, 2, 2)
    """
    n = len(data.train_x)
    if not 0 < calib_size < n:
        raise ConfigError(f"calib_size must be in 1..{n - 1} (the train split has {n} examples), got {calib_size}")
    if val_source not in VAL_SOURCES:
        raise ConfigError(f"val_source must be one of {list(VAL_SOURCES)}, got {val_source!r}")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g)
    calib, rest = order[:calib_size], order[calib_size:]
    if val_source == "train":
        return CalibrationData(data.train_x[calib], data.train_x[rest], data.train_y[rest], data.test_x, data.test_y,
                               val_source)
    if len(data.test_x) < 2:
        raise ConfigError(f"val_source='test' needs at least 2 test examples, the split has {len(data.test_x)}")
    test = torch.randperm(len(data.test_x), generator=g)
    val, held = test[: len(test) // 2], test[len(test) // 2:]
    return CalibrationData(data.train_x[calib], data.test_x[val], data.test_y[val], data.test_x[held],
                           data.test_y[held], val_source)


def calibrate_on_split(model: torch.nn.Module, table: Mapping[str, TeSA] | None,
                       data: LabelledSplit | CalibrationData, config: CalibrationConfig = CalibrationConfig(), *,
                       graph: Graph | None = None) -> CalibrationResult:
    """`calibrate` on `data` (a `CalibrationData`, or a `LabelledSplit` drawn with `calibration_data` defaults).

    Check the result on ``data.held_x`` / ``data.held_y`` (the whole test split for a `LabelledSplit`).

    Example:
        >>> r = calibrate_on_split(model, prune_table, load_digits_split())  # doctest: +SKIP
        >>> r.assignment()  # doctest: +SKIP
    """
    cd = data if isinstance(data, CalibrationData) else calibration_data(data)
    return calibrate(model, table, cd.calib_x, accuracy_on(cd.val_x, cd.val_y), config, graph=graph)


def calibrate_workload(model: torch.nn.Module, table: Mapping[str, TeSA] | None, workload: Task,
                       config: CalibrationConfig = CalibrationConfig(), *, graph: Graph | None = None
                       ) -> CalibrationResult:
    """`calibrate` on a workload: its calibration inputs, steered by its validation metric.

    The workload's reported metric (its held-out data) never steers calibration; a workload
    without a `validation_metric` cannot be calibrated (a `ConfigError` says so).
    A metric to minimize (`higher_is_better=False`, a perplexity) steers as its quality
    against the model as given (`sparta_explore.quality`), so the threshold is a relative rise.

    Example:
        >>> r = calibrate_workload(model, table, load_workload("digits-cnn"))  # doctest: +SKIP
    """
    if workload.validation_metric is None:
        raise ConfigError(f"workload {workload.name!r} has no validation_metric: calibration steers by data the "
                          "reported metric does not see, and this workload names none")
    inputs = workload.calibration_inputs if workload.calibration_inputs is not None else workload.inputs
    if isinstance(inputs, Mapping):
        raise ConfigError(f"workload {workload.name!r}: calibration runs models on positional inputs; its "
                          "calibration_inputs are keyword inputs")
    def validation(m: torch.nn.Module) -> float:
        return workload.evaluate(m, validation=True)

    steer = validation
    if not getattr(workload, "higher_is_better", True):
        # calibration keeps a lowering while the steering number drops by at most the threshold: for a
        # perplexity that number is the quality against the model as given (0.01 = 1% more perplexity)
        given = validation(model)

        def steer(m: torch.nn.Module) -> float:
            return quality(validation(m), higher_is_better=False, reference=given)
    return calibrate(model, table, inputs, steer, config, graph=graph)
