"""Sweeps: run a trial for every point of a grid into a results folder that survives being killed.

Layout of `out`: ``rows/<key>.json`` holds one finished trial (params and row), written
atomically (temporary file + rename) the moment the trial ends; ``results.csv`` is every
row of the folder, rewritten atomically after each trial. A rerun reads ``rows/`` and
skips the points already there, so a killed sweep loses at most the trial it was running,
and no point is ever stored twice (its key is the hash of its params' canonical JSON).

Grids: a dict of axes, each a list of candidate values (a non-list value is fixed). An
axis whose values are dicts sets several fields at once, so patterns that need a pruner
and a block together are one axis. A list of dicts (or TrialParams) is taken as is.

Example:
    >>> [p.bits for p in expand_grid({"sparsity": [0.5, 0.75], "bits": [32, 8]})]
    [32, 8, 32, 8]
    >>> pts = expand_grid({"pattern": [{"pruner": "block", "block": "32x32"}, {"pruner": "l1norm", "block": None}]})
    >>> [(p.pruner, p.block) for p in pts]
    [('block', (32, 32)), ('l1norm', None)]
"""

from __future__ import annotations

import itertools
import json
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sparta_explore.cache import atomic_write
from sparta_explore.errors import ConfigError, FileFormatError
from sparta_explore.explore.params import TrialParams
from sparta_explore.explore.trial import ROW_COLUMNS, TrialResult, run_trial

Grid = Mapping[str, Any] | Sequence[Mapping[str, Any] | TrialParams]
TrialFn = Callable[[TrialParams], "TrialResult | Mapping[str, Any]"]
ROWS = "rows"
RESULTS_CSV = "results.csv"
# what plots and reports read from every row: a CSV without them is not a results table
RESULT_COLUMNS = ("workload", "batch", "accuracy", "dense_accuracy", "latency_ms", "dense_latency_ms", "dense_flops",
                  "effective_flops")


def expand_grid(grid: Grid, base: Mapping[str, Any] | TrialParams | None = None) -> list[TrialParams]:
    """Every point of `grid` as TrialParams over `base` (defaults if None); duplicates dropped.

    Example:
        >>> len(expand_grid({"sparsity": [0.5, 0.5, 0.9]}, base={"workload": "digits-mlp"}))
        2
    """
    base_dict = TrialParams.from_dict(base).to_dict() if base is not None else {}
    if isinstance(grid, Mapping):
        axes = [_axis(name, values) for name, values in grid.items()]
        points = [dict(itertools.chain.from_iterable(d.items() for d in combo)) for combo in itertools.product(*axes)]
    elif isinstance(grid, Sequence) and not isinstance(grid, str):
        points = [p.to_dict() if isinstance(p, TrialParams) else dict(p) for p in grid]
    else:
        raise ConfigError(f"a grid is a dict of axes or a list of points, got {type(grid).__name__}")
    out: dict[str, TrialParams] = {}
    for point in points:
        params = TrialParams.from_dict({**base_dict, **point})
        out.setdefault(params.key, params)
    return list(out.values())


def read_grid(path: str | os.PathLike) -> Grid:
    """A grid from a JSON file (a dict of axes or a list of points), checked: every point must be valid.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "g.json"; _ = p.write_text('{"sparsity": [0.5, 0.9]}')
        >>> len(expand_grid(read_grid(p)))
        2
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no grid file at {path}")
    try:
        grid = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise FileFormatError(f"{path} is not a JSON grid: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise FileFormatError(f"{path} is not a JSON grid: {e}") from None
    if not isinstance(grid, (dict, list)) or not grid:
        raise FileFormatError(f"{path} is not a grid: expected a non-empty dict of axes or list of points, "
                              f"got {json.dumps(grid)[:40]}")
    try:
        expand_grid(grid)
    except (ConfigError, TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None
    return grid


def _axis(name: str, values: Any) -> list[dict[str, Any]]:
    choices = values if isinstance(values, list) else [values]
    if not choices:
        raise ConfigError(f"grid axis {name!r} has no values")
    if all(isinstance(v, Mapping) for v in choices):
        return [dict(v) for v in choices]
    if any(isinstance(v, Mapping) for v in choices):
        raise ConfigError(f"grid axis {name!r} mixes dicts and plain values")
    return [{name: v} for v in choices]


def _row_of(result: TrialResult | Mapping[str, Any], params: TrialParams) -> dict[str, Any]:
    row = result.as_row() if isinstance(result, TrialResult) else dict(result)
    # the key is always the one the sweep looks the point up by, whatever the trial returned
    row["key"], row["params_json"] = params.key, params.canonical_json()
    return row


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


def _read_rows(folder: Path) -> dict[str, dict[str, Any]]:
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


def _frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
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
            rows = sorted(_read_rows(path).values(), key=lambda r: r.get("finished_at", 0.0))
            return _frame(rows)
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
    return _frame(df.to_dict("records"))


def write_csv(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write `df` to `path` atomically (readers never see half a file).

    Example:
        >>> write_csv(pd.DataFrame({"a": [1]}), "/tmp/sweep-doc/a.csv").read_text()
        'a\\n1\\n'
    """
    return atomic_write(Path(path), lambda f: f.write(df.to_csv(index=False).encode()))


def sweep(grid: Grid, out: str | os.PathLike, *, trial_fn: TrialFn | None = None,
          base: Mapping[str, Any] | TrialParams | None = None, progress: bool = True,
          trial_kwargs: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Run `trial_fn` (default `run_trial`) on every point of `grid` not yet finished in `out`.

    Returns the grid's rows (finished earlier or now) in grid order; `out/results.csv`
    holds every row of the folder. `trial_kwargs` go to `run_trial` (e.g. cache_dir, runs).
    A trial that raises stops the sweep; the rows finished before it are kept.

    Example:
        >>> df = sweep({"sparsity": [0.5, 0.75], "bits": [32, 8]}, out="results/sweep")  # doctest: +SKIP
        >>> df[["sparsity", "bits", "accuracy", "latency_ms"]]  # doctest: +SKIP
    """
    points = expand_grid(grid, base)
    if trial_fn is not None and trial_kwargs:
        raise ConfigError("trial_kwargs are for the default run_trial; bind them into your trial_fn instead")
    run = trial_fn if trial_fn is not None else _default_trial(trial_kwargs or {})
    folder = Path(out)
    (folder / ROWS).mkdir(parents=True, exist_ok=True)
    rows = _read_rows(folder)
    todo = [p for p in points if p.key not in rows]
    if todo and trial_fn is None:
        _check_names(todo)
    from tqdm.auto import tqdm

    with tqdm(total=len(points), initial=len(points) - len(todo), desc=f"sweep {folder.name}", unit="trial",
              disable=not progress) as bar:
        for params in todo:
            row = _row_of(run(params), params)
            row["finished_at"] = time.time()
            record = {"key": params.key, "params": params.to_dict(), "row": row}
            blob = json.dumps(record, allow_nan=True, default=_json_default).encode()
            atomic_write(folder / ROWS / f"{params.key}.json", lambda f, b=blob: f.write(b))
            rows[params.key] = row
            write_csv(load_results(folder), folder / RESULTS_CSV)
            bar.update(1)
    if not todo and rows:
        write_csv(load_results(folder), folder / RESULTS_CSV)  # a finished folder still has its CSV
    return _frame(rows[p.key] for p in points)


def _default_trial(kwargs: Mapping[str, Any]) -> TrialFn:
    def trial(params: TrialParams) -> TrialResult:
        return run_trial(params, **kwargs)
    return trial


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    raise TypeError(f"row value {value!r} of type {type(value).__name__} is not JSON-able")


def _check_names(points: Sequence[TrialParams]) -> None:
    # a misspelt pruner in point 17 should fail now, not after 16 trials
    from sparta_explore.pruners import get_pruner
    from sparta_explore.quantizers import get_quantizer

    for name in sorted({p.pruner for p in points}):
        get_pruner(name)
    for name in sorted({p.quantizer for p in points if p.bits != 32}):
        get_quantizer(name)
