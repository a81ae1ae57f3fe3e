"""Interleaved latency: the dense baseline and the compiled model timed call by call, alternately.

Two cores shared with other work make a machine's speed drift within seconds; timing
the baseline first and the candidate after would fold that drift into their ratio.
Alternating single calls exposes both to the same conditions; each call is still timed
by `measure`, so the numbers mean what they mean everywhere else.

Example:
    >>> a, b = interleaved_measure([nn.Linear(64, 64), nn.Linear(64, 8)], (torch.randn(16, 64),), runs=5)
    >>> a.runs, b.runs, a.dense_flops
    (5, 5, 0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch  # noqa: F401  (used by the docstring examples)
from torch import nn

from sparta_explore.graph import Graph
from sparta_explore.measure import Measurement, measure


def interleaved_measure(models: Sequence[nn.Module], example_inputs: Any, *, runs: int = 20,
                        warmup: int = 3) -> list[Measurement]:
    """One `Measurement` per model from `runs` alternating calls (after `warmup` each); no FLOP count.

    `example_inputs`: a tuple, a dict of keyword inputs, or a `Graph` (as `measure` takes).

    Peak memory is the largest growth seen in any of a model's calls.

    Example:
        >>> (m,) = interleaved_measure([nn.Linear(8, 8)], (torch.randn(2, 8),), runs=3, warmup=0)
        >>> m.median_ms > 0
        True
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    inputs = example_inputs if isinstance(example_inputs, (Mapping, Graph)) else tuple(example_inputs)
    first = [measure(m, inputs, runs=1, warmup=warmup, count=False) for m in models]
    times: list[list[float]] = [[] for _ in models]
    peaks: list[list[float]] = [[] for _ in models]
    for _ in range(runs):
        for i, model in enumerate(models):
            one = measure(model, inputs, runs=1, warmup=0, count=False)
            times[i].append(one.median_ms)
            if one.peak_memory_mb is not None:
                peaks[i].append(one.peak_memory_mb)
    out = []
    for m, ts, ps in zip(first, times, peaks):
        p10, median, p90 = np.percentile(ts, [10, 50, 90])
        out.append(Measurement(median_ms=float(median), p10_ms=float(p10), p90_ms=float(p90), runs=runs,
                               threads=m.threads, peak_memory_mb=max(ps) if ps else None,
                               weight_bytes=m.weight_bytes, dense_flops=0, effective_flops=0))
    return out
