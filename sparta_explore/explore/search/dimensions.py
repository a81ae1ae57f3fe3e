"""NNI search spaces as objects a search can sample, model and check: one `Dimension` per key.

Understands NNI's flat search-space types: ``choice``, ``randint``, ``uniform``,
``quniform``, ``loguniform``, ``qloguniform``. Nested choices (values that are dicts with
``_name``) are refused with a `ConfigError`: this project's spaces are flat, and a search
that silently ignored a nesting would propose parameters the trial cannot read.

Example:
    >>> space = Space.from_nni({"bits": {"_type": "choice", "_value": [32, 8, 4]},
    ...                         "lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]}})
    >>> rng = random.Random(0)
    >>> p = space.sample(rng)
    >>> space.contains(p), sorted(p)
    (True, ['bits', 'lr'])
"""

from __future__ import annotations

import json
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sparta_explore.errors import ConfigError


@dataclass(frozen=True)
class Dimension(ABC):
    """One key of a search space: what values NNI can hand a trial for it, and how to draw or map them.

    One subclass per family of NNI types (`Choice`, `RandInt`, `Continuous`), built by
    `dimension` from the table `KINDS`; a search asks `categorical` and never the type name.

    Example:
        >>> d = dimension("bits", "choice", (32, 8, 4))
        >>> d.contains(8), d.contains(16), d.size
        (True, False, 3)
    """

    key: str
    kind: str
    categorical: bool = False  # one of a list of values (choice, or randint as its integers)

    @property
    def size(self) -> float:
        """How many distinct values the key can take (inf for continuous ones)."""
        return math.inf

    @abstractmethod
    def contains(self, value: Any) -> bool:
        """Whether `value` is a value NNI could hand a trial for this key."""

    @abstractmethod
    def sample(self, rng: random.Random) -> Any:
        """A random value, distributed as NNI's random tuner would draw it."""

    @property
    def values(self) -> tuple[Any, ...]:
        """The values of a categorical key, in order (a `ConfigError` for continuous ones)."""
        raise ConfigError(f"search space key {self.key!r} is continuous ({self.kind}); it has no value list")

    def index(self, value: Any) -> int:
        """Position of `value` in `values` (a `ConfigError` if the key cannot take it).

        Example:
            >>> dimension("b", "choice", ("32x32", "1x32")).index("1x32")
            1
        """
        for i, v in enumerate(self.values):
            if _same(value, v):
                return i
        raise ConfigError(f"search space key {self.key!r} has no value {value!r}")

    def to_unit(self, value: float) -> float:
        """A continuous value mapped to [0, 1] (a `ConfigError` for categorical keys)."""
        raise ConfigError(f"search space key {self.key!r} is categorical ({self.kind}): it has no unit scale")

    def from_unit(self, u: float) -> float:
        """The inverse of `to_unit` (a `ConfigError` for categorical keys)."""
        raise ConfigError(f"search space key {self.key!r} is categorical ({self.kind}): it has no unit scale")


@dataclass(frozen=True)
class Choice(Dimension):
    """NNI ``choice``: one of a list of values (never nested).

    Example:
        >>> Choice("bits", "choice", True, (32, 8)).sample(random.Random(0)) in (32, 8)
        True
    """

    options: tuple[Any, ...] = ()

    @property
    def size(self) -> float:
        return len(self.options)

    @property
    def values(self) -> tuple[Any, ...]:
        return self.options

    def contains(self, value: Any) -> bool:
        return any(_same(value, v) for v in self.options)

    def sample(self, rng: random.Random) -> Any:
        return self.options[rng.randrange(len(self.options))]


@dataclass(frozen=True)
class RandInt(Dimension):
    """NNI ``randint``: an integer in [low, high).

    Example:
        >>> RandInt("n", "randint", True, 2, 5).values
        (2, 3, 4)
    """

    low: int = 0
    high: int = 1

    @property
    def size(self) -> float:
        return self.high - self.low

    @property
    def values(self) -> tuple[Any, ...]:
        return tuple(range(self.low, self.high))

    def contains(self, value: Any) -> bool:
        return _number(value) and float(value).is_integer() and self.low <= value < self.high

    def sample(self, rng: random.Random) -> Any:
        return rng.randrange(self.low, self.high)


@dataclass(frozen=True)
class Continuous(Dimension):
    """NNI ``uniform`` / ``loguniform`` and their quantized ``q`` forms: a number in [low, high].

    Example:
        >>> lr = dimension("lr", "loguniform", (1e-4, 1e-2))
        >>> round(lr.to_unit(1e-3), 6), dimension("s", "quniform", (0.0, 1.0, 0.25)).from_unit(0.3)
        (0.5, 0.25)
    """

    low: float = 0.0
    high: float = 1.0
    log: bool = False
    step: float | None = None  # the q of the q-types: values are rounded to multiples of it

    def contains(self, value: Any) -> bool:
        return _number(value) and self.low - 1e-12 <= value <= self.high + 1e-12

    def sample(self, rng: random.Random) -> Any:
        return self.from_unit(rng.random())

    def to_unit(self, value: float) -> float:
        if self.log:
            return (math.log(value) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        return (value - self.low) / (self.high - self.low)

    def from_unit(self, u: float) -> float:
        u = min(max(u, 0.0), 1.0)
        if self.log:
            value = math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        else:
            value = self.low + u * (self.high - self.low)
        if self.step is None:
            return value
        return min(max(round(value / self.step) * self.step, self.low), self.high)


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _choice(key: str, kind: str, spec: tuple[Any, ...]) -> Dimension:
    if not spec:
        raise ConfigError(f"search space key {key!r}: choice needs at least one value")
    if any(isinstance(v, Mapping) for v in spec):
        raise ConfigError(f"search space key {key!r}: nested choices are not supported")
    return Choice(key, kind, True, tuple(spec))


def _bounds(key: str, kind: str, spec: tuple[Any, ...], need: int, log: bool = False) -> tuple[float, ...]:
    if len(spec) != need or not all(_number(v) for v in spec):
        raise ConfigError(f"search space key {key!r}: {kind} needs {need} numbers, got {list(spec)}")
    if not spec[0] < spec[1] or (log and spec[0] <= 0):
        raise ConfigError(f"search space key {key!r}: bad bounds {spec[0]}, {spec[1]} for {kind}")
    return tuple(spec)


def _randint(key: str, kind: str, spec: tuple[Any, ...]) -> Dimension:
    low, high = _bounds(key, kind, spec, 2)
    return RandInt(key, kind, True, int(low), int(high))


def _continuous(log: bool, quantized: bool) -> Callable[[str, str, tuple[Any, ...]], Dimension]:
    def build(key: str, kind: str, spec: tuple[Any, ...]) -> Dimension:
        values = _bounds(key, kind, spec, 3 if quantized else 2, log)
        return Continuous(key, kind, False, float(values[0]), float(values[1]), log,
                          float(values[2]) if quantized else None)
    return build


# NNI's flat search-space types: each builds its Dimension, checking its "_value"
KINDS: dict[str, Callable[[str, str, tuple[Any, ...]], Dimension]] = {
    "choice": _choice,
    "randint": _randint,
    "uniform": _continuous(log=False, quantized=False),
    "quniform": _continuous(log=False, quantized=True),
    "loguniform": _continuous(log=True, quantized=False),
    "qloguniform": _continuous(log=True, quantized=True),
}


def dimension(key: str, kind: str, spec: tuple[Any, ...] | list[Any]) -> Dimension:
    """The Dimension of one search-space key from its NNI ``_type`` and ``_value``, checked.

    Example:
        >>> dimension("n", "randint", (2, 6)).size, dimension("x", "uniform", (0, 1)).categorical
        (4, False)
        >>> dimension("x", "normal", (0, 1))
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: search space key 'x': type 'normal' is not supported ...
    """
    if kind not in KINDS:
        raise ConfigError(f"search space key {key!r}: type {kind!r} is not supported (use one of {', '.join(KINDS)})")
    return KINDS[kind](key, kind, tuple(spec))


def _same(a: Any, b: Any) -> bool:
    # JSON round trips turn 8 into 8.0 and tuples into lists; both still name one choice
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return not isinstance(b, bool) and float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@dataclass(frozen=True)
class Space:
    """A flat search space: its dimensions, in the order NNI listed them.

    Example:
        >>> Space.from_nni({"x": {"_type": "choice", "_value": [1, 2]}}).size
        2
    """

    dims: tuple[Dimension, ...]

    @classmethod
    def from_nni(cls, space: Mapping[str, Any]) -> Space:
        """Parse an NNI search-space dict (what `update_search_space` receives).

        Example:
            >>> Space.from_nni({"x": {"_type": "normal", "_value": [0, 1]}})
            Traceback (most recent call last):
            ...
            sparta_explore.errors.ConfigError: search space key 'x': type 'normal' is not supported ...
        """
        if not isinstance(space, Mapping) or not space:
            raise ConfigError(f"a search space is a non-empty dict of keys, got {space!r}")
        dims = []
        for key, entry in space.items():
            if not isinstance(entry, Mapping) or "_type" not in entry or "_value" not in entry:
                raise ConfigError(f"search space key {key!r} needs '_type' and '_value', got {entry!r}")
            dims.append(dimension(str(key), str(entry["_type"]), tuple(entry["_value"])))
        return cls(tuple(dims))

    @property
    def keys(self) -> tuple[str, ...]:
        """The parameter names.

        Example:
            >>> Space.from_nni({"a": {"_type": "choice", "_value": [1]}}).keys
            ('a',)
        """
        return tuple(d.key for d in self.dims)

    @property
    def size(self) -> float:
        """Number of distinct points (inf if any key is continuous).

        Example:
            >>> Space.from_nni({"a": {"_type": "choice", "_value": [1, 2]},
            ...                 "b": {"_type": "randint", "_value": [0, 3]}}).size
            6
        """
        return math.prod(d.size for d in self.dims)

    def sample(self, rng: random.Random) -> dict[str, Any]:
        """One random point.

        Example:
            >>> Space.from_nni({"a": {"_type": "choice", "_value": [7]}}).sample(random.Random(1))
            {'a': 7}
        """
        return {d.key: d.sample(rng) for d in self.dims}

    def contains(self, params: Mapping[str, Any]) -> bool:
        """Whether `params` has exactly this space's keys, each with a value the space allows.

        Example:
            >>> s = Space.from_nni({"a": {"_type": "choice", "_value": [1, 2]}})
            >>> s.contains({"a": 2}), s.contains({"a": 3}), s.contains({"a": 1, "b": 0})
            (True, False, False)
        """
        return set(params) == set(self.keys) and all(d.contains(params[d.key]) for d in self.dims)

    def project(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params` restricted to this space's keys (an echo may carry more), in the space's order.

        Example:
            >>> Space.from_nni({"a": {"_type": "choice", "_value": [1]}}).project({"a": 1, "model": "m"})
            {'a': 1}
        """
        missing = [k for k in self.keys if k not in params]
        if missing:
            raise ConfigError(f"parameters lack search space key(s) {', '.join(missing)}: {dict(params)!r}")
        return {k: params[k] for k in self.keys}

    def key_of(self, params: Mapping[str, Any]) -> str:
        """A canonical text for a point: equal for points NNI would treat as one (8 == 8.0).

        Example:
            >>> s = Space.from_nni({"b": {"_type": "choice", "_value": [8, 32]}})
            >>> s.key_of({"b": 8}) == s.key_of({"b": 8.0})
            True
        """
        return json.dumps({k: _canonical(v) for k, v in self.project(params).items()}, sort_keys=True)


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float, list, tuple)):
        return value
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return float(value)
