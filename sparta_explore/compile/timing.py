"""Whole-model timing inside compile: modules called like the captured model, alternately, medians compared.

Two cores shared with other work drift within seconds; alternating single calls exposes
every module to the same conditions (as `explore.timing` does for trials, a later stage).

Example:
    >>> dense_ms, compiled_ms = alternating_ms(graph, [graph.module, gm], runs=5)   # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from sparta_explore.graph import Graph
from sparta_explore.timing import interleaved_ms

BUDGET_S = 0.25
MAX_ROUNDS = 300
MIN_ROUNDS = 3
CLEAR_MARGIN = 0.8  # the fastest under this share of every other module's median: more rounds cannot change the order
OUT_OF_RACE = 1.5  # a module whose warm-up call took this many times the fastest warm-up is timed no further


def alternating_ms(graph: Graph, modules: list[nn.Module], runs: int, settle: bool = False) -> list[float]:
    """Median ms of each module called like `graph`'s model, calls alternating between them (after one warm-up each).

    At least `runs` rounds (3 at the least), more for fast models: up to a quarter second in all.
    `settle` (a race: only the fastest matters) saves the rounds that cannot change the winner,
    which on a large model are most of a compile's seconds: after the warm-up, modules past
    `OUT_OF_RACE` times the fastest warm-up are timed no further (the first module, the
    baseline, always is; the warm-up stands as their figure), and after `MIN_ROUNDS` rounds
    the timing stops once the fastest median is under `CLEAR_MARGIN` of every other one.

    Example:
        >>> dense_ms, compiled_ms = alternating_ms(graph, [graph.module, gm], runs=5)   # doctest: +SKIP
    """
    with torch.inference_mode():
        warm = []
        for m in modules:  # warm-up: first calls build kernels for new sizes, fault in pages
            t0 = time.perf_counter()
            graph.run(m)
            warm.append(time.perf_counter() - t0)
        # tiny models get more rounds (about a quarter second in all): their medians move with every call's overhead
        runs = max(MIN_ROUNDS, runs, min(MAX_ROUNDS, int(BUDGET_S / max(sum(warm), 1e-6))))
        racing = [i for i, w in enumerate(warm) if not settle or i == 0 or w <= OUT_OF_RACE * min(warm)]
        timed: dict[int, list[float]] = {i: [] for i in racing}
        for done in range(1, runs + 1):
            calls = interleaved_ms([modules[i] for i in racing], 1, tuple(graph.call_args), graph.call_kwargs)
            for i, t in zip(racing, calls):
                timed[i] += t
            if settle and done >= MIN_ROUNDS and _settled([statistics.median(t) for t in timed.values()]):
                break
    return [statistics.median(timed[i]) if i in timed else w * 1e3 for i, w in enumerate(warm)]


def _settled(medians: list[float]) -> bool:
    best = min(medians)
    return sum(m * CLEAR_MARGIN <= best for m in medians) == 1
