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
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd
import torch

from sparta_explore.cache import atomic_write
from sparta_explore.errors import FileFormatError, TeSABitsError, TeSANameError, TeSAShapeError
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

    # lookups that may miss answer from the dict: Mapping's own go through __getitem__, whose error's "did you mean"
    # (difflib over every name) cost 0.85 s of a BERT-base compile asking for tensors a table does not hold
    def get(self, name: str, default: TeSA | None = None) -> TeSA | None:
        """The TeSA of `name`, or `default` when the table has none (no error, no name suggestions).

        Example:
            >>> TeSATable({"w": TeSA.dense((2, 2))}).get("v") is None
            True
        """
        return self._entries.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

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
        return atomic_write(Path(path), self.write)

    def write(self, f: IO[bytes]) -> None:
        """Write the table as `save` does, to an open binary file (a saved model's package holds it so).

        Example:
            >>> import io; buf = io.BytesIO(); t.write(buf)  # doctest: +SKIP
        """
        names = list(self._entries)
        header = {"format": FILE_FORMAT, "version": FILE_VERSION, "names": names,
                  "shapes": None if self._shapes is None else {k: list(v) for k, v in self._shapes.items()},
                  "groups": {n: t.group for n, t in self._entries.items() if t.group}}
        arrays = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}
        for i, name in enumerate(names):
            arrays[f"bits_{i}"] = self._entries[name].bits.numpy()
            arrays[f"fmt_{i}"] = self._entries[name].fmt.numpy()
        np.savez_compressed(f, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike | IO[bytes]) -> TeSATable:
        """Read a table written by `save`; never unpickles (object arrays are refused).

        Anything that is not such a table (missing, empty, truncated, corrupted, a foreign
        .npz, a bad header) raises one error type, `FileFormatError`, naming the file and
        what is wrong.

        Example:
            >>> TeSATable.load("table.npz")  # doctest: +SKIP
        """
        path = path if hasattr(path, "read") else Path(path)
        if isinstance(path, Path) and not path.is_file():
            raise FileFormatError(f"{path} is not a readable TeSA table: no such file")
        try:
            header, entries = _read_npz(path)
        except _NotATable as e:
            raise FileFormatError(f"{path} is not a readable TeSA table: {e}") from None
        except FileFormatError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError, TypeError,
                UnicodeDecodeError, AttributeError, RuntimeError) as e:
            # numpy and zipfile raise many types for torn files; one error names the file
            raise FileFormatError(f"{path} is not a readable TeSA table: {_why(e)}") from None
        shapes = header.get("shapes")
        try:
            return cls(entries, shapes=None if shapes is None else {k: tuple(v) for k, v in shapes.items()})
        except (TeSAShapeError, TeSANameError, TeSABitsError, TypeError, ValueError) as e:
            raise FileFormatError(f"{path}: {e}") from None


class _NotATable(Exception):
    """The file was read but is not a TeSA table (header missing or wrong)."""


def _why(e: BaseException) -> str:
    if isinstance(e, zipfile.BadZipFile):
        return f"not a zip archive, or a truncated one ({e})"
    if isinstance(e, (zlib.error, EOFError)):
        return f"compressed data is corrupt or truncated ({type(e).__name__}: {e})"
    if isinstance(e, UnicodeDecodeError):
        return "the header is not UTF-8 text"
    if isinstance(e, ValueError) and "pickle" in str(e):
        return "not an .npz archive of plain arrays"
    return f"{type(e).__name__}: {e}"


def _read_npz(path: Path | IO[bytes]) -> tuple[dict, dict[str, TeSA]]:
    if isinstance(path, Path):
        with open(path, "rb") as f:
            magic = f.read(4)
    else:
        magic = path.read(4)
        path.seek(0)
    if not magic:
        raise _NotATable("the file is empty")
    if magic[:2] != b"PK":
        raise _NotATable("not an .npz archive (no zip signature)")
    with np.load(path, allow_pickle=False) as data:
        if not isinstance(data, np.lib.npyio.NpzFile) or "header" not in data.files:
            raise _NotATable("no 'header' array")
        raw = data["header"]
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise _NotATable(f"the header is a {raw.dtype} array, not JSON bytes")
        try:
            header = json.loads(bytes(raw).decode("utf-8"))
        except json.JSONDecodeError as e:
            raise _NotATable(f"the header is not JSON ({e})") from None
        if not isinstance(header, dict):
            raise _NotATable(f"the header is a JSON {type(header).__name__}, not an object")
        if header.get("format") != FILE_FORMAT:
            raise _NotATable(f"format {header.get('format')!r}, expected {FILE_FORMAT!r}")
        if header.get("version") != FILE_VERSION:
            raise _NotATable(f"unsupported TeSA table version {header.get('version')!r} (this reads {FILE_VERSION})")
        names, shapes = header.get("names"), header.get("shapes")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _NotATable("the header's 'names' is not a list of strings")
        if shapes is not None and not (isinstance(shapes, dict) and all(
                isinstance(v, list) and all(isinstance(d, int) and d >= 0 for d in v) for v in shapes.values())):
            raise _NotATable("the header's 'shapes' is not a map of name -> list of sizes")
        groups = header.get("groups", {})  # absent in tables written before grids were a TeSA fact
        if not (isinstance(groups, dict) and all(isinstance(g, int) and g > 0 for g in groups.values())):
            raise _NotATable("the header's 'groups' is not a map of name -> positive grid size")
        entries = {}
        for i, name in enumerate(names):
            missing = [k for k in (f"bits_{i}", f"fmt_{i}") if k not in data.files]
            if missing:
                raise _NotATable(f"arrays {missing} of tensor {name!r} are missing")
            bits, fmt = data[f"bits_{i}"], data[f"fmt_{i}"]
            if bits.dtype != np.uint8 or fmt.dtype != np.uint8:
                raise _NotATable(f"tensor {name!r} is stored as {bits.dtype}/{fmt.dtype}, expected uint8")
            try:
                tesa = TeSA(torch.from_numpy(bits.copy()), torch.from_numpy(fmt.copy()), name=name)
                entries[name] = tesa.with_group(groups[name]) if name in groups else tesa
            except (TeSABitsError, TeSAShapeError) as e:
                raise _NotATable(str(e)) from None
    return header, entries
