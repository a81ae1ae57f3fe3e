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


def alternating_ms(graph: Graph, modules: list[nn.Module], runs: int) -> list[float]:
    """Median ms of each module called like `graph`'s model, calls alternating between them (after one warm-up each).

    At least `runs` rounds (3 at the least), more for fast models: up to a quarter second in all.

    Example:
        >>> dense_ms, compiled_ms = alternating_ms(graph, [graph.module, gm], runs=5)   # doctest: +SKIP
    """
    with torch.inference_mode():
        t0 = time.perf_counter()
        for m in modules:  # warm-up: first calls build kernels for new sizes, fault in pages
            graph.run(m)
        round_s = time.perf_counter() - t0
        # tiny models get more rounds (about a quarter second in all): their medians move with every call's overhead
        runs = max(3, runs, min(MAX_ROUNDS, int(BUDGET_S / max(round_s, 1e-6))))
        times = interleaved_ms(modules, runs, tuple(graph.call_args), graph.call_kwargs)
    return [statistics.median(t) for t in times]
