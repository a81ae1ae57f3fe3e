"""Sweep grids: a dict of axes (each a list of candidate values) or a list of points, expanded to TrialParams.

A non-list axis value is fixed. An axis whose values are dicts sets several fields at
once, so patterns that need a pruner and a block together are one axis. A list of dicts
(or TrialParams) is taken as is. Duplicate points (same params key) are dropped.

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sparta_explore.errors import ConfigError, FileFormatError
from sparta_explore.explore.trial.params import TrialParams

Grid = Mapping[str, Any] | Sequence[Mapping[str, Any] | TrialParams]


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
