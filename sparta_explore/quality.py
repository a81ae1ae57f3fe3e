"""A metric as a quality: one number that grows as the model gets better, on an accuracy's scale.

A workload scores models with a metric that improves upwards (an accuracy) or downwards (a
perplexity, a loss: `Workload.higher_is_better=False`). Whatever ranks, trades or thresholds
models (Pareto fronts and their hypervolume, objectives, tuners, picks, bits calibration)
reads the quality, so one code path serves both kinds:

* higher is better: the metric itself;
* lower is better: ``reference / metric``, the reference being the dense model's metric:
  1.0 at the dense model's perplexity, 0.5 at twice it, towards 0 as the model breaks
  (without a reference, ``1 / metric``; for a perplexity that is the geometric-mean
  probability the model gives the right next token). A metric at or below 0 (a loss of 0)
  is a perfect model: quality infinity.

A quality is positive for the metrics that are positive, about 1 for a good model, and a
difference of 0.01 is one point of accuracy, or a perplexity about 1% of the dense one higher.

Example:
    >>> quality(0.93), quality(29.6, higher_is_better=False, reference=14.8)
    (0.93, 0.5)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def quality(value: float, higher_is_better: bool = True, reference: float | None = None) -> float:
    """`value` of a metric as a quality (see the module docstring); NaN stays NaN.

    Example:
        >>> quality(20.0, higher_is_better=False), quality(float("nan"), higher_is_better=False)
        (0.05, nan)
    """
    value = float(value)
    if higher_is_better or math.isnan(value):
        return value
    ref = 1.0 if reference is None or not math.isfinite(float(reference)) else float(reference)
    return ref / value if value > 0 else math.inf


def as_bool(value: Any, default: bool = True) -> bool:
    """A flag as read back from a results file ("True", "false", 1, NaN for a missing cell: `default`).

    Example:
        >>> as_bool("False"), as_bool(float("nan")), as_bool(True)
        (False, True, True)
    """
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return default
    return bool(value)


def row_quality(row: Mapping[str, Any]) -> float:
    """A results row's quality: its `quality` column, else from `accuracy` (the workload's metric),
    `higher_is_better` (True when absent) and `dense_accuracy` (the reference).

    Example:
        >>> row_quality({"accuracy": 30.0, "higher_is_better": False, "dense_accuracy": 15.0})
        0.5
    """
    given = row.get("quality")
    if given is not None and not (isinstance(given, float) and math.isnan(given)):
        return float(given)
    value = row.get("accuracy")
    if value is None:
        return math.nan
    return quality(value, as_bool(row.get("higher_is_better")), row.get("dense_accuracy"))


def quality_column(df: Any) -> Any:
    """The quality of each row of a results DataFrame, as a float Series (`row_quality` per row).

    Example:
        >>> import pandas as pd
        >>> quality_column(pd.DataFrame({"accuracy": [0.9, 0.8]})).tolist()
        [0.9, 0.8]
    """
    import pandas as pd

    if len(df) == 0:
        return pd.Series([], index=df.index, dtype=float)
    return pd.Series([row_quality(r) for r in df.to_dict("records")], index=df.index, dtype=float)
