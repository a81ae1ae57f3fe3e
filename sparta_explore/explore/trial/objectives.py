"""Objectives: the one number a search maximizes, from a trial's quality and its cost.

The quality (`sparta_explore.quality`) is the workload's metric when higher is better (an
accuracy, so "accuracy" below), and the dense model's metric over the trial's when lower is
better (a perplexity: 1.0 at the dense model's, 0.5 at twice it), so the same trade holds.

Every objective reads one cost of a results row relative to the dense model: measured
latency (`latency_ms / dense_latency_ms`) for the latency-guided ones, effective FLOPs
(`effective_flops / dense_flops`) for the FLOPs-guided ones. The target is a fraction of
the dense cost (0.5 = "at most half the dense latency"), so the same target means the same
thing to both families, and their picks can be compared on measured latency.

Registered objectives (`objective_names()`):

* ``latency``, ``flops``: accuracy subject to a soft target,
  ``score = accuracy - max(0, ratio / target - 1)``: at or under the target the score is
  the accuracy; over it, each multiple of the target costs one whole unit of accuracy,
  so a model that misses the target loses to any feasible model of reasonable accuracy.
* ``latency-mnas``, ``flops-mnas``: MnasNet's scalarization (Tan et al., CVPR'19),
  ``score = accuracy * (ratio / target) ** -0.07``: halving the cost is worth ~5% of
  accuracy, on either side of the target.

Example:
    >>> row = {"accuracy": 0.9, "latency_ms": 4.0, "dense_latency_ms": 10.0,
    ...        "effective_flops": 6e6, "dense_flops": 1e7}
    >>> score(row, "latency", target=0.5), round(score(row, "flops", target=0.5), 3)
    (0.9, 0.7)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sparta_explore.errors import ConfigError
from sparta_explore.quality import row_quality
from sparta_explore.registry import Registry

ScoreFn = Callable[[float, float, float], float]

# MnasNet's soft exponent: reward ~ (latency / target) ** -0.07
MNAS_EXPONENT = -0.07


@dataclass(frozen=True)
class Objective:
    """One registered objective: which cost it reads and how it trades it for accuracy.

    `cost` / `baseline` are results-row columns; `guide` ("latency" or "flops") names the
    family, used to pair each objective with its Pareto front.

    Example:
        >>> get_objective("flops").cost
        'effective_flops'
    """

    name: str
    cost: str
    baseline: str
    guide: str
    fn: ScoreFn
    description: str

    def ratio(self, row: Mapping[str, Any]) -> float:
        """The row's cost as a fraction of the dense model's.

        Example:
            >>> get_objective("latency").ratio({"latency_ms": 3.0, "dense_latency_ms": 12.0})
            0.25
        """
        base = float(row[self.baseline])
        if not base > 0:
            raise ConfigError(f"objective {self.name!r}: {self.baseline} must be > 0, got {base}")
        return float(row[self.cost]) / base

    def score(self, row: Mapping[str, Any], target: float) -> float:
        """The scalar a tuner maximizes for this row (its quality, `row_quality`, traded against the cost).

        Example:
            >>> get_objective("latency").score({"accuracy": 0.75, "latency_ms": 6.0, "dense_latency_ms": 8.0}, 0.5)
            0.25
        """
        check_target(target)
        return self.fn(row_quality(row), self.ratio(row), float(target))


_OBJECTIVES: Registry[Objective] = Registry("objective")

_COSTS = {"latency": ("latency_ms", "dense_latency_ms"), "flops": ("effective_flops", "dense_flops")}


def register_objective(name: str, *, guide: str, description: str) -> Callable[[ScoreFn], ScoreFn]:
    """Decorator adding `fn(accuracy, cost_ratio, target) -> score` as objective `name`.

    `guide` is "latency" (cost = measured latency) or "flops" (cost = effective FLOPs).

    Example:
        >>> @register_objective("latency-linear", guide="latency", description="acc - ratio")  # doctest: +SKIP
        ... def _linear(accuracy, ratio, target):
        ...     return accuracy - ratio
    """
    if guide not in _COSTS:
        raise ConfigError(f"objective {name!r}: guide must be one of {sorted(_COSTS)}, got {guide!r}")
    cost, baseline = _COSTS[guide]

    def add(fn: ScoreFn) -> ScoreFn:
        _OBJECTIVES.add(name, Objective(name, cost, baseline, guide, fn, description))
        return fn
    return add


def objective_names() -> list[str]:
    """Names of the registered objectives.

    Example:
        >>> objective_names()[:4]
        ['latency', 'flops', 'latency-mnas', 'flops-mnas']
    """
    return _OBJECTIVES.names()


def get_objective(name: str) -> Objective:
    """The objective registered as `name`; an unknown name is a `ConfigError` listing the choices.

    Example:
        >>> get_objective("latency").guide
        'latency'
    """
    return _OBJECTIVES.get(name)


def check_target(target: float) -> float:
    """`target` if it is a usable cost fraction (> 0), else a `ConfigError`.

    Example:
        >>> check_target(0.5)
        0.5
    """
    if not (isinstance(target, (int, float)) and math.isfinite(target) and target > 0):
        raise ConfigError(f"target must be a positive fraction of the dense cost, got {target!r}")
    return float(target)


def score(row: Mapping[str, Any], objective: str, target: float) -> float:
    """`row` scored by objective `objective` at `target` (fraction of the dense cost).

    Example:
        >>> score({"accuracy": 0.9, "latency_ms": 5.0, "dense_latency_ms": 10.0}, "latency-mnas", 0.5)
        0.9
    """
    return get_objective(objective).score(row, target)


def _soft_target(accuracy: float, ratio: float, target: float) -> float:
    # linear in the overshoot so a tuner still sees which infeasible trial is closer
    return accuracy - max(0.0, ratio / target - 1.0)


def _mnas(accuracy: float, ratio: float, target: float) -> float:
    return accuracy * (ratio / target) ** MNAS_EXPONENT if ratio > 0 else accuracy


for _guide in ("latency", "flops"):
    register_objective(_guide, guide=_guide,
                       description=f"accuracy - max(0, {_guide} ratio / target - 1)")(_soft_target)
for _guide in ("latency", "flops"):
    register_objective(f"{_guide}-mnas", guide=_guide,
                       description=f"accuracy * ({_guide} ratio / target) ** {MNAS_EXPONENT}")(_mnas)
