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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparta_explore.errors import ConfigError


@dataclass(frozen=True)
class Dimension:
    """One key of a search space: its NNI type and the values or bounds NNI gives it.

    Example:
        >>> d = Dimension("bits", "choice", (32, 8, 4))
        >>> d.contains(8), d.contains(16), d.size
        (True, False, 3)
    """

    key: str
    kind: str
    spec: tuple[Any, ...]

    def __post_init__(self) -> None:
        kinds = ("choice", "randint", "uniform", "quniform", "loguniform", "qloguniform")
        if self.kind not in kinds:
            raise ConfigError(f"search space key {self.key!r}: type {self.kind!r} is not supported "
                              f"(use one of {', '.join(kinds)})")
        if self.kind == "choice":
            if not self.spec:
                raise ConfigError(f"search space key {self.key!r}: choice needs at least one value")
            if any(isinstance(v, Mapping) for v in self.spec):
                raise ConfigError(f"search space key {self.key!r}: nested choices are not supported")
            return
        need = 3 if self.kind.startswith("q") else 2
        if len(self.spec) != need or not all(isinstance(v, (int, float)) for v in self.spec):
            raise ConfigError(f"search space key {self.key!r}: {self.kind} needs {need} numbers, got {list(self.spec)}")
        low, high = self.spec[0], self.spec[1]
        if not low < high or (self.kind.endswith("loguniform") and low <= 0):
            raise ConfigError(f"search space key {self.key!r}: bad bounds {low}, {high} for {self.kind}")

    @property
    def size(self) -> float:
        """How many distinct values the key can take (inf for continuous ones).

        Example:
            >>> Dimension("n", "randint", (2, 6)).size
            4
        """
        if self.kind == "choice":
            return len(self.spec)
        if self.kind == "randint":
            return int(self.spec[1]) - int(self.spec[0])
        return math.inf

    def contains(self, value: Any) -> bool:
        """Whether `value` is a value NNI could hand a trial for this key.

        Example:
            >>> Dimension("s", "quniform", (0.5, 0.9, 0.1)).contains(0.7)
            True
        """
        if self.kind == "choice":
            return any(_same(value, v) for v in self.spec)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        low, high = self.spec[0], self.spec[1]
        if self.kind == "randint":
            return float(value).is_integer() and low <= value < high
        return low - 1e-12 <= value <= high + 1e-12

    def sample(self, rng: random.Random) -> Any:
        """A random value, distributed as NNI's random tuner would draw it.

        Example:
            >>> Dimension("n", "randint", (2, 3)).sample(random.Random(0))
            2
        """
        if self.kind == "choice":
            return self.spec[rng.randrange(len(self.spec))]
        if self.kind == "randint":
            return rng.randrange(int(self.spec[0]), int(self.spec[1]))
        low, high = float(self.spec[0]), float(self.spec[1])
        if self.kind.endswith("loguniform"):
            value = math.exp(rng.uniform(math.log(low), math.log(high)))
        else:
            value = rng.uniform(low, high)
        return self._quantize(value)

    @property
    def categorical(self) -> bool:
        """Whether the key takes one of a list of values (choice, or randint as its integers).

        Example:
            >>> Dimension("n", "randint", (0, 4)).categorical, Dimension("x", "uniform", (0, 1)).categorical
            (True, False)
        """
        return self.kind in ("choice", "randint")

    @property
    def values(self) -> tuple[Any, ...]:
        """The values of a categorical key, in order (a `ConfigError` for continuous ones).

        Example:
            >>> Dimension("n", "randint", (2, 5)).values
            (2, 3, 4)
        """
        if self.kind == "choice":
            return self.spec
        if self.kind == "randint":
            return tuple(range(int(self.spec[0]), int(self.spec[1])))
        raise ConfigError(f"search space key {self.key!r} is continuous ({self.kind}); it has no value list")

    def index(self, value: Any) -> int:
        """Position of `value` in `values` (a `ConfigError` if the key cannot take it).

        Example:
            >>> Dimension("b", "choice", ("32x32", "1x32")).index("1x32")
            1
        """
        for i, v in enumerate(self.values):
            if _same(value, v):
                return i
        raise ConfigError(f"search space key {self.key!r} has no value {value!r}")

    def to_unit(self, value: float) -> float:
        """A continuous value mapped to [0, 1] (log scale for log-uniform keys).

        Example:
            >>> round(Dimension("lr", "loguniform", (1e-4, 1e-2)).to_unit(1e-3), 6)
            0.5
        """
        low, high = float(self.spec[0]), float(self.spec[1])
        if self.kind.endswith("loguniform"):
            return (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
        return (value - low) / (high - low)

    def from_unit(self, u: float) -> float:
        """The inverse of `to_unit`, clipped to the bounds and quantized for q-types.

        Example:
            >>> Dimension("s", "quniform", (0.0, 1.0, 0.25)).from_unit(0.3)
            0.25
        """
        low, high = float(self.spec[0]), float(self.spec[1])
        u = min(max(u, 0.0), 1.0)
        if self.kind.endswith("loguniform"):
            value = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
        else:
            value = low + u * (high - low)
        return self._quantize(value)

    def _quantize(self, value: float) -> float:
        if not self.kind.startswith("q"):
            return value
        low, high, q = (float(v) for v in self.spec)
        return min(max(round(value / q) * q, low), high)


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
            dims.append(Dimension(str(key), str(entry["_type"]), tuple(entry["_value"])))
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
