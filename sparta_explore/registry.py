"""A named registry: items looked up by a forgiving name, the choices listed when a name is unknown.

Pruners, quantizers, zoo models, built-in workloads, objectives, plan candidate
generators and kernel builders are each a `Registry`. Lookups forgive case, "-" and "_"
and an optional class-style suffix ("L1NormPruner" finds "l1norm"); an unknown name is a
`ConfigError` that lists the choices. It is not the only table: others keep a plain dict
of their own (command-line commands, searches, activations, graph passes, and the tables
keyed by fx target or module class, such as propagation, shrink and weight-site rules).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from sparta_explore.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> items of one kind.

    Example:
        >>> r = Registry[int]("pruner", suffix="pruner")
        >>> r.add("l1norm", 1)
        >>> r.get("L1Norm_Pruner")
        1
        >>> r.get("magic")
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: unknown pruner 'magic'; choose one of l1norm
    """

    def __init__(self, kind: str, *, suffix: str = "") -> None:
        self.kind = kind
        self.suffix = suffix
        self._items: dict[str, T] = {}

    def _key(self, name: str) -> str:
        key = name.lower().replace("_", "").replace("-", "")
        return key[: -len(self.suffix)] if self.suffix and key.endswith(self.suffix) and key != self.suffix else key

    def add(self, name: str, item: T) -> None:
        """Register `item` under `name`; a name registered twice is a `ConfigError`."""
        if name in self._items:
            raise ConfigError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item

    def get(self, name: str) -> T:
        """The item registered under `name` (forgiving case, '-', '_' and the suffix)."""
        if name in self._items:
            return self._items[name]
        wanted = self._key(name)
        for registered, item in self._items.items():
            if self._key(registered) == wanted:
                return item
        raise ConfigError(f"unknown {self.kind} {name!r}; choose one of {', '.join(self._items)}")

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(self._key(n) == self._key(name) for n in self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def values(self) -> list[T]:
        return list(self._items.values())
