"""Pareto fronts (maximize quality, minimize a cost) and their 2-D hypervolume.

The value is a row's quality (`sparta_explore.quality`): its accuracy, or for a metric to
minimize (a perplexity) the dense model's value over the row's, so one front serves both.
The latency-guided front is non-dominated on measured latency; the FLOPs-guided front is
non-dominated on effective FLOPs, i.e. what a search that trusts FLOPs would keep. Both
are judged on measured latency: the hypervolume of each front's (latency, quality)
points against one reference point says how much of the latency/quality plane it covers.

Example:
    >>> pts = pd.DataFrame({"latency_ms": [1.0, 2.0, 3.0, 2.5], "accuracy": [0.5, 0.8, 0.9, 0.7]})
    >>> pareto_front(pts)["latency_ms"].tolist()
    [1.0, 2.0, 3.0]
    >>> hypervolume(pts["latency_ms"], pts["accuracy"], ref=(4.0, 0.0))
    2.2
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from sparta_explore.errors import ConfigError
from sparta_explore.quality import quality_column

GUIDE_COST = {"latency": "latency_ms", "flops": "effective_flops"}


def non_dominated(cost: Sequence[float], value: Sequence[float]) -> np.ndarray:
    """Boolean mask of the points no other point dominates (cost <= and value >=, one strictly).

    Equal points do not dominate each other, so both stay; NaN points are never on the front.

    Example:
        >>> non_dominated([1, 2, 2, 3], [0.5, 0.9, 0.8, 0.9]).tolist()
        [True, True, False, False]
    """
    c = np.asarray(cost, dtype=float)
    v = np.asarray(value, dtype=float)
    if c.shape != v.shape or c.ndim != 1:
        raise ConfigError(f"cost and value must be 1-D and of one length, got {c.shape} and {v.shape}")
    ok = np.isfinite(c) & np.isfinite(v)
    no_worse = (c[None, :] <= c[:, None]) & (v[None, :] >= v[:, None])  # [i, j]: j is no worse than i
    better = (c[None, :] < c[:, None]) | (v[None, :] > v[:, None])
    dominated = (no_worse & better & ok[None, :]).any(axis=1)
    return ok & ~dominated


def with_quality(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with its `quality` column filled in (`quality_column`) wherever a row has none.

    Example:
        >>> with_quality(pd.DataFrame({"accuracy": [30.0], "higher_is_better": [False],
        ...                            "dense_accuracy": [15.0]}))["quality"].tolist()
        [0.5]
    """
    if "accuracy" not in df.columns:
        return df
    return df.assign(quality=quality_column(df))


def pareto_front(df: pd.DataFrame, cost: str = "latency_ms", value: str = "quality") -> pd.DataFrame:
    """The rows of `df` on the front (minimize `cost`, maximize `value`), by ascending cost.

    The default value, quality, is computed from the metric columns where `df` has none.

    Example:
        >>> df = pd.DataFrame({"latency_ms": [3.0, 1.0], "accuracy": [0.9, 0.95]})
        >>> pareto_front(df)["latency_ms"].tolist()
        [1.0]
    """
    if value == "quality":
        df = with_quality(df)
    for column in (cost, value):
        if column not in df.columns:
            raise ConfigError(f"no column {column!r} in the results (have {', '.join(map(str, df.columns))})")
    if df.empty:
        return df.copy()
    mask = non_dominated(df[cost].to_numpy(float), df[value].to_numpy(float))
    return df[mask].sort_values([cost, value], ascending=[True, False], kind="stable")


def machines_of(df: pd.DataFrame) -> list[str]:
    """The distinct measuring machines (`sparta_explore.machine` keys) of the rows; rows without one add none.

    Example:
        >>> machines_of(pd.DataFrame({"machine": ["a", "b", "a", None]}))
        ['a', 'b']
    """
    if "machine" not in df.columns:
        return []
    return sorted({str(m) for m in df["machine"].dropna() if str(m)})


def check_one_machine(df: pd.DataFrame, *, mix_machines: bool = False) -> None:
    """Refuse rows measured on several machines (their latencies do not compare) unless `mix_machines`.

    Example:
        >>> check_one_machine(pd.DataFrame({"machine": ["a", "b"]}))
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: the rows were measured on 2 machines (a, b): a front of latencies ...
    """
    machines = machines_of(df)
    if len(machines) > 1 and not mix_machines:
        raise ConfigError(f"the rows were measured on {len(machines)} machines ({', '.join(machines)}): a front of "
                          "latencies from different machines compares the machines, not the models; select one "
                          "machine's rows, or pass mix_machines=True")


def guided_front(df: pd.DataFrame, guide: str, value: str = "quality", *,
                 mix_machines: bool = False) -> pd.DataFrame:
    """The front a `guide`-guided search keeps: "latency" (measured) or "flops" (effective FLOPs).

    Rows come back by ascending measured latency, ready to plot on the latency axis. Rows
    from several machines are refused unless `mix_machines` (see `check_one_machine`).

    Example:
        >>> df = pd.DataFrame({"latency_ms": [1.0, 2.0], "effective_flops": [9, 5], "accuracy": [0.9, 0.9]})
        >>> guided_front(df, "latency")["latency_ms"].tolist(), guided_front(df, "flops")["latency_ms"].tolist()
        ([1.0], [2.0])
    """
    if guide not in GUIDE_COST:
        raise ConfigError(f"guide must be one of {sorted(GUIDE_COST)}, got {guide!r}")
    check_one_machine(df, mix_machines=mix_machines)
    front = pareto_front(df, GUIDE_COST[guide], value)
    return front.sort_values(["latency_ms", value], ascending=[True, False], kind="stable")


def hypervolume(cost: Sequence[float], value: Sequence[float], ref: tuple[float, float]) -> float:
    """Area dominated by the points and bounded by `ref` = (worst cost, worst value).

    Points at or beyond the reference (cost >= ref cost or value <= ref value) add nothing.

    Example:
        >>> hypervolume([1.0], [0.5], ref=(3.0, 0.0))
        1.0
        >>> hypervolume([1.0, 2.0], [0.5, 1.0], ref=(3.0, 0.0))
        1.5
    """
    ref_cost, ref_value = (float(r) for r in ref)
    c = np.asarray(cost, dtype=float)
    v = np.asarray(value, dtype=float)
    inside = np.isfinite(c) & np.isfinite(v) & (c < ref_cost) & (v > ref_value)
    c, v = c[inside], v[inside]
    if c.size == 0:
        return 0.0
    front = non_dominated(c, v)
    c, v = c[front], v[front]
    order = np.lexsort((-v, c))
    c, v = c[order], v[order]
    area, best = 0.0, ref_value
    edges = np.append(c, ref_cost)
    for i in range(len(c)):
        # along the front value rises with cost; each point owns the strip up to the next point
        best = max(best, v[i])
        area += (edges[i + 1] - edges[i]) * (best - ref_value)
    return float(area)


def reference_point(df: pd.DataFrame) -> tuple[float, float]:
    """The default reference: (the dense model's median latency, quality 0).

    Against it, hypervolume counts only trials that beat dense PyTorch's measured latency.

    Example:
        >>> reference_point(pd.DataFrame({"dense_latency_ms": [10.0, 12.0, 11.0]}))
        (11.0, 0.0)
    """
    if "dense_latency_ms" not in df.columns or df["dense_latency_ms"].dropna().empty:
        raise ConfigError("results have no dense_latency_ms to set the hypervolume reference")
    return float(df["dense_latency_ms"].median()), 0.0


def front_hypervolume(df: pd.DataFrame, guide: str, ref: tuple[float, float] | None = None, *,
                      mix_machines: bool = False) -> float:
    """Hypervolume, on measured latency and quality, of the `guide`-guided front.

    Example:
        >>> df = pd.DataFrame({"latency_ms": [1.0, 2.0], "effective_flops": [9, 5], "accuracy": [0.9, 0.9],
        ...                    "dense_latency_ms": [3.0, 3.0]})
        >>> round(front_hypervolume(df, "latency"), 6), round(front_hypervolume(df, "flops"), 6)
        (1.8, 0.9)
    """
    front = guided_front(df, guide, mix_machines=mix_machines)
    return hypervolume(front["latency_ms"], front["quality"], ref or reference_point(df))
