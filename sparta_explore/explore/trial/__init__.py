"""One trial: the params it varies, its five stages over frozen values, and the results row it measures.

`params` (TrialParams, with `families` as single-key aliases and `objectives` to score a
row), `stages` (compress -> finetune -> calibrate -> compile -> measure), `run`
(`run_trial`: the stages in order, then the row), `result` (TrialResult, ROW_COLUMNS),
`timing` (the dense and compiled model timed call by call, alternating).

Example:
    >>> from sparta_explore.explore.trial import TrialParams
    >>> TrialParams.from_dict({"pattern": "2:4"}).pruner
    'nm'
"""

from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.explore.trial.result import ROW_COLUMNS, TrialResult
from sparta_explore.explore.trial.run import run_trial

__all__ = ["ROW_COLUMNS", "TrialParams", "TrialResult", "run_trial"]
