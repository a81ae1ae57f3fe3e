"""TeSATable: tensor name -> TeSA, for the weights and activations of one model.

Names are parameter FQNs (``"fc1.weight"``) and graph node names (``"relu_1"``) as
`capture` reports them. A table may carry the shapes of the tensors it may describe;
then every insert is checked, and a wrong name or shape raises an error naming it.

Tables are saved as ``.npz`` with plain integer arrays plus a JSON header, and loaded
with ``allow_pickle=False``, so loading a file never runs code.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sparta_explore.cache import atomic_write
from sparta_explore.errors import TeSANameError, TeSAShapeError
from sparta_explore.tesa import TeSA

FILE_FORMAT = "sparta-explore.tesa-table"
FILE_VERSION = 1


def _unknown_name(name: str, known: Iterable[str], where: str) -> TeSANameError:
    close = difflib.get_close_matches(name, list(known), n=3)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return TeSANameError(f"unknown tensor {name!r} in {where}{hint}")


class TeSATable(MutableMapping[str, TeSA]):
    """Mapping from tensor name to its TeSA.

    Example:
        >>> t = TeSATable({"fc1.weight": TeSA.dense((4, 3))}, shapes={"fc1.weight": (4, 3)})
        >>> t["fc1.weight"].sparsity
        0.0
        >>> t["fc2.weight"] = TeSA.dense((2, 4))
        Traceback (most recent call last):
        ...
        sparta_explore.errors.TeSANameError: unknown tensor 'fc2.weight' in this table's graph...
    """

    def __init__(self, entries: Mapping[str, TeSA] | None = None, *,
                 shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
        self._shapes = {k: tuple(v) for k, v in shapes.items()} if shapes is not None else None
        self._entries: dict[str, TeSA] = {}
        for name, tesa in (entries or {}).items():
            self[name] = tesa

    @classmethod
    def dense_for(cls, shapes: Mapping[str, tuple[int, ...]], bits: int = 32) -> TeSATable:
        """A table with a dense TeSA for every named tensor.

        Example:
            >>> TeSATable.dense_for({"x": (2, 3)})["x"].bit_histogram()
            {32: 6}
        """
        return cls({n: TeSA.dense(s, bits=bits) for n, s in shapes.items()}, shapes=shapes)

    # ---- mapping protocol ------------------------------------------------------------
    def __getitem__(self, name: str) -> TeSA:
        try:
            return self._entries[name]
        except KeyError:
            raise _unknown_name(name, self._entries, "this table") from None

    def __setitem__(self, name: str, tesa: TeSA) -> None:
        if not isinstance(name, str):
            raise TeSANameError(f"tensor names are strings, got {name!r}")
        if not isinstance(tesa, TeSA):
            raise TypeError(f"value for {name!r} must be a TeSA, got {type(tesa).__name__}")
        if self._shapes is not None:
            if name not in self._shapes:
                raise _unknown_name(name, self._shapes, "this table's graph")
            tesa.check_fits(self._shapes[name], name)
        self._entries[name] = tesa

    def __delitem__(self, name: str) -> None:
        if name not in self._entries:
            raise _unknown_name(name, self._entries, "this table")
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"TeSATable({len(self)} tensors, sparsity={self.total_sparsity():.3f})"

    @property
    def shapes(self) -> dict[str, tuple[int, ...]] | None:
        """Shapes of the tensors this table may describe, if it is bound to a graph."""
        return dict(self._shapes) if self._shapes is not None else None

    # ---- algebra ---------------------------------------------------------------------
    def merge(self, other: Mapping[str, TeSA]) -> TeSATable:
        """Entry-wise `TeSA.merge`; names in only one table are copied as they are.

        Example:
            >>> a = TeSATable({"w": TeSA.from_mask(torch.tensor([1, 0]))})
            >>> b = TeSATable({"w": TeSA.dense((2,), bits=8)})
            >>> a.merge(b)["w"].bit_histogram()
            {0: 1, 8: 1}
        """
        shapes = self._shapes
        if isinstance(other, TeSATable) and other._shapes is not None:
            shapes = {**other._shapes, **(shapes or {})}
        out = TeSATable(self._entries, shapes=shapes)
        for name, tesa in other.items():
            out[name] = out._entries[name].merge(tesa) if name in out._entries else tesa
        return out

    def equals(self, other: Mapping[str, TeSA]) -> bool:
        """Same names, and equal TeSAs under each."""
        return set(self) == set(other) and all(self[n].equals(other[n]) for n in self)

    def total_sparsity(self) -> float:
        """Pruned elements over all elements of all tensors in the table."""
        total = sum(t.numel for t in self._entries.values())
        pruned = sum(int(t.pruned.sum()) for t in self._entries.values())
        return pruned / total if total else 0.0

    # ---- report ------------------------------------------------------------------------
    def summary(self) -> pd.DataFrame:
        """One row per tensor: name, shape, numel, sparsity, bits, fmt, mean_bits.

        `bits` lists the distinct kept bit widths ("8", "4/8"; "-" if all pruned).

        Example:
            >>> TeSATable({"w": TeSA.from_mask(torch.tensor([1, 0]), bits=8)}).summary()["bits"].tolist()
            ['8']
        """
        rows = []
        for name, t in self._entries.items():
            kept = t.kept_bits()
            rows.append({
                "name": name,
                "shape": "x".join(str(s) for s in t.shape) or "scalar",
                "numel": t.numel,
                "sparsity": round(t.sparsity, 4),
                "bits": "/".join(str(b) for b in kept) or "-",
                "fmt": "/".join(sorted(f.name.lower() for f in t.formats())) or "-",
                "mean_bits": round(t.mean_bits(), 2),
            })
        columns = ["name", "shape", "numel", "sparsity", "bits", "fmt", "mean_bits"]
        return pd.DataFrame(rows, columns=columns)

    # ---- persistence -------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the table to `path` (.npz) atomically; returns the path.

        Example:
            >>> t.save("table.npz")  # doctest: +SKIP
        """
        path = Path(path)
        names = list(self._entries)
        header = {"format": FILE_FORMAT, "version": FILE_VERSION, "names": names,
                  "shapes": None if self._shapes is None else {k: list(v) for k, v in self._shapes.items()}}
        arrays = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}
        for i, name in enumerate(names):
            arrays[f"bits_{i}"] = self._entries[name].bits.numpy()
            arrays[f"fmt_{i}"] = self._entries[name].fmt.numpy()
        return atomic_write(path, lambda f: np.savez_compressed(f, **arrays))

    @classmethod
    def load(cls, path: str | os.PathLike) -> TeSATable:
        """Read a table written by `save`; never unpickles (object arrays are refused).

        Example:
            >>> TeSATable.load("table.npz")  # doctest: +SKIP
        """
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(bytes(data["header"]).decode())
                if header.get("format") != FILE_FORMAT:
                    raise ValueError(f"{path} is not a TeSA table (format {header.get('format')!r})")
                if header.get("version") != FILE_VERSION:
                    raise ValueError(f"{path}: unsupported TeSA table version {header.get('version')!r}")
                entries = {name: TeSA(torch.from_numpy(data[f"bits_{i}"].copy()),
                                      torch.from_numpy(data[f"fmt_{i}"].copy()), name=name)
                           for i, name in enumerate(header["names"])}
        except (KeyError, json.JSONDecodeError, OSError) as e:
            raise ValueError(f"{path} is not a readable TeSA table: {e}") from None
        shapes = header.get("shapes")
        try:
            return cls(entries, shapes=None if shapes is None else {k: tuple(v) for k, v in shapes.items()})
        except TeSAShapeError as e:
            raise TeSAShapeError(f"{path}: {e}") from None
