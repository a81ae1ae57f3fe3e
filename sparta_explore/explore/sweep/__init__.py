"""Sweeps: a grid of trials (`grid`), run into a results folder (`run`) that keeps one file per trial (`folder`).

Example:
    >>> from sparta_explore.explore.sweep import expand_grid
    >>> len(expand_grid({"sparsity": [0.5, 0.9], "bits": [32, 8]}))
    4
"""

from sparta_explore.explore.sweep.folder import (
    RESULTS_CSV,
    ROWS,
    CorruptRowWarning,
    load_results,
    read_rows,
    results_frame,
    set_aside,
    write_csv,
)
from sparta_explore.explore.sweep.grid import Grid, expand_grid, read_grid
from sparta_explore.explore.sweep.run import TrialFn, sweep

__all__ = ["RESULTS_CSV", "ROWS", "CorruptRowWarning", "Grid", "TrialFn", "expand_grid", "load_results", "read_grid",
           "read_rows", "results_frame", "set_aside", "sweep", "write_csv"]
