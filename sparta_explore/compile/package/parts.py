"""The parts every package has, written and read the same way for a compiled model and one compiled in place.

Names of the parts, the manifest's machine and instruction-set records, report tables as
plain rows, TeSA tables as .npz bytes, and the example: the inputs the model was checked on
and the outputs of what was saved, which `load` runs and compares.

Example:
    >>> sorted(isa_record())
    ['ceiling', 'flags', 'vector_width']
"""

from __future__ import annotations

import io
import json
import platform
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import safetensors.torch
import torch
from torch import nn
from torch.utils import _pytree as pytree

import sparta_explore
from sparta_explore.compile.choose import relative_error
from sparta_explore.compile.package.archive import PackageReader
from sparta_explore.compile.package.tensors import TensorStore, TensorTable
from sparta_explore.compile.package.values import Decoder, Encoder
from sparta_explore.compile.record import CompileRecord  # noqa: F401  (used by the docstring example)
from sparta_explore.errors import PackageError
from sparta_explore.kernels.build import FLAGS, ISA_CEILINGS, compiler_version, target_isa, vector_width
from sparta_explore.tesa_table import TeSATable

MODEL = "model.json"
TENSORS = "tensors.safetensors"
EXAMPLE = "example.safetensors"
TABLE, INPUT_TABLE = "table.npz", "input_table.npz"


def machine_record() -> dict[str, Any]:
    """The machine a package is written (or read) on: CPU, threads, and the key that names both with the flags.

    Example:
        >>> sorted(machine_record())
        ['cpu_model', 'key', 'threads']
    """
    from sparta_explore.machine import this_machine

    m = this_machine()
    return {"key": m.key, "cpu_model": m.cpu_model, "threads": m.threads}


def isa_record() -> dict[str, Any]:
    """The instruction set kernels are generated for here: flags under the ceiling, vector width, ceiling."""
    from sparta_explore.machine import this_machine

    return {"flags": list(this_machine().flags), "vector_width": vector_width(), "ceiling": target_isa()}


def manifest(kind: str, started: float, libraries: int, notes: list[str], metadata: Mapping[str, Any] | None
             ) -> dict[str, Any]:
    """The manifest of a package of `kind` (the archive adds the format and the file list).

    Example:
        >>> manifest("compiled", time.perf_counter(), 0, [], None)["kind"]
        'compiled'
    """
    return {"kind": kind, "sparta_explore": sparta_explore.__version__, "torch": torch.__version__,
            "python": platform.python_version(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine_record(), "isa": isa_record(), "compiler": compiler_version(),
            "build_flags": list(FLAGS + ISA_CEILINGS[target_isa()][1]), "notes": notes, "kernels": libraries,
            "save_seconds": round(time.perf_counter() - started, 3), "metadata": dict(metadata or {})}


def frame_data(df: pd.DataFrame, enc: Encoder, where: str) -> dict[str, Any]:
    """A DataFrame as {"columns", "rows"}, numpy scalars made plain and NaN kept (`frame_from` reads it).

    Example:
        >>> frame_data(pd.DataFrame({"a": [1.5]}), Encoder(TensorStore()), "f")
        {'columns': ['a'], 'rows': [[1.5]]}
    """
    def plain(v: Any) -> Any:
        return v.item() if isinstance(v, np.generic) else v
    return {"columns": [str(c) for c in df.columns],
            "rows": [[enc.encode(plain(v), f"{where} row {i}") for v in row]
                     for i, row in enumerate(df.itertuples(index=False, name=None))]}


def frame_from(data: Any, where: str, dec: Decoder) -> pd.DataFrame:
    """The DataFrame `frame_data` wrote.

    Example:
        >>> frame_from({"columns": ["a"], "rows": [[1]]}, "f", Decoder(TensorTable({}, {}, "m")))["a"].tolist()
        [1]
    """
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("columns", "rows")):
        raise PackageError(f"{where}: malformed table")
    return pd.DataFrame([dec.decode(row, where) for row in data["rows"]], columns=data["columns"])


def table_bytes(table: Mapping[str, Any]) -> bytes:
    """A TeSA table as the bytes of its .npz file (`TeSATable.write`)."""
    buf = io.BytesIO()
    TeSATable(dict(table)).write(buf)
    return buf.getvalue()


class StoredTable(Mapping):
    """A TeSA table kept in a package, read on first use (a 12-layer BERT's tables take seconds to inflate, and
    running the model never reads them)."""

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data
        self._table: TeSATable | None = None

    def table(self) -> TeSATable:
        """The table itself (read now if it was not yet)."""
        if self._table is None:
            self._table = TeSATable.load(io.BytesIO(self._data))
            self._data = None
        return self._table

    def __getitem__(self, name: str) -> Any:
        return self.table()[name]

    def __iter__(self):
        return iter(self.table())

    def __len__(self) -> int:
        return len(self.table())


def read_table(reader: PackageReader, name: str) -> StoredTable | None:
    """The TeSA table stored as part `name` (read when first used), or None when the package has none."""
    return StoredTable(reader.read(name)) if name in reader.files else None


def arrays(reader: PackageReader, name: str) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors part `name` (plain arrays: nothing executes)."""
    try:
        return safetensors.torch.load(reader.read(name))
    except Exception as e:  # safetensors raises its own error types for malformed headers
        raise PackageError(f"{reader.path}: {name!r} is not a readable safetensors file ({e})") from None


def _leaves(out: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def example_record(run: Callable[..., Any], call: tuple[tuple, dict]
                   ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(record, arrays) of the example call and the outputs `run(*args, **kwargs)` gives on it.

    Example:
        >>> record, arrays = example_record(nn.ReLU(), ((torch.ones(2),), {}))
        >>> len(record["outputs"])
        1
    """
    store = TensorStore()
    enc = Encoder(store)
    args, kwargs = call
    with torch.inference_mode():
        out = run(*args, **kwargs)
    record = {"args": enc.encode(tuple(args), "example input"), "kwargs": enc.encode(dict(kwargs), "example input"),
              "outputs": [store.add(t.detach().clone()) for t in _leaves(out)]}
    stored, meta = store.arrays()
    record["tensors"] = meta
    return record, stored


def example_call(data: Mapping[str, Any], reader: PackageReader) -> tuple[tuple, dict]:
    """The example inputs stored in the package, as (args, kwargs)."""
    dec = Decoder(TensorTable(arrays(reader, EXAMPLE), data.get("tensors") or {}, str(reader.path)))
    args, kwargs = dec.decode(data.get("args"), "example input"), dec.decode(data.get("kwargs"), "example input")
    if not isinstance(args, tuple) or not isinstance(kwargs, dict):
        raise PackageError(f"{reader.path}: malformed example inputs")
    return args, kwargs


def example_check(run: Callable[..., Any], data: Mapping[str, Any], reader: PackageReader) -> dict[str, Any]:
    """Run the stored example through `run`: {bit_identical, error (max relative), tolerance} against the saved
    outputs.

    Example:
        >>> example_check(model, data["example"], reader)["bit_identical"]   # doctest: +SKIP
        True
    """
    tensors = TensorTable(arrays(reader, EXAMPLE), data.get("tensors") or {}, str(reader.path))
    args, kwargs = example_call(data, reader)
    want = [tensors.get(k) for k in data.get("outputs") or ()]
    with torch.inference_mode():
        got = _leaves(run(*args, **kwargs))
    if len(got) != len(want):
        raise PackageError(f"{reader.path}: the model gives {len(got)} output tensors, the package saved {len(want)}")
    same = all(a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
    errors = [relative_error(a.float(), b.float()) if a.shape == b.shape else float("inf")
              for a, b in zip(got, want) if a.is_floating_point()]
    return {"bit_identical": bool(same), "error": max(errors, default=0.0),
            "tolerance": float(data.get("tolerance") or 1e-3)}


def json_bytes(data: Any) -> bytes:
    """Compact JSON (no NaN: the codecs wrote non-finite floats as tagged values)."""
    return json.dumps(data, allow_nan=False, separators=(",", ":")).encode()


def kernel_tiles(module: nn.Module) -> list[dict[str, Any]]:
    """Per kernel op: its class, tiling, instruction path and library (the plan's choice made concrete).

    Example:
        >>> kernel_tiles(nn.Linear(2, 2))
        []
    """
    rows = []
    for name, m in module.named_modules():
        if getattr(m, "built", None) is None:
            continue
        tile = getattr(m, "tile", None)
        rows.append({"op": getattr(m, "label", None) or name, "module": name, "class": type(m).__name__,
                     "tile": None if tile is None else repr(tile), "path": getattr(m, "dot_path", None),
                     "library": m.built.key})
    return rows


def report_record(report: Any, passes: Any, checks: Any, guard: Any, seconds: float, enc: Encoder,
                  module: nn.Module) -> dict[str, Any]:
    """The compile report as package data: plan, passes, checks, kernels (tiles), guard, seconds."""
    return {"plan": frame_data(report, enc, "plan"), "passes": frame_data(passes, enc, "passes"),
            "checks": frame_data(checks, enc, "checks"), "kernels": kernel_tiles(module),
            "guard": enc.encode(guard, "guard"), "seconds": float(seconds)}


def package_parts(data: Mapping[str, Any], arrays: Mapping[str, torch.Tensor],
                  example_arrays: Mapping[str, torch.Tensor], sources: Mapping[str, str], record: Any
                  ) -> dict[str, bytes]:
    """Every part of a package but the manifest: the model's JSON, its tensors, the example, the kernel sources and
    the tables `record` (a `CompileRecord`) keeps.

    Example:
        >>> sorted(package_parts({}, {}, {}, {}, CompileRecord()))
        ['example.safetensors', 'model.json', 'tensors.safetensors']
    """
    parts = {MODEL: json_bytes(data), TENSORS: safetensors.torch.save(dict(arrays)),
             EXAMPLE: safetensors.torch.save(dict(example_arrays)),
             **{file: text.encode() for file, text in sources.items()}}
    for name, table in ((TABLE, record.table), (INPUT_TABLE, record.input_table)):
        if table is not None:
            parts[name] = table_bytes(table)
    return parts
