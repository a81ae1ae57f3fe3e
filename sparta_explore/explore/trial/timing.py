"""Interleaved latency: the dense baseline and the compiled model timed call by call, alternately.

Two cores shared with other work make a machine's speed drift within seconds; timing
the baseline first and the candidate after would fold that drift into their ratio.
Alternating single calls exposes both to the same conditions. The calls are timed by the
one timing loop (`sparta_explore.timing.interleaved_ms`) that `measure` uses too, so the
numbers mean what they mean everywhere else; peak memory is `measure`'s, of one warm call.

Example:
    >>> a, b = interleaved_measure([nn.Linear(64, 64), nn.Linear(64, 8)], (torch.randn(16, 64),), runs=5)
    >>> a.runs, b.runs, a.dense_flops
    (5, 5, 0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from sparta_explore.graph import Graph
from sparta_explore.measure import Measurement, call_of, measure
from sparta_explore.timing import interleaved_ms
from sparta_explore.tracing.inputs import set_mode


def interleaved_measure(models: Sequence[nn.Module], example_inputs: Any, *, runs: int = 20,
                        warmup: int = 3) -> list[Measurement]:
    """One `Measurement` per model from `runs` alternating calls (after `warmup` each); no FLOP count.

    `example_inputs`: a tuple, a dict of keyword inputs, or a `Graph` (as `measure` takes).

    Peak memory is the memory growth of one warm call of each model (`measure`).

    Example:
        >>> (m,) = interleaved_measure([nn.Linear(8, 8)], (torch.randn(2, 8),), runs=3, warmup=0)
        >>> m.median_ms > 0
        True
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    inputs = example_inputs if isinstance(example_inputs, (Mapping, Graph)) else tuple(example_inputs)
    # one measured call each after the warm-up: threads, weights and the call's peak memory
    first = [measure(m, inputs, runs=1, warmup=warmup, count=False) for m in models]
    args, kwargs = call_of(inputs)
    modes = [set_mode(m, False) for m in models]
    try:
        with torch.inference_mode():
            times = interleaved_ms(models, runs, args, kwargs)
    finally:
        for m, mode in zip(models, modes):
            set_mode(m, mode)
    out = []
    for m, ts in zip(first, times):
        p10, median, p90 = np.percentile(ts, [10, 50, 90])
        out.append(Measurement(median_ms=float(median), p10_ms=float(p10), p90_ms=float(p90), runs=runs,
                               threads=m.threads, peak_memory_mb=m.peak_memory_mb, weight_bytes=m.weight_bytes,
                               dense_flops=0, effective_flops=0))
    return out
