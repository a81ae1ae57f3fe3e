"""Whole-model timing inside compile: modules called like the captured model, alternately, medians compared.

Two cores shared with other work drift within seconds; alternating single calls exposes
every module to the same conditions (as `explore.timing` does for trials, a later stage).

Example:
    >>> dense_ms, compiled_ms = alternating_ms(graph, [graph.module, gm], runs=5)   # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping

import torch
from torch import nn

from sparta_explore.graph import Graph
from sparta_explore.timing import interleaved_ms

BUDGET_S = 0.25
MAX_ROUNDS = 300
MIN_ROUNDS = 3
CLEAR_MARGIN = 0.8  # the fastest under this share of every other module's median: more rounds cannot change the order
WIDE_MARGIN = 0.5  # ... under half of every other: one round fewer suffices
SURE_MARGIN = 1 / 3  # first calls doing the modules' own work this far apart: no round can change the winner
OUT_OF_RACE = 1.5  # a module whose warm-up call took this many times the fastest warm-up is timed no further


def alternating_ms(graph: Graph, modules: list[nn.Module], runs: int, settle: bool = False,
                   warm: Mapping[int, float] | None = None, estimates: Mapping[int, float] | None = None,
                   warm_exact: bool = False) -> list[float]:
    """Median ms of each module called like `graph`'s model, calls alternating between them (after one warm-up each).

    At least `runs` rounds (3 at the least), more for fast models: up to a quarter second in all.
    `settle` (a race: only the fastest matters) saves the rounds that cannot change the winner,
    which on a large model are most of a compile's seconds: after the warm-up, modules past
    `OUT_OF_RACE` times the fastest warm-up are timed no further (the first module, the
    baseline, always is; the warm-up or estimate stands as their figure), and after `MIN_ROUNDS` rounds
    the timing stops once the fastest median is under `CLEAR_MARGIN` of every other one (one
    round sooner under `WIDE_MARGIN`, after one round when the first calls in `warm` were
    already that far apart; after none when `warm_exact` and they are `SURE_MARGIN` apart).
    `warm` (by index: seconds) are first calls made already (a compile's checks ran the model):
    no warm-up for those; `warm_exact`: each did its module's own work (not a stand-in's).
    `estimates` (by index) stand in for a module's warm-up in that first cut (a module
    computing what another already ran does); one still in the race is warmed up.

    Example:
        >>> dense_ms, compiled_ms = alternating_ms(graph, [graph.module, gm], runs=5)   # doctest: +SKIP
    """
    known = dict(warm or {}) if settle else {}
    guessed = {i: s for i, s in (estimates or {}).items() if i not in known} if settle else {}
    with torch.inference_mode():
        first = dict(known)
        for i, m in enumerate(modules):  # warm-up: first calls build kernels for new sizes, fault in pages
            if i not in known and i not in guessed:
                first[i] = _call_seconds(graph, m)
        fastest = min(list(first.values()) + list(guessed.values()))
        racing = [i for i in range(len(modules))
                  if not settle or i == 0 or first.get(i, guessed.get(i, 0.0)) <= OUT_OF_RACE * fastest]
        for i in racing:
            if i not in first:  # an estimate that left it in the race: warm it up for real
                first[i] = _call_seconds(graph, modules[i])
        warm_s = [first.get(i, guessed.get(i, 0.0)) for i in range(len(modules))]
        # tiny models get more rounds (about a quarter second in all): their medians move with every call's overhead
        runs = max(MIN_ROUNDS, runs, min(MAX_ROUNDS, int(BUDGET_S / max(sum(warm_s), 1e-6))))
        # first calls made before (checks) that already part the fastest from the rest by WIDE_MARGIN: one round
        # that agrees settles it (BERT-base: a dense call is a second, the compiled one a fifth of that)
        wide_first = settle and len(racing) > 1 and all(i in known for i in racing) and \
            _settled([known[i] for i in racing], WIDE_MARGIN)
        # first calls of the modules' own work three times apart: a second of rounds (BERT-base) changes no winner
        if wide_first and warm_exact and _settled([known[i] for i in racing], SURE_MARGIN):
            runs = 0
        timed: dict[int, list[float]] = {i: [] for i in racing}
        for done in range(1, runs + 1):
            calls = interleaved_ms([modules[i] for i in racing], 1, tuple(graph.call_args), graph.call_kwargs)
            for i, t in zip(racing, calls):
                timed[i] += t
            medians = [statistics.median(t) for t in timed.values()] if settle else []
            if settle and (done >= MIN_ROUNDS and _settled(medians, CLEAR_MARGIN)
                           or done >= MIN_ROUNDS - 1 - wide_first and _settled(medians, WIDE_MARGIN)):
                break
    return [statistics.median(timed[i]) if timed.get(i) else w * 1e3 for i, w in enumerate(warm_s)]


def _call_seconds(graph: Graph, module: nn.Module) -> float:
    t0 = time.perf_counter()
    graph.run(module)
    return time.perf_counter() - t0


def _settled(medians: list[float], margin: float) -> bool:
    best = min(medians)
    return sum(m * margin <= best for m in medians) == 1
