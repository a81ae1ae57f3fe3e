"""The exploration loop: one trial, sweeps over grids, objectives, Pareto fronts, plots, reports.

Nothing here imports NNI, matplotlib or the compiler at import time: `run_trial` loads
the pipeline stages when it runs, `plots` loads matplotlib (Agg) when it draws.

Example:
    >>> from sparta_explore.explore import TrialParams, sweep
    >>> df = sweep({"sparsity": [0.5, 0.75], "bits": [32, 8]}, out="results/sweep")  # doctest: +SKIP
"""

from sparta_explore.explore.objectives import Objective, get_objective, objective_names, register_objective, score
from sparta_explore.explore.params import TrialParams
from sparta_explore.explore.pareto import front_hypervolume, guided_front, hypervolume, non_dominated, pareto_front
from sparta_explore.explore.sweep import expand_grid, load_results, sweep
from sparta_explore.explore.trial import ROW_COLUMNS, TrialResult, run_trial

__all__ = ["ROW_COLUMNS", "Objective", "TrialParams", "TrialResult", "expand_grid", "front_hypervolume",
           "get_objective", "guided_front", "hypervolume", "load_results", "non_dominated", "objective_names",
           "pareto_front", "register_objective", "run_trial", "score", "sweep"]
