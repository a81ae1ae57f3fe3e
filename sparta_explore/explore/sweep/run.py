"""Sweeps: run a trial for every point of a grid into a results folder that survives being killed.

Each trial's row is stored the moment it ends (`sweep.folder`); a rerun reads the folder
and skips the points already there, so a killed sweep loses at most the trial it was
running, and no point is ever stored twice (its key is the hash of its params' canonical
JSON). Grids: see `sweep.grid`.

Example:
    >>> df = sweep({"sparsity": [0.5, 0.75], "bits": [32, 8]}, out="results/sweep")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sparta_explore.cache import atomic_write
from sparta_explore.errors import ConfigError
from sparta_explore.explore.sweep.folder import RESULTS_CSV, ROWS, load_results, read_rows, results_frame, write_csv
from sparta_explore.explore.sweep.grid import Grid, expand_grid
from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.explore.trial.result import TrialResult
from sparta_explore.explore.trial.run import run_trial

TrialFn = Callable[[TrialParams], "TrialResult | Mapping[str, Any]"]


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
    rows = read_rows(folder)
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
    return results_frame(rows[p.key] for p in points)


def _row_of(result: TrialResult | Mapping[str, Any], params: TrialParams) -> dict[str, Any]:
    row = result.as_row() if isinstance(result, TrialResult) else dict(result)
    # the key is always the one the sweep looks the point up by, whatever the trial returned
    row["key"], row["params_json"] = params.key, params.canonical_json()
    return row


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
