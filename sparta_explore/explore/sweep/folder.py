"""A results folder: one JSON file per finished trial, and the CSV of them all, both written atomically.

Layout: ``rows/<key>.json`` holds one finished trial (``{"key", "params", "row"}``),
written the moment the trial ends; ``results.csv`` is every row of the folder. A row
file that cannot be read is set aside (``.bad``) with a `CorruptRowWarning`, so its
trial runs again. `load_results` reads a folder or any results CSV (sweeps, protocol
runs, NNI exports) into the columns of `ROW_COLUMNS`, extra columns after them.

Example:
    >>> load_results("results/demo").columns[0]  # doctest: +SKIP
    'key'
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from sparta_explore.cache import atomic_write
from sparta_explore.errors import FileFormatError
from sparta_explore.explore.trial.result import ROW_COLUMNS

ROWS = "rows"
RESULTS_CSV = "results.csv"
# what plots and reports read from every row: a CSV without them is not a results table
RESULT_COLUMNS = ("workload", "batch", "accuracy", "dense_accuracy", "latency_ms", "dense_latency_ms", "dense_flops",
                  "effective_flops")


class CorruptRowWarning(UserWarning):
    """A row file of a sweep folder was unreadable and was set aside; its trial runs again."""


def _row_problem(path: Path) -> tuple[str, dict[str, Any] | None]:
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"{type(e).__name__}: {e}", None
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a row record", None
    if record.get("key") != path.stem:
        return f"its key {record.get('key')!r} is not its file name", None
    if not isinstance(record.get("row"), dict):
        return "no 'row' object", None
    return "", record


def set_aside(path: Path) -> Path:
    """Rename a bad file to ``<name>.bad`` (``.bad1``, ... if taken) so nothing reads it again; returns the new path.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "k.json"; _ = p.write_text("{")
        >>> set_aside(p).name, p.exists()
        ('k.json.bad', False)
    """
    for i in range(1000):
        target = path.with_name(path.name + (".bad" if i == 0 else f".bad{i}"))
        if not target.exists():
            os.replace(path, target)
            return target
    raise FileExistsError(f"cannot set {path} aside: {path.name}.bad .. .bad999 all exist")


def read_rows(folder: Path) -> dict[str, dict[str, Any]]:
    """Every readable row of `folder/rows`; an unreadable one is set aside with a warning (its trial reruns)."""
    rows = {}
    for path in sorted((folder / ROWS).glob("*.json")):
        problem, record = _row_problem(path)
        if record is None:
            moved = set_aside(path)
            warnings.warn(f"sweep row {path} is unreadable ({problem}); moved to {moved.name}, its trial will run "
                          "again", CorruptRowWarning, stacklevel=3)
            continue
        rows[record["key"]] = record["row"]
    return rows


def results_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(list(rows))
    if df.empty:
        return pd.DataFrame(columns=list(ROW_COLUMNS))
    known = [c for c in ROW_COLUMNS if c in df.columns]
    return df[known + [c for c in df.columns if c not in known]]


def load_results(path: str | os.PathLike) -> pd.DataFrame:
    """The results of a sweep folder (its rows, ordered by finish time) or of a results CSV.

    Example:
        >>> load_results("results/demo").columns[0]  # doctest: +SKIP
        'key'
    """
    path = Path(path)
    if path.is_dir():
        if (path / ROWS).is_dir():
            rows = sorted(read_rows(path).values(), key=lambda r: r.get("finished_at", 0.0))
            return results_frame(rows)
        path = path / RESULTS_CSV
    if not path.exists():
        raise FileNotFoundError(f"no results at {path} (expected a sweep folder or a results CSV)")
    try:
        df = pd.read_csv(path, keep_default_na=True)
        if "model" in df.columns and "workload" not in df.columns:  # written before workloads had their name
            df = df.rename(columns={"model": "workload"})
    except (UnicodeDecodeError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise FileFormatError(f"{path} is not a results CSV: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    missing = [c for c in RESULT_COLUMNS if c not in df.columns]
    if missing:
        raise FileFormatError(f"{path} is not a results table of sparta-explore: no column(s) {missing}")
    return results_frame(df.to_dict("records"))


def write_csv(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write `df` to `path` atomically (readers never see half a file).

    Example:
        >>> write_csv(pd.DataFrame({"a": [1]}), "/tmp/sweep-doc/a.csv").read_text()
        'a\\n1\\n'
    """
    return atomic_write(Path(path), lambda f: f.write(df.to_csv(index=False).encode()))
