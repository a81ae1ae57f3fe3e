"""Calibration sets: what one-shot compressors run the model on, as a list of single forward calls.

A one-shot compressor's `evaluator` is its calibration set. Each sample is one call of
the model, `model(*args, **kwargs)`, so samples of different lengths and attention masks
never have to share a batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sparta_explore.errors import ConfigError
from sparta_explore.task import Task


@dataclass(frozen=True)
class CalibrationSample:
    """One forward call of the model: `model(*args, **kwargs)`.

    Example:
        >>> CalibrationSample((torch.zeros(1, 4, dtype=torch.long),)).kwargs
        {}
    """

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def _rows(batch: Any, n: int) -> list[Any]:
    """`batch` split into `n` rows of batch 1 (tensors whose first dim is not `n` are shared)."""
    if isinstance(batch, torch.Tensor) and batch.dim() > 0 and batch.shape[0] == n:
        return [batch[i:i + 1] for i in range(n)]
    return [batch] * n


def _batch_size(values: Sequence[Any], what: str) -> int:
    sizes = {v.shape[0] for v in values if isinstance(v, torch.Tensor) and v.dim() > 0}
    if len(sizes) != 1:
        raise ConfigError(f"{what}: the calibration tensors must share their first (sample) dim, got sizes "
                          f"{sorted(sizes)}")
    return sizes.pop()


def _split_batch(inputs: Any, what: str) -> list[CalibrationSample]:
    """A batch of model inputs (a tensor, a tuple of positional tensors, a dict of keyword ones) split by row."""
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() == 0:
            raise ConfigError(f"{what}: a calibration tensor needs a sample dim, got a scalar")
        return [CalibrationSample((inputs[i:i + 1],)) for i in range(inputs.shape[0])]
    if isinstance(inputs, Mapping):
        n = _batch_size(list(inputs.values()), what)
        columns = {k: _rows(v, n) for k, v in inputs.items()}
        return [CalibrationSample((), {k: v[i] for k, v in columns.items()}) for i in range(n)]
    if isinstance(inputs, (tuple, list)):
        n = _batch_size(list(inputs), what)
        columns = [_rows(v, n) for v in inputs]
        return [CalibrationSample(tuple(c[i] for c in columns)) for i in range(n)]
    raise ConfigError(f"{what}: cannot split {type(inputs).__name__} into calibration samples")


def _one_sample(item: Any, index: int) -> CalibrationSample:
    if isinstance(item, CalibrationSample):
        return item
    if isinstance(item, Mapping):
        return CalibrationSample((), dict(item))
    if isinstance(item, torch.Tensor):
        # a bare row of token ids (seq,) is one sequence: the model wants (1, seq)
        return CalibrationSample((item.unsqueeze(0) if item.dim() == 1 and not item.is_floating_point() else item,))
    if isinstance(item, tuple):
        return CalibrationSample(item)
    raise ConfigError(f"calibration sample {index} is a {type(item).__name__}; give a tensor, a tuple of "
                      "positional inputs or a dict of keyword inputs")


def calibration_samples(source: Any, samples: int | None = None) -> list[CalibrationSample]:
    """The first `samples` calibration samples of `source` (all of them for None), one forward call each.

    `source` is a tensor whose first dim counts samples (token ids `(n, seq)`), a dict of
    batched keyword inputs (a tokenizer's output), a sequence of per-sample inputs (tensors,
    tuples of positional inputs, dicts of keyword inputs), or a workload (`Task`), whose
    `calibration_inputs` (else `inputs`) are split by row. Fewer samples than asked is a
    `ConfigError`.

    Example:
        >>> ids = torch.randint(0, 100, (8, 16))
        >>> [s.args[0].shape for s in calibration_samples(ids, 2)]
        [torch.Size([1, 16]), torch.Size([1, 16])]
        >>> calibration_samples(ids, 16)
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: the calibration set has 8 samples; the config asks for 16 (samples=16)
    """
    if samples is not None and (not isinstance(samples, int) or samples < 1):
        raise ConfigError(f"samples must be a positive int or None (all), got {samples!r}")
    if isinstance(source, Task):
        inputs = source.calibration_inputs if source.calibration_inputs is not None else source.inputs
        found = _split_batch(inputs, f"workload {source.name!r}")
    elif isinstance(source, (torch.Tensor, Mapping)):
        found = _split_batch(source, "the calibration set")
    elif isinstance(source, (list, tuple)):
        found = [_one_sample(item, i) for i, item in enumerate(source)]
    else:
        raise ConfigError(f"one-shot compressors calibrate on token ids (n, seq), a dict of batched inputs, a list "
                          f"of per-sample inputs or a workload; got {type(source).__name__}")
    if not found:
        raise ConfigError("the calibration set is empty")
    if samples is not None and samples > len(found):
        raise ConfigError(f"the calibration set has {len(found)} samples; the config asks for {samples} "
                          f"(samples={samples})")
    return found if samples is None else found[:samples]


def to_device(value: Any, device: torch.device) -> Any:
    """`value` with every tensor inside (tuples, lists, dicts) moved to `device`.

    Example:
        >>> to_device({"x": (torch.ones(1),)}, torch.device("cpu"))
        {'x': (tensor([1.]),)}
    """
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(to_device(v, device) for v in value)
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value
