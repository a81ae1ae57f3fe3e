"""`ParetoTuner`: an NNI tuner that searches for the best quality (accuracy; dense / perplexity) per *measured* latency.

It wraps `pareto_tpe.ParetoTPE` (multi-objective TPE over quality and cost) in NNI's
`Tuner` interface. The cost it minimizes is a column of the trial's final
result, by default ``latency_ratio`` (compiled over dense latency, both timed in the same
trial, so machine drift cancels); ``flops_ratio`` makes it a FLOPs-guided search instead.

NNI issue 5726: with trialConcurrency > 1, NNI's local training service hands parameters
to trials in the order they ask, not the order they were made, so a result may arrive
under another trial's parameter_id (and `trial_end` under the wrong one). The tuner
therefore files each result under the parameters the trial echoes (``nni_params`` in its
final dict, see `nni_trial`), never under its parameter_id alone.

Use it from an experiment config:

    tuner:
      codeDirectory: ..
      className: sparta_explore.explore.nni.tuner.ParetoTuner
      classArgs: {cost: latency_ratio, startup: 4, seed: 0}

Example:
    >>> tuner = ParetoTuner(startup=2, seed=1)
    >>> tuner.update_search_space({"sparsity": {"_type": "choice", "_value": [0.5, 0.9]}})
    >>> p = tuner.generate_parameters(0)
    >>> tuner.receive_trial_result(0, p, {"default": 0.9, "accuracy": 0.9, "latency_ratio": 0.6, "nni_params": p})
    >>> tuner.search.front()[0].params == p
    True
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import nni
from nni.tuner import Tuner

from sparta_explore.errors import ConfigError
from sparta_explore.explore.search.dimensions import Space
from sparta_explore.explore.search.pareto_tpe import ParetoTPE, SearchConfig, SpaceExhausted
from sparta_explore.quality import row_quality

_log = logging.getLogger(__name__)

ECHO_KEY = "nni_params"  # where nni_trial echoes the parameters it ran


class ParetoTuner(Tuner):
    """Pareto-aware TPE tuner over two columns of the trials' final results (maximize `value`, minimize `cost`).

    classArgs: `cost` [latency_ratio] and `value` [quality] name result columns; quality is the
    workload's metric, or dense / metric for a metric to minimize such as perplexity
    (`sparta_explore.quality`; computed from the metric columns when a result has none);
    `startup`, `gamma`, `candidates`, `prior_weight`, `seed`, `value_floor` go to `SearchConfig`.

    Example:
        >>> ParetoTuner(cost="")
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: cost and value must name result columns, got '' and 'quality'
    """

    def __init__(self, cost: str = "latency_ratio", value: str = "quality", startup: int = 6, gamma: float = 0.3,
                 candidates: int = 24, prior_weight: float = 1.0, seed: int | None = 0,
                 value_floor: float | None = None) -> None:
        if not (isinstance(cost, str) and cost and isinstance(value, str) and value):
            raise ConfigError(f"cost and value must name result columns, got {cost!r} and {value!r}")
        self.cost, self.value = cost, value
        self.config = SearchConfig(startup=startup, gamma=gamma, candidates=candidates, prior_weight=prior_weight,
                                   seed=seed, value_floor=value_floor)
        self.search: ParetoTPE | None = None
        self.issued: dict[int, dict[str, Any]] = {}  # parameter_id -> what this tuner handed out
        self.mismatches = 0  # results whose echo disagreed with their parameter_id (NNI issue 5726)

    def update_search_space(self, search_space: Mapping[str, Any]) -> None:
        """Start (or restart, keeping the results that fit) the search over `search_space`.

        Example:
            >>> t = ParetoTuner()
            >>> t.update_search_space({"b": {"_type": "choice", "_value": [32, 8]}})
            >>> t.search.space.keys
            ('b',)
        """
        old = self.search.finished if self.search is not None else []
        self.search = ParetoTPE(Space.from_nni(search_space), self.config)
        for point in old:
            if set(point.params) == set(self.search.space.keys) and self.search.space.contains(point.params):
                self.search.tell(point.params, point.value, point.cost)

    def generate_parameters(self, parameter_id: int, **kwargs: Any) -> dict[str, Any]:
        """The next point of the search; NNI's NoMoreTrialError once a finite space is used up.

        Example:
            >>> t = ParetoTuner()
            >>> t.update_search_space({"b": {"_type": "choice", "_value": [8]}})
            >>> t.generate_parameters(0)
            {'b': 8}
        """
        if self.search is None:
            raise ConfigError("ParetoTuner got no search space (update_search_space was never called)")
        try:
            params = self.search.ask()
        except SpaceExhausted as e:
            raise nni.NoMoreTrialError(str(e)) from e
        self.issued[parameter_id] = dict(params)
        return params

    def receive_trial_result(self, parameter_id: int, parameters: Any, value: Any, **kwargs: Any) -> None:
        """File a final result under the parameters the trial echoed (NNI's record as a fallback).

        Example:
            >>> t = ParetoTuner()
            >>> t.update_search_space({"b": {"_type": "choice", "_value": [32, 8]}})
            >>> t.issued[3] = {"b": 32}  # NNI ran this result's trial with b=8 (issue 5726)
            >>> t.receive_trial_result(3, {"b": 32}, {"accuracy": 0.9, "latency_ratio": 0.4,
            ...                                       "nni_params": {"b": 8}})
            >>> t.search.finished[0].params, t.mismatches
            ({'b': 8}, 1)
        """
        if self.search is None:
            raise ConfigError("ParetoTuner got a result before a search space")
        echoed = value.get(ECHO_KEY) if isinstance(value, Mapping) else None
        if echoed is None:
            if parameter_id >= 0:
                _log.warning("result of parameter %s echoes no %r; trusting NNI's parameters (wrong under "
                             "NNI issue 5726 when trials run concurrently)", parameter_id, ECHO_KEY)
            echoed = parameters
        issued = self.issued.pop(parameter_id, None)
        try:
            ran = self.search.space.project(echoed)
            if not self.search.space.contains(ran):
                raise ConfigError(f"{ran} is outside the search space")
        except ConfigError as e:
            # a crash here would kill NNI's dispatcher and with it the whole experiment
            _log.warning("result of parameter %s not used: %s", parameter_id, e)
            return
        if issued is not None and self.search.space.key_of(issued) != self.search.space.key_of(ran):
            self.mismatches += 1
            _log.warning("parameter %s was issued as %s but its trial ran %s (NNI issue 5726); filing the "
                         "result under what ran", parameter_id, issued, ran)
        self.search.tell(ran, _number(value, self.value), _number(value, self.cost))

    def trial_end(self, parameter_id: int, success: bool, **kwargs: Any) -> None:
        """Nothing to undo: a failed point stays proposed (never retried) and is simply not ranked.

        NNI may name the wrong parameter_id here (issue 5726), so nothing keyed by it is touched.

        Example:
            >>> ParetoTuner().trial_end(7, False)
        """
        if not success:
            _log.info("trial of parameter %s ended without success", parameter_id)

    def import_data(self, data: list[Mapping[str, Any]]) -> None:
        """Replay finished trials ({"parameter": ..., "value": ...}) when an experiment resumes.

        Example:
            >>> t = ParetoTuner()
            >>> t.update_search_space({"b": {"_type": "choice", "_value": [32, 8]}})
            >>> t.import_data([{"parameter": {"b": 8}, "value": {"accuracy": 0.9, "latency_ratio": 0.5}}])
            >>> len(t.search.finished)
            1
        """
        if self.search is None:
            raise ConfigError("ParetoTuner got data to import before a search space")
        for record in data:
            value = nni.load(record["value"]) if isinstance(record["value"], str) else record["value"]
            self.receive_trial_result(-1, record["parameter"], value)  # -1: no parameter_id to check


def _number(result: Any, column: str) -> float:
    # a trial that reported a bare number (not this project's trial) has no cost column: unranked
    if column == "quality" and isinstance(result, Mapping) and result.get("accuracy") is not None:
        return _number({"quality": row_quality(result)}, column)
    if not isinstance(result, Mapping) or result.get(column) is None:
        return math.nan
    try:
        return float(result[column])
    except (TypeError, ValueError):
        return math.nan
