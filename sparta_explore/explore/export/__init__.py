"""Export: the trial a user picked from a sweep, a protocol run or an NNI experiment, as a saved package.

* `pick.py`: the trials of a results location, and the one chosen by id or as the best under
  an accuracy floor and/or a latency target;
* `rebuild.py`: that trial run again from its parameters and seed, with the kernels its row
  recorded, its metric compared with the row's, and the compiled model saved with the trial's
  parameters and figures in the package's manifest.

Example:
    >>> row = pick_trial(load_trials("results/sweep"), best=True, min_accuracy=0.95)   # doctest: +SKIP
    >>> export_trial(row, "model.sparta").path                                         # doctest: +SKIP
"""

from sparta_explore.explore.export.pick import load_trials, pick_trial
from sparta_explore.explore.export.rebuild import ExportResult, export_trial

__all__ = ["ExportResult", "export_trial", "load_trials", "pick_trial"]
