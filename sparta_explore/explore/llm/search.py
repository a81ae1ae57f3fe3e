"""The LLM search loop without NNI: `ParetoTPE` proposes points of the LLM space, trials measure them.

`llm_search(workload, trials=24, guide="latency")` asks the seeded `ParetoTPE` for a point,
reads its row from the `TrialLog` when that point ran before (this search's or another's: the
log is shared and keyed by point), else runs the trial and appends the row, and tells the
search (quality, the guide's ratio). Guides: ``latency`` (measured decode ms over the dense
model's, same trial), ``flops`` and ``bytes`` (the cost models); every row carries all three, so a
front is judged on measured latency whatever guided it. A failed trial is logged with its error
and told as NaN quality. Stopping and starting again with the same log replays the finished rows
and continues.

The first trials are the `anchors` (default: the model as given, uncompressed, at each activation
width the space offers): every search starts from the reference it should beat, and its front
holds it when nothing it found is better. Rows say ``anchor`` True for them.

Example:
    >>> rows = llm_search(smollm2_tiny_workload(), trials=2, bands=1, log="results/llm/tiny.jsonl")  # doctest: +SKIP
    >>> rows[["quality", "latency_ratio"]]  # doctest: +SKIP
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from sparta_explore.errors import ConfigError, SpartaError
from sparta_explore.explore.llm.prefix import CalibrationCache
from sparta_explore.explore.llm.space import LLMPoint, search_space
from sparta_explore.explore.llm.trial import TrialBudget, TrialLog, run_llm_trial
from sparta_explore.explore.search.dimensions import Space
from sparta_explore.explore.search.pareto_tpe import ParetoTPE, SearchConfig
from sparta_explore.workload import Workload

GUIDES = {"latency": "latency_ratio", "flops": "flops_ratio", "bytes": "bytes_ratio"}


def failed_row(point: LLMPoint, workload: Workload, error: BaseException) -> dict[str, Any]:
    """The row of a trial that raised: its point, the error, no measures.

    Example:
        >>> failed_row(LLMPoint.from_dict({}, layers=2, bands=1), w, ValueError("x"))["error"]  # doctest: +SKIP
        'ValueError: x'
    """
    return {"key": point.key(), **point.canonical().to_dict(), "bands": point.bands, "workload": workload.name,
            "error": f"{type(error).__name__}: {error}", "accuracy": math.nan, "quality": math.nan}


def _number(row: Mapping[str, Any], column: str) -> float:
    value = row.get(column)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.nan


def default_anchors(space: Mapping[str, Any], bands: int) -> list[dict[str, Any]]:
    """The uncompressed model at each `act_bits` of `space`, where the space holds it.

    Example:
        >>> [a["act_bits"] for a in default_anchors(search_space(1), 1)]
        [32, 8]
    """
    parsed = Space.from_nni(space)
    points = [LLMPoint.from_dict({"act_bits": bits}, layers=bands, bands=bands).to_dict()
              for bits in space.get("act_bits", {}).get("_value", [])]
    return [p for p in points if parsed.contains(p)]


def llm_search(workload: Workload, *, trials: int, log: str | Path, guide: str = "latency", seed: int = 0,
               bands: int = 3, space: Mapping[str, Any] | None = None, startup: int = 8,
               anchors: list[Mapping[str, Any]] | None = None, budget: TrialBudget = TrialBudget(),
               echo: Callable[[str], None] | None = None, cache: CalibrationCache | None = None) -> pd.DataFrame:
    """`trials` points of `space` (default `search_space(bands)`) chosen by a `guide`-guided ParetoTPE; one
    row per trial in search order (see the module docstring). `cache`: calibration prefixes shared between
    trials (None: one for this search; pass one to share it with other searches).

    Example:
        >>> llm_search(w, trials=24, log="results/llm/trials.jsonl", guide="flops", seed=1)  # doctest: +SKIP
    """
    if guide not in GUIDES:
        raise ConfigError(f"llm_search: guide must be one of {', '.join(GUIDES)}, got {guide!r}")
    if trials < 1:
        raise ConfigError(f"llm_search: trials must be >= 1, got {trials}")
    space = dict(space if space is not None else search_space(bands))
    layers = len(workload.dense_model().model.layers)
    tpe = ParetoTPE(Space.from_nni(space), SearchConfig(startup=startup, seed=seed))
    trial_log = TrialLog(log, machine=budget.machine)  # timings are this machine's
    cache = CalibrationCache() if cache is None else cache
    dense_ppl = None
    rows = []
    anchors = list(default_anchors(space, bands) if anchors is None else anchors)
    for n in range(trials):
        params = dict(anchors[n]) if n < len(anchors) else tpe.ask()
        point = LLMPoint.from_dict(params, layers=layers, bands=bands)
        row = trial_log.get(point)
        if row is None:
            if dense_ppl is None:
                dense_ppl = workload.evaluate(workload.dense_model())
            try:
                row = run_llm_trial(point, workload, budget, dense_perplexity=dense_ppl, cache=cache)
            except (SpartaError, RuntimeError, ValueError) as error:  # a point the compressors cannot make
                traceback.print_exc()
                row = failed_row(point, workload, error)
            trial_log.add(row)
            how = "ran"
        else:
            how = "logged"
        tpe.tell(params, _number(row, "quality"), _number(row, GUIDES[guide]))
        rows.append({**row, "search": guide, "seed": seed, "trial": n, "anchor": n < len(anchors)})
        if echo is not None:
            echo(f"trial {n + 1}/{trials} ({how}): perplexity {_number(row, 'perplexity'):.3f}, "
                 f"{_number(row, 'decode_tok_s'):.1f} tok/s, latency ratio {_number(row, 'latency_ratio'):.3f}")
    return pd.DataFrame(rows)
