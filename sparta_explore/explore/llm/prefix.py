"""Calibration shared between LLM trials by prefix: what blocks 0 .. e-1 computed is kept for the next trial whose
choices for those blocks are the same.

A trial's calibration walks the decoder blocks in order, and what block e receives depends only
on how blocks before it were compressed (and on the model and calibration windows). So after each
depth band, `compress_llm` keeps, under a key naming exactly that (`prefix_key`):

* the hidden states the next block receives, per calibration window;
* the band's compressed weights and their `OBSResult`s.

The next trial looks for the longest run of bands it shares with a kept one and starts its walk
there: a trial that differs only in its last band compresses one band; one that differs only in
its activation or head bits compresses nothing. What it finds is exactly what it would have
computed (the same arithmetic on the same inputs), so results do not depend on the cache.

`CalibrationCache` is in memory, least recently used entries dropped past `max_bytes`; a
search (`llm_search`) holds one for all its trials, and a caller running several searches
passes one to all of them. Given a `PrefixStore` (`prefix_store.py`) it also writes its entries
to a folder and reads misses from there: separate processes (NNI trials) share them so.

Example:
    >>> cache = CalibrationCache(max_bytes=2 << 30)
    >>> compress_llm(model, point, calib, cache=cache)   # doctest: +SKIP
    >>> cache.stats()["blocks_reused"]                      # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.explore.llm.space import Choice
from sparta_explore.oneshot import OBSResult

SAMPLE_STRIDE = 4099  # every this-many-th value of each tensor goes into the model's fingerprint


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of a model's tensors (shapes and a strided sample of values): which model a prefix belongs to.

    Example:
        >>> model_fingerprint(nn.Linear(2, 2)) == model_fingerprint(nn.Linear(2, 2))   # random weights differ
        False
    """
    h = hashlib.sha1()
    for name, t in model.state_dict().items():
        flat = t.detach().reshape(-1)[::SAMPLE_STRIDE].float().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:".encode())
        h.update(flat.numpy().tobytes())
    return h.hexdigest()[:16]


def _effective(choice: Choice, compressor: str) -> tuple:
    # what changes the weights: no group without bits, no compressor without sparsity
    return (choice.sparsity, choice.bits, choice.group if choice.bits < 32 else 0,
            compressor if choice.sparsity > 0 else "-")


def prefix_key(assignment: Mapping[str, Choice], compressor: str, end: int, *, model: str, calibration: str,
               options: Sequence[object]) -> str:
    """The key of blocks 0 .. `end` - 1 compressed as `assignment` says (linear name -> `Choice`), on the model and
    calibration windows with fingerprints `model` / `calibration`, with the compressors' `options`.

    Example:
        >>> a = {"model.layers.0.mlp.up_proj": Choice(bits=4, group=32)}
        >>> prefix_key(a, "wanda", 1, model="m", calibration="c", options=(True,)) == \\
        ...     prefix_key(a, "sparsegpt", 1, model="m", calibration="c", options=(True,))  # no sparsity: same
        True
    """
    own = sorted((name, _effective(c, compressor)) for name, c in assignment.items()
                 if int(name.split(".")[2]) < end)
    text = json.dumps([model, calibration, list(map(str, options)), end, own])
    return hashlib.sha1(text.encode()).hexdigest()


def tensor_fingerprint(t: torch.Tensor) -> str:
    """A short hash of a tensor's bytes and shape (the calibration windows).

    Example:
        >>> tensor_fingerprint(torch.arange(4)) == tensor_fingerprint(torch.arange(4))
        True
    """
    return hashlib.sha1(str(tuple(t.shape)).encode() + t.contiguous().numpy().tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class PrefixEntry:
    """What a band's walk left: the next block's hidden inputs per window (None after the last block), the band's
    compressed weights (clones, never the model's) and their results."""

    hidden: tuple[torch.Tensor, ...] | None
    weights: Mapping[str, torch.Tensor]
    results: Mapping[str, OBSResult]

    @property
    def nbytes(self) -> int:
        """Bytes the entry holds (hidden states, weights and masks)."""
        tensors = [*(self.hidden or ()), *self.weights.values(), *(r.keep for r in self.results.values())]
        return sum(t.numel() * t.element_size() for t in tensors)

    @classmethod
    def of(cls, hidden: Sequence[torch.Tensor] | None, results: Mapping[str, OBSResult]) -> PrefixEntry:
        """An entry from a walk's outputs, its weights cloned (the model's own may change later).

        Example:
            >>> PrefixEntry.of(None, {}).nbytes
            0
        """
        weights = {name: r.weight.detach().clone() for name, r in results.items()}
        return cls(None if hidden is None else tuple(hidden), weights,
                   {name: replace(r, weight=weights[name]) for name, r in results.items()})


class EntryStore(Protocol):
    """Where a cache's entries also go and misses are looked up (`prefix_store.PrefixStore`: files)."""

    def load(self, key: str) -> PrefixEntry | None:
        """The entry kept under `key`, or None."""

    def save(self, key: str, entry: PrefixEntry) -> object:
        """Keep `entry` under `key`."""


class CalibrationCache:
    """Prefix entries by key, least recently used dropped beyond `max_bytes`; counts what it saved. With a
    `store`, entries are written to it too and misses read from it.

    Example:
        >>> cache = CalibrationCache(max_bytes=1 << 20); cache.get("x") is None
        True
    """

    def __init__(self, max_bytes: int = 3 << 30, store: EntryStore | None = None) -> None:
        if max_bytes < 0:
            raise ConfigError(f"CalibrationCache: max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes, self.store = int(max_bytes), store
        self.entries_read = 0  # misses in memory found in the store
        self._entries: OrderedDict[str, PrefixEntry] = OrderedDict()
        self._bytes = 0
        self.blocks_reused = 0
        self.blocks_walked = 0

    def get(self, key: str) -> PrefixEntry | None:
        """The entry of `key` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        elif self.store is not None:
            entry = self.store.load(key)
            if entry is not None:
                self.entries_read += 1
                self._keep(key, entry)
        return entry

    def put(self, key: str, entry: PrefixEntry) -> None:
        """Keep `entry` under `key` (and in the store), dropping the least recently used entries past
        `max_bytes`."""
        if self.store is not None:
            self.store.save(key, entry)
        self._keep(key, entry)

    def _keep(self, key: str, entry: PrefixEntry) -> None:
        if key in self._entries:
            self._bytes -= self._entries.pop(key).nbytes
        if entry.nbytes > self.max_bytes:
            return
        self._entries[key] = entry
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.nbytes

    def stats(self) -> dict[str, int]:
        """Entries, bytes held, and blocks reused from entries / walked by trials so far.

        Example:
            >>> CalibrationCache().stats()["entries"]
            0
        """
        return {"entries": len(self._entries), "bytes": self._bytes, "blocks_reused": self.blocks_reused,
                "blocks_walked": self.blocks_walked, "entries_read": self.entries_read}
