"""The one timing loop: single calls timed with `time.perf_counter`, in rounds that alternate the callables.

Two cores shared with other work make a machine's speed drift within seconds; calling
each callable once per round exposes all of them to the same conditions, so ratios
between them do not carry that drift. `measure.measure` (one model) and
`device.fastest_ms` (kernels against each other) both time through `interleaved_ms`;
warm-up stays with the caller (`measure` resets the memory high-water mark in between).

Example:
    >>> a, b = interleaved_ms([abs, round], 3, (-1.5,))
    >>> len(a), len(b), min(a) >= 0
    (3, 3, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def interleaved_ms(fns: Sequence[Callable[..., Any]], rounds: int, args: tuple = (),
                   kwargs: Mapping[str, Any] | None = None) -> list[list[float]]:
    """Per callable, the wall time (ms) of each of `rounds` calls ``fn(*args, **kwargs)``, one call each per round.

    Nothing but the call is between the two clock reads (no wrapper, no bookkeeping), so a
    20 us model is timed, not the loop around it.

    Example:
        >>> [len(t) for t in interleaved_ms([abs], 5, (-1,))]
        [5]
    """
    kwargs = dict(kwargs or {})
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, out in zip(fns, times):
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            out.append((time.perf_counter() - t0) * 1e3)
    return times
