"""LLM searches judged on measured decode latency, whatever guided them: fronts, hypervolume, speed-up at equal quality.

A search guided by a cost (``latency``: measured decode ms over the model as given;
``flops`` / ``bytes``: the cost models) keeps as its front the trials no other of its trials
beats on quality and that cost (`guided_front`): what it would hand a user. Every front is then
judged on the latency measured in its trials (``latency_ratio``, timed in turns with the model
as given, so trials' ratios compare across the machine's slow spells):

* `front_hypervolume`: the area the front dominates in (latency ratio, quality) up to the
  reference (1.0: the model as given; quality 0), so only points faster than the model as
  given count;
* `speedup_at_equal_perplexity`: for each point of the other front, how much faster the best
  point of this front is at a perplexity at most `tolerance` above it; the best such ratio.

Example:
    >>> rows = pd.DataFrame({"search": ["latency"] * 2, "quality": [1.0, 0.9], "latency_ratio": [0.9, 0.6],
    ...                      "flops_ratio": [1.0, 0.5], "perplexity": [15.0, 16.7]})
    >>> round(front_hypervolume(guided_front(rows, "latency")), 3)
    0.37
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sparta_explore.errors import ConfigError
from sparta_explore.explore.llm.search import GUIDES
from sparta_explore.explore.report.pareto import hypervolume, non_dominated

REFERENCE = (1.0, 0.0)  # (latency ratio of the model as given, quality 0)


def guided_front(rows: pd.DataFrame, guide: str) -> pd.DataFrame:
    """The trials of `rows` no other beats on quality and the `guide`'s cost (ties: the first kept), fastest first.

    Example:
        >>> guided_front(pd.DataFrame({"quality": [1.0, 1.0], "flops_ratio": [1.0, 1.0],
        ...                            "latency_ratio": [1.0, 0.8]}), "flops").latency_ratio.tolist()
        [1.0]
    """
    if guide not in GUIDES:
        raise ConfigError(f"guide must be one of {', '.join(GUIDES)}, got {guide!r}")
    cost = GUIDES[guide]
    ok = rows.dropna(subset=["quality", cost, "latency_ratio"]).drop_duplicates(subset=None if "key" not in rows
                                                                                 else ["key"])
    if ok.empty:
        return ok
    keep = non_dominated(ok[cost].to_numpy(float), ok["quality"].to_numpy(float))
    front = ok.iloc[np.flatnonzero(keep)]
    # equal cost and quality: the guide cannot tell them apart; it keeps the one it saw first
    front = front.drop_duplicates(subset=[cost, "quality"], keep="first")
    return front.sort_values("latency_ratio", kind="stable")


def front_hypervolume(front: pd.DataFrame, ref: tuple[float, float] = REFERENCE) -> float:
    """Hypervolume of `front` on measured latency ratio and quality (see the module docstring).

    Example:
        >>> front_hypervolume(pd.DataFrame({"latency_ratio": [0.5], "quality": [0.8]}))
        0.4
    """
    if front.empty:
        return 0.0
    return hypervolume(front["latency_ratio"], front["quality"], ref)


def speedup_at_equal_perplexity(front: pd.DataFrame, other: pd.DataFrame, tolerance: float = 0.02
                                ) -> tuple[float, pd.Series | None, pd.Series | None]:
    """(best speed-up, our point, their point): over `other`'s points, their latency ratio over that of our fastest
    point with perplexity at most (1 + `tolerance`) x theirs. (nan, None, None) when no pair qualifies.

    Example:
        >>> ours = pd.DataFrame({"perplexity": [15.2], "latency_ratio": [0.6]})
        >>> theirs = pd.DataFrame({"perplexity": [15.0], "latency_ratio": [0.9]})
        >>> round(speedup_at_equal_perplexity(ours, theirs)[0], 3)
        1.5
    """
    best, pair = math.nan, (None, None)
    for _, theirs in other.iterrows():
        near = front[front["perplexity"] <= (1 + tolerance) * theirs["perplexity"]]
        if near.empty:
            continue
        ours = near.loc[near["latency_ratio"].idxmin()]
        ratio = float(theirs["latency_ratio"] / ours["latency_ratio"])
        if not ratio <= best:
            best, pair = ratio, (ours, theirs)
    return best, pair[0], pair[1]
