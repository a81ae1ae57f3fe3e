"""Calibration prefixes on disk: what one process's trials computed, read back by another's (NNI trials).

A `CalibrationCache` given a `PrefixStore` writes every entry it keeps to a folder as well, and
looks there when its memory misses: one safetensors file per prefix key, its tensors (the next
block's hidden inputs, the band's weights and masks, GPTQ's grids) and, in the header, the rest of
each `OBSResult`. Files are written through a temporary name and renamed, so trials running side
by side never read half a file; the same key always holds the same values, so two writers of one
key do no harm. Past `max_bytes` the least recently used files (by modification time, touched on
read) are deleted.

Example:
    >>> store = PrefixStore("results/llm/prefix-cache", max_bytes=8 << 30)      # doctest: +SKIP
    >>> cache = CalibrationCache(store=store)                                    # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import safetensors
import safetensors.torch
import torch

from sparta_explore.cache import atomic_write
from sparta_explore.errors import ConfigError
from sparta_explore.explore.llm.prefix import PrefixEntry
from sparta_explore.oneshot import OBSResult
from sparta_explore.oneshot.grid import GroupGrid

SUFFIX = ".safetensors"
FORMAT = 1  # bump when the file's layout changes: files of another format are misses


def _tensors_and_header(entry: PrefixEntry) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    tensors: dict[str, torch.Tensor] = {}
    for i, h in enumerate(entry.hidden or ()):
        tensors[f"hidden.{i}"] = h
    results = {}
    for name, r in entry.results.items():
        tensors[f"weight.{name}"], tensors[f"keep.{name}"] = r.weight, r.keep
        grid = None
        if r.grid is not None:
            tensors[f"scale.{name}"], tensors[f"zero.{name}"] = r.grid.scale, r.grid.zero
            grid = {"bits": r.grid.bits, "group_size": r.grid.group_size, "sym": r.grid.sym}
        results[name] = {"loss": r.loss, "grid": grid}
    header = {"format": FORMAT, "hidden": None if entry.hidden is None else len(entry.hidden), "results": results}
    # copies: safetensors refuses tensors that share memory (grids or hidden states may be views of one)
    return {k: v.detach().clone().contiguous() for k, v in tensors.items()}, header


class PrefixStore:
    """Prefix entries as files in `folder`, at most `max_bytes` of them (module docstring).

    Example:
        >>> PrefixStore("/tmp/prefixes").load("0" * 40) is None
        True
    """

    def __init__(self, folder: str | os.PathLike, max_bytes: int = 8 << 30) -> None:
        if max_bytes < 0:
            raise ConfigError(f"PrefixStore: max_bytes must be >= 0, got {max_bytes}")
        self.folder, self.max_bytes = Path(folder), int(max_bytes)

    def _path(self, key: str) -> Path:
        if not key or not all(c in "0123456789abcdef" for c in key):
            raise ConfigError(f"PrefixStore: a key is a hex digest (prefix_key), got {key!r}")
        return self.folder / f"{key}{SUFFIX}"

    def save(self, key: str, entry: PrefixEntry) -> Path | None:
        """Write `entry` (a `PrefixEntry`) under `key`, then trim the folder to `max_bytes`; None if it alone is
        larger than that."""
        if entry.nbytes > self.max_bytes:
            return None
        tensors, header = _tensors_and_header(entry)
        blob = safetensors.torch.save(tensors, metadata={"prefix": json.dumps(header)})
        path = atomic_write(self._path(key), lambda f: f.write(blob))
        self._trim(keep=path)
        return path

    def load(self, key: str) -> PrefixEntry | None:
        """The `PrefixEntry` kept under `key`, or None (no file, another format, or a file that does not read)."""
        path = self._path(key)
        try:
            with safetensors.safe_open(str(path), framework="pt") as f:
                header = json.loads((f.metadata() or {}).get("prefix", "{}"))
                if header.get("format") != FORMAT:
                    return None
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (a safe_open handle, not a dict)
            os.utime(path)  # recently used: trimmed last
        except (OSError, ValueError, safetensors.SafetensorError, json.JSONDecodeError):
            return None
        hidden = None if header["hidden"] is None else tuple(tensors[f"hidden.{i}"] for i in range(header["hidden"]))
        results = {}
        for name, r in header["results"].items():
            grid = None if r["grid"] is None else GroupGrid(tensors[f"scale.{name}"], tensors[f"zero.{name}"],
                                                             **r["grid"])
            results[name] = OBSResult(tensors[f"weight.{name}"], tensors[f"keep.{name}"], grid, float(r["loss"]))
        return PrefixEntry(hidden, {name: r.weight for name, r in results.items()}, results)

    def files(self) -> list[Path]:
        """The folder's entry files, least recently used first."""
        if not self.folder.is_dir():
            return []
        found = []
        for p in self.folder.glob(f"*{SUFFIX}"):
            try:
                found.append((p.stat().st_mtime, p))
            except FileNotFoundError:  # trimmed by a process running beside this one
                continue
        return [p for _, p in sorted(found)]

    def _trim(self, keep: Path) -> None:
        files = self.files()
        sizes = {}
        for p in files:
            try:
                sizes[p] = p.stat().st_size
            except FileNotFoundError:
                continue
        total = sum(sizes.values())
        for p in files:
            if total <= self.max_bytes:
                break
            if p == keep or p not in sizes:
                continue
            p.unlink(missing_ok=True)
            total -= sizes[p]
