"""The exploration wing: trials, searches, sweeps, the latency-vs-FLOPs protocol, NNI, reports.

One folder per idea, each importing only those before it:

* `trial/`: TrialParams, the five stages over frozen values, `run_trial`, the results row;
* `search/`: the search spaces (block, family, NNI dimensions) and the searches;
* `sweep/`: grids run into a results folder that survives being killed;
* `report/`: Pareto fronts, plots, report.md;
* `protocol/`: every search with one budget, judged on measured latency;
* `nni/`: the NNI trial command, our tuner, experiments run and exported.

Nothing here imports NNI, matplotlib or the compiler at import time: `run_trial` loads
the pipeline stages when it runs, `plots` loads matplotlib (Agg) when it draws.

Example:
    >>> from sparta_explore.explore import TrialParams, sweep
    >>> df = sweep({"sparsity": [0.5, 0.75], "bits": [32, 8]}, out="results/sweep")  # doctest: +SKIP
"""

from sparta_explore.explore.report.pareto import (
    front_hypervolume,
    guided_front,
    hypervolume,
    non_dominated,
    pareto_front,
)
from sparta_explore.explore.sweep import expand_grid, load_results, sweep
from sparta_explore.explore.trial import ROW_COLUMNS, TrialParams, TrialResult, run_trial
from sparta_explore.explore.trial.objectives import (
    Objective,
    get_objective,
    objective_names,
    register_objective,
    score,
)

__all__ = ["ROW_COLUMNS", "Objective", "TrialParams", "TrialResult", "expand_grid", "front_hypervolume",
           "get_objective", "guided_front", "hypervolume", "load_results", "non_dominated", "objective_names",
           "pareto_front", "register_objective", "run_trial", "score", "sweep"]
