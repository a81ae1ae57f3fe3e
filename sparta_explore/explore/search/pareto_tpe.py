"""A Pareto-aware TPE search over a flat search space: ask for a point, tell its two results.

Every finished point carries a value to maximize (accuracy) and a cost to minimize
(measured latency over dense latency, from the same trial). The search is multi-objective
TPE (Ozaki et al., GECCO'20): the finished points are split into a *good* share `gamma`
(by non-dominated rank, then by crowding distance within the last rank admitted, so the
good set spreads along the accuracy/latency front) and the rest; each key gets two
densities, l(x) over the good points and g(x) over the rest (counts plus a uniform prior
for categorical keys, a Parzen window for continuous ones); `candidates` points are drawn
from l and the one with the largest l(x)/g(x) is proposed. The first `startup` points are
random. Keys are modelled independently, which fits per-layer knobs whose effects add up.

Why TPE and not a genetic algorithm: with the tens of trials a 2-core machine affords,
an NSGA-II-style search (tried first) did no better than random sampling on a synthetic
per-layer trade-off like the one in `tests/explore/test_nni_tuner.py`, while this beats
random there on the front's hypervolume and, clearly, on the best accuracy under a
latency bound.

Points are never proposed twice (pending ones included), so concurrent trials never
duplicate work; a finite space that is used up raises `SpaceExhausted`.

Example:
    >>> space = Space.from_nni({"s": {"_type": "choice", "_value": [0.5, 0.7, 0.9]},
    ...                         "b": {"_type": "choice", "_value": [32, 8]}})
    >>> search = ParetoTPE(space, SearchConfig(startup=2, seed=0))
    >>> p = search.ask()
    >>> search.tell(p, value=0.9, cost=1.0 - p["s"] / 2)
    >>> len(search.finished), space.contains(search.ask())
    (1, True)
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparta_explore.errors import ConfigError, SpartaError
from sparta_explore.explore.search.dimensions import Dimension, Space

RANDOM_TRIES = 256  # random draws before listing what is left of a nearly used-up finite space


class SpaceExhausted(SpartaError):
    """Every point of a finite search space has been proposed."""


@dataclass(frozen=True)
class SearchConfig:
    """Knobs of `ParetoTPE`; NNI classArgs map onto them.

    `startup`: random points before the model is used; `gamma`: share of finished points
    in the good set; `candidates`: draws from l(x) per proposal; `prior_weight`: pseudo
    count of the uniform prior in every density; `seed`: None = random; `value_floor`:
    points whose value is below it (e.g. a model at chance accuracy) never join the good
    set, though on cost alone they sit on the front (None = no floor).

    Example:
        >>> SearchConfig(gamma=1.5)
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: gamma must be in (0, 1), got 1.5
    """

    startup: int = 6
    gamma: float = 0.3
    candidates: int = 24
    prior_weight: float = 1.0
    seed: int | None = 0
    value_floor: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.startup, int) or self.startup < 1:
            raise ConfigError(f"startup must be an integer >= 1, got {self.startup}")
        if not 0.0 < self.gamma < 1.0:
            raise ConfigError(f"gamma must be in (0, 1), got {self.gamma}")
        if not isinstance(self.candidates, int) or self.candidates < 1:
            raise ConfigError(f"candidates must be an integer >= 1, got {self.candidates}")
        if not self.prior_weight > 0:
            raise ConfigError(f"prior_weight must be > 0, got {self.prior_weight}")


@dataclass(frozen=True)
class Evaluated:
    """One finished point: its parameters and the two numbers the search ranks it by.

    Example:
        >>> Evaluated({"s": 0.5}, value=0.9, cost=float("nan")).usable
        False
    """

    params: dict[str, Any]
    value: float
    cost: float

    @property
    def usable(self) -> bool:
        """Both numbers are finite (a failed or malformed result is kept out of the model)."""
        return math.isfinite(self.value) and math.isfinite(self.cost)


def dominates(a: Evaluated, b: Evaluated) -> bool:
    """Whether `a` is at least as good as `b` on both counts and better on one (max value, min cost).

    Example:
        >>> dominates(Evaluated({}, 0.9, 0.4), Evaluated({}, 0.9, 0.5)), dominates(Evaluated({}, 0.9, 0.4),
        ...                                                                        Evaluated({}, 0.95, 0.8))
        (True, False)
    """
    return a.value >= b.value and a.cost <= b.cost and (a.value > b.value or a.cost < b.cost)


def front_ranks(points: Sequence[Evaluated]) -> list[int]:
    """Non-dominated sorting: rank 0 is the front, rank 1 the front once rank 0 is removed, ...

    Example:
        >>> front_ranks([Evaluated({}, 0.9, 1.0), Evaluated({}, 0.8, 0.5), Evaluated({}, 0.7, 0.9)])
        [0, 0, 1]
    """
    ranks = [-1] * len(points)
    left = set(range(len(points)))
    rank = 0
    while left:
        front = {i for i in left if not any(dominates(points[j], points[i]) for j in left if j != i)}
        for i in front:
            ranks[i] = rank
        left -= front
        rank += 1
    return ranks


def crowding(points: Sequence[Evaluated]) -> list[float]:
    """NSGA-II crowding distance within one front: large = few neighbours; the two ends are infinite.

    Example:
        >>> crowding([Evaluated({}, 0.5, 0.1), Evaluated({}, 0.7, 0.5), Evaluated({}, 0.9, 0.9)])
        [inf, 2.0, inf]
    """
    n = len(points)
    if n <= 2:
        return [math.inf] * n
    out = [0.0] * n
    for attr in ("value", "cost"):
        order = sorted(range(n), key=lambda i: getattr(points[i], attr))
        lo, hi = getattr(points[order[0]], attr), getattr(points[order[-1]], attr)
        out[order[0]] = out[order[-1]] = math.inf
        if hi == lo:
            continue
        for k in range(1, n - 1):
            out[order[k]] += (getattr(points[order[k + 1]], attr) - getattr(points[order[k - 1]], attr)) / (hi - lo)
    return out


def split_good(points: Sequence[Evaluated], gamma: float,
               floor: float | None = None) -> tuple[list[Evaluated], list[Evaluated]]:
    """(good, rest): the best ceil(gamma * n) points by front rank, then crowding within a rank.

    Points valued below `floor` come after every point above it, best value first: a fast
    model at chance accuracy is non-dominated, yet modelling its settings as "good" spends
    the budget on more useless models (31-44% of a latency-guided search's proposals did,
    before the floor).

    Example:
        >>> pts = [Evaluated({"i": i}, v, c) for i, (v, c) in enumerate([(0.9, 1.0), (0.5, 0.5), (0.4, 0.9)])]
        >>> [[p.params["i"] for p in part] for part in split_good(pts, 0.5)]
        [[0, 1], [2]]
        >>> fast_but_useless = [Evaluated({"i": i}, v, c) for i, (v, c) in enumerate([(0.9, 1.0), (0.1, 0.2),
        ...                                                                               (0.8, 0.9)])]
        >>> [[p.params["i"] for p in part] for part in split_good(fast_but_useless, 0.5)]
        [[0, 1], [2]]
        >>> [[p.params["i"] for p in part] for part in split_good(fast_but_useless, 0.5, floor=0.5)]
        [[0, 2], [1]]
    """
    useful = [i for i, p in enumerate(points) if floor is None or p.value >= floor]
    ranks = dict(zip(useful, front_ranks([points[i] for i in useful])))
    order: list[int] = []
    for rank in sorted(set(ranks.values())):
        members = [i for i in useful if ranks[i] == rank]
        spread = dict(zip(members, crowding([points[i] for i in members])))
        order += sorted(members, key=lambda i: -spread[i])
    order += sorted((i for i in range(len(points)) if i not in ranks), key=lambda i: -points[i].value)
    n_good = max(1, math.ceil(gamma * len(points)))
    good = set(order[:n_good])
    return [points[i] for i in sorted(good)], [p for i, p in enumerate(points) if i not in good]


class _Density:
    """l(x) or g(x) of one key over some points: categorical counts or a Parzen window on [0, 1]."""

    def __init__(self, dim: Dimension, values: Sequence[Any], prior: float) -> None:
        self.dim = dim
        if dim.categorical:
            counts = [prior / len(dim.values)] * len(dim.values)
            for v in values:
                counts[dim.index(v)] += 1.0
            total = sum(counts)
            self.probs = [c / total for c in counts]
        else:
            self.centres = [dim.to_unit(float(v)) for v in values]
            self.prior = prior
            # Scott-like bandwidth that narrows as points accumulate, never below 5% of the range
            self.width = max(0.05, 1.0 / (len(values) + 1))

    def sample(self, rng: random.Random) -> Any:
        if self.dim.categorical:
            return self.dim.values[rng.choices(range(len(self.probs)), weights=self.probs)[0]]
        n = len(self.centres)
        if rng.random() < self.prior / (n + self.prior):
            return self.dim.from_unit(rng.random())
        return self.dim.from_unit(rng.gauss(self.centres[rng.randrange(n)], self.width))

    def log_pdf(self, value: Any) -> float:
        if self.dim.categorical:
            return math.log(self.probs[self.dim.index(value)])
        u = self.dim.to_unit(float(value))
        n = len(self.centres)
        norm = 1.0 / (self.width * math.sqrt(2 * math.pi))
        mass = self.prior + sum(norm * math.exp(-0.5 * ((u - c) / self.width) ** 2) for c in self.centres)
        return math.log(mass / (n + self.prior))


class ParetoTPE:
    """The search itself: `ask()` for parameters, `tell(params, value, cost)` when they finish.

    Example:
        >>> space = Space.from_nni({"s": {"_type": "choice", "_value": [0.5, 0.9]}})
        >>> search = ParetoTPE(space, SearchConfig(startup=1))
        >>> sorted(search.ask()["s"] for _ in range(2))
        [0.5, 0.9]
        >>> search.ask()
        Traceback (most recent call last):
        ...
        sparta_explore.explore.search.pareto_tpe.SpaceExhausted: all 2 points of the search space were proposed
    """

    def __init__(self, space: Space, config: SearchConfig | None = None) -> None:
        self.space = space
        self.config = config or SearchConfig()
        self.rng = random.Random(self.config.seed)
        self.finished: list[Evaluated] = []
        self._seen: set[str] = set()

    def ask(self) -> dict[str, Any]:
        """New parameters: random for the first `startup` points, from the TPE model after.

        Example:
            >>> s = ParetoTPE(Space.from_nni({"a": {"_type": "randint", "_value": [0, 100]}}))
            >>> 0 <= s.ask()["a"] < 100
            True
        """
        if len(self._seen) >= self.space.size:
            raise SpaceExhausted(f"all {len(self._seen)} points of the search space were proposed")
        pool = [p for p in self.finished if p.usable]
        point = self._suggest(pool) if len(pool) >= self.config.startup else None
        if point is None:
            point = self._random_unseen()
        self._seen.add(self.space.key_of(point))
        return point

    def tell(self, params: Mapping[str, Any], value: float, cost: float) -> None:
        """Record a finished point (parameters as the trial ran them); NaN marks a failed trial.

        Example:
            >>> s = ParetoTPE(Space.from_nni({"a": {"_type": "choice", "_value": [1, 2]}}))
            >>> s.tell({"a": 3}, 0.5, 0.5)
            Traceback (most recent call last):
            ...
            sparta_explore.errors.ConfigError: parameters {'a': 3} are outside the search space
        """
        point = self.space.project(params)
        if not self.space.contains(point):
            raise ConfigError(f"parameters {point!r} are outside the search space")
        self._seen.add(self.space.key_of(point))
        self.finished.append(Evaluated(point, float(value), float(cost)))

    def front(self) -> list[Evaluated]:
        """The finished points no other finished point dominates, by ascending cost.

        Example:
            >>> s = ParetoTPE(Space.from_nni({"a": {"_type": "choice", "_value": [1, 2, 3]}}))
            >>> for a, v, c in [(1, 0.9, 1.0), (2, 0.8, 1.2), (3, 0.5, 0.2)]:
            ...     s.tell({"a": a}, v, c)
            >>> [p.params["a"] for p in s.front()]
            [3, 1]
        """
        pool = [p for p in self.finished if p.usable]
        return sorted((p for p, r in zip(pool, front_ranks(pool)) if r == 0), key=lambda p: (p.cost, -p.value))

    def _suggest(self, pool: list[Evaluated]) -> dict[str, Any] | None:
        good, rest = split_good(pool, self.config.gamma, self.config.value_floor)
        prior = self.config.prior_weight
        # per key: l(x) over the good points, g(x) over the rest
        models = [(dim, _Density(dim, [p.params[dim.key] for p in good], prior),
                   _Density(dim, [p.params[dim.key] for p in rest], prior)) for dim in self.space.dims]
        best, best_score = None, -math.inf
        for _ in range(self.config.candidates):
            point = {dim.key: lx.sample(self.rng) for dim, lx, _ in models}
            if self.space.key_of(point) in self._seen:
                continue
            score = sum(lx.log_pdf(point[dim.key]) - gx.log_pdf(point[dim.key]) for dim, lx, gx in models)
            if score > best_score:
                best, best_score = point, score
        return best

    def _random_unseen(self) -> dict[str, Any]:
        for _ in range(RANDOM_TRIES):
            point = self.space.sample(self.rng)
            if self.space.key_of(point) not in self._seen:
                return point
        if math.isfinite(self.space.size):
            # a nearly used-up finite space: list what is left rather than keep guessing
            return self.rng.choice(self._unseen_points())
        return point  # a continuous space practically never repeats; accept the rare duplicate

    def _unseen_points(self) -> list[dict[str, Any]]:
        points: list[dict[str, Any]] = [{}]
        for dim in self.space.dims:
            points = [{**p, dim.key: v} for p in points for v in dim.values]
        return [p for p in points if self.space.key_of(p) not in self._seen]
