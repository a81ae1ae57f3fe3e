"""The searches the latency-vs-FLOPs protocol compares, as a registry: each proposes points and sees one cost.

Every search gets the same search space, seed and random start (the protocol measures the
start points once and tells every search), then proposes the rest of its budget itself.
What each search *sees* of a finished trial is its own cost only:

* ``latency`` / ``flops``: `ParetoTPE` (our multi-objective TPE) on (accuracy, cost), the
  cost being the trial's measured ``latency_ratio`` or its ``flops_ratio``; both with the
  same accuracy floor (the protocol's reference accuracy), below which a fast model is not
  modelled as good;
* ``tpe-latency`` / ``tpe-flops``: NNI's built-in TPE (`nni.algorithms.hpo.tpe_tuner`) on
  one MnasNet-style reward, ``accuracy * (ratio / target) ** -0.07``: what NNI users run today.

A failed trial (no accuracy) is told as such: NaN to ParetoTPE, a failed trial end to NNI's TPE.

Example:
    >>> space = {"s": {"_type": "choice", "_value": [0.5, 0.7, 0.9]}, "b": {"_type": "choice", "_value": [32, 8]}}
    >>> search = make_search("flops", space, seed=0)
    >>> search.guide, sorted(search.propose())
    ('flops', ['b', 's'])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sparta_explore.errors import ConfigError
from sparta_explore.explore.search.dimensions import Space
from sparta_explore.explore.search.pareto_tpe import ParetoTPE, SearchConfig
from sparta_explore.explore.trial.objectives import get_objective
from sparta_explore.quality import row_quality

RATIO = {"latency": "latency_ratio", "flops": "flops_ratio"}


def _finite(row: Mapping[str, Any], column: str) -> float:
    value = row.get(column)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value if math.isfinite(value) else math.nan


def _quality(row: Mapping[str, Any]) -> float:
    # the value searches maximize: the metric, or dense / metric for one to minimize (`sparta_explore.quality`)
    if math.isnan(_finite(row, "accuracy")):  # a failed trial
        return math.nan
    value = row_quality(row)
    return value if math.isfinite(value) else math.nan


class Search(Protocol):
    """What the protocol asks of a search: `propose()` a point, `observe(point, row)` its results row."""

    guide: str

    def propose(self) -> dict[str, Any]:
        """The next point to measure (a dict of search-space keys)."""

    def observe(self, point: Mapping[str, Any], row: Mapping[str, Any]) -> None:
        """Learn from a finished point: a shared start point or one `propose` returned."""


class ParetoSearch:
    """`ParetoTPE` told (quality, the row's `guide` ratio); its random start is the protocol's shared one."""

    def __init__(self, space: Mapping[str, Any], seed: int, startup: int, guide: str,
                 floor: float | None = None) -> None:
        self.guide = guide
        self.tpe = ParetoTPE(Space.from_nni(space), SearchConfig(startup=startup, seed=seed, value_floor=floor))

    def propose(self) -> dict[str, Any]:
        return self.tpe.ask()

    def observe(self, point: Mapping[str, Any], row: Mapping[str, Any]) -> None:
        self.tpe.tell(point, _quality(row), _finite(row, RATIO[self.guide]))


class NNITPESearch:
    """NNI's `TpeTuner`, maximizing the ``<guide>-mnas`` objective at `target`; start points are imported."""

    def __init__(self, space: Mapping[str, Any], seed: int, startup: int, guide: str, target: float) -> None:
        from nni.algorithms.hpo.tpe_tuner import TpeTuner

        self.guide, self.target = guide, target
        self.objective = get_objective(f"{guide}-mnas")
        # imported start points count as history, so TPE models from the first proposal after them
        self.tuner = TpeTuner(optimize_mode="maximize", seed=seed, tpe_args={"n_startup_jobs": startup})
        self.tuner.update_search_space(dict(space))
        self._next_id = 0
        self._pending: dict[str, int] = {}

    def _reward(self, row: Mapping[str, Any]) -> float:
        accuracy, ratio = _quality(row), _finite(row, RATIO[self.guide])
        if math.isnan(accuracy) or math.isnan(ratio) or ratio <= 0:
            return math.nan
        return float(self.objective.fn(accuracy, ratio, self.target))

    def propose(self) -> dict[str, Any]:
        pid = self._next_id
        self._next_id += 1
        point = self.tuner.generate_parameters(pid)
        self._pending[_key(point)] = pid
        return point

    def observe(self, point: Mapping[str, Any], row: Mapping[str, Any]) -> None:
        reward = self._reward(row)
        pid = self._pending.pop(_key(point), None)
        if pid is None:  # a shared start point: NNI's own way to learn from trials it did not propose
            if math.isfinite(reward):
                self.tuner.import_data([{"parameter": dict(point), "value": reward}])
            return
        if math.isfinite(reward):
            self.tuner.receive_trial_result(pid, dict(point), reward)
        else:
            self.tuner.trial_end(pid, False)


def _key(point: Mapping[str, Any]) -> str:
    return repr(sorted(point.items()))


SearchFactory = Callable[[Mapping[str, Any], int, int, float, "float | None"], Search]
SEARCHES: dict[str, SearchFactory] = {}


def register_search(name: str) -> Callable[[SearchFactory], SearchFactory]:
    """Add a search to the registry under `name` (a factory of (space, seed, startup, target, floor)).

    Example:
        >>> "tpe-flops" in SEARCHES
        True
    """
    def add(factory: SearchFactory) -> SearchFactory:
        if name in SEARCHES:
            raise ConfigError(f"search {name!r} is already registered")
        SEARCHES[name] = factory
        return factory
    return add


def make_search(name: str, space: Mapping[str, Any], *, seed: int, startup: int = 8,
                target: float = 0.25, floor: float | None = None) -> Search:
    """A fresh search `name` over `space` (an NNI search-space dict); `floor`: the least useful accuracy.

    Example:
        >>> make_search("random", {}, seed=0)
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: unknown search 'random'; registered: latency, flops, tpe-latency, tpe-flops
    """
    if name not in SEARCHES:
        raise ConfigError(f"unknown search {name!r}; registered: {', '.join(SEARCHES)}")
    return SEARCHES[name](space, seed, startup, target, floor)


def _pareto(guide: str) -> SearchFactory:
    return lambda space, seed, startup, target, floor: ParetoSearch(space, seed, startup, guide, floor)


def _nni_tpe(guide: str) -> SearchFactory:
    # NNI's TPE runs as NNI users run it: one reward, no floor (the MnasNet reward weighs accuracy itself)
    return lambda space, seed, startup, target, floor: NNITPESearch(space, seed, startup, guide, target)


for _guide in RATIO:
    register_search(_guide)(_pareto(_guide))
for _guide in RATIO:
    register_search(f"tpe-{_guide}")(_nni_tpe(_guide))
