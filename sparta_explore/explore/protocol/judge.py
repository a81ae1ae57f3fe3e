"""Judge a protocol run on what the user gets: measured latency and accuracy, per search and seed.

For each (seed, search), from the trials that search made (`protocol.load_protocol`):

* **hypervolume** of the front the search *keeps* (non-dominated on accuracy and its own
  cost: measured latency ratio, or FLOPs ratio) on (measured latency / dense, accuracy),
  against one reference point per workload, (1.0, median dense accuracy - 0.10): the area
  of useful trade-offs that beat dense PyTorch;
* **pick**: the model the search would hand over: the most accurate trial whose *own*
  cost is at most `target` (its predicted latency ratio) and whose accuracy is above the
  reference's, with its measured latency ratio beside it, and whether that meets the target;
* **speedup at equal accuracy**: the FLOPs-guided pick's measured latency over the
  fastest trial of this search at most 0.5 points less accurate than that pick.

`summarize` gives mean, standard deviation and range over seeds; `goal_checks` the
issue's goals (latency-guided hypervolume higher in every seed; >= 1.3x at equal accuracy).
"Accuracy" here is a row's quality (`sparta_explore.quality`): the workload's metric, or for a
metric to minimize (a perplexity) the dense model's value over the row's, so 0.5 points are
a perplexity 0.5% of the dense one higher.

Example:
    >>> j = judge(load_protocol("results/latency_vs_flops/digits-ffn/<machine>"), target=0.25)  # doctest: +SKIP
    >>> summarize(j)                                                                           # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sparta_explore.errors import ConfigError
from sparta_explore.explore.report.pareto import check_one_machine, hypervolume, non_dominated, with_quality
from sparta_explore.explore.search.searches import RATIO
from sparta_explore.quality import quality_column

REF_ACCURACY_DROP = 0.10
EQUAL_ACCURACY = 0.005  # "equal accuracy": within half a point
SPEEDUP_GOAL = 1.3
GUIDES = {"latency": "latency", "flops": "flops", "tpe-latency": "latency", "tpe-flops": "flops"}
METRICS = ("hypervolume", "pick_accuracy", "pick_predicted", "pick_latency", "speedup_vs_flops_pick")


def reference(df: pd.DataFrame) -> tuple[float, float]:
    """The one reference point of a workload's run: (latency ratio 1.0, median dense quality - 0.10).

    The dense quality is the dense accuracy, or 1.0 for a metric to minimize (`sparta_explore.quality`).

    Example:
        >>> reference(pd.DataFrame({"dense_accuracy": [0.98, 0.97, 0.98]}))
        (1.0, 0.88)
    """
    dense = dense_quality(df)
    if len(dense) == 0:
        raise ConfigError("the protocol's rows have no dense_accuracy: no trial finished")
    return 1.0, round(float(dense.median()) - REF_ACCURACY_DROP, 4)


def dense_quality(df: pd.DataFrame) -> pd.Series:
    """Each finished row's dense model as a quality (its `dense_accuracy` as the row's metric).

    Example:
        >>> dense_quality(pd.DataFrame({"dense_accuracy": [15.0], "higher_is_better": [False]})).tolist()
        [1.0]
    """
    if "dense_accuracy" not in df:
        return pd.Series([], dtype=float)
    dense = pd.to_numeric(df["dense_accuracy"], errors="coerce")
    as_rows = df.assign(accuracy=dense).drop(columns=["quality"], errors="ignore")
    return quality_column(as_rows)[dense.notna()]


def kept_front(rows: pd.DataFrame, guide: str) -> pd.DataFrame:
    """The trials a search guided by `guide` keeps: non-dominated on (its cost ratio, quality).

    Example:
        >>> rows = pd.DataFrame({"accuracy": [0.9, 0.8, 0.95], "latency_ratio": [0.5, 0.3, 0.9],
        ...                      "flops_ratio": [0.2, 0.4, 0.3]})
        >>> kept_front(rows, "flops")["accuracy"].tolist(), kept_front(rows, "latency")["accuracy"].tolist()
        ([0.9, 0.95], [0.8, 0.9, 0.95])
    """
    ok = with_quality(rows.dropna(subset=["accuracy", RATIO[guide], "latency_ratio"]))
    if ok.empty:
        return ok
    keep = non_dominated(ok[RATIO[guide]].to_numpy(float), ok["quality"].to_numpy(float))
    return ok[keep].sort_values(RATIO[guide])


def pick(rows: pd.DataFrame, guide: str, target: float, min_accuracy: float = -math.inf) -> pd.Series | None:
    """The best trial (highest quality) whose own cost (`guide` ratio) is at most `target`; None if none is.

    Only trials of quality above `min_accuracy` count (the judge passes the reference: a
    model at chance accuracy under the target is no pick anyone would ship).

    Example:
        >>> rows = pd.DataFrame({"accuracy": [0.9, 0.95], "latency_ratio": [0.2, 0.6], "flops_ratio": [0.1, 0.2]})
        >>> float(pick(rows, "flops", 0.25)["accuracy"]), float(pick(rows, "latency", 0.25)["accuracy"])
        (0.95, 0.9)
        >>> pick(rows, "latency", 0.25, min_accuracy=0.92) is None
        True
    """
    ok = with_quality(rows.dropna(subset=["accuracy", RATIO[guide], "latency_ratio"]))
    ok = ok[(ok[RATIO[guide]] <= target) & (ok["quality"] > min_accuracy)]
    if ok.empty:
        return None
    return ok.sort_values(["quality", RATIO[guide]], ascending=[False, True]).iloc[0]


def fastest_at(rows: pd.DataFrame, accuracy: float) -> float:
    """The lowest measured latency ratio among trials of quality at most `EQUAL_ACCURACY` below `accuracy`
    (a quality; NaN if none).

    Example:
        >>> fastest_at(pd.DataFrame({"accuracy": [0.9, 0.896, 0.8], "latency_ratio": [0.5, 0.3, 0.1]}), 0.9)
        0.3
    """
    ok = with_quality(rows.dropna(subset=["accuracy", "latency_ratio"]))
    ok = ok[ok["quality"] >= accuracy - EQUAL_ACCURACY - 1e-12]
    return float(ok["latency_ratio"].min()) if not ok.empty else math.nan


def judge(df: pd.DataFrame, target: float, ref: tuple[float, float] | None = None) -> pd.DataFrame:
    """One row per (seed, search) with the module docstring's measures.

    Example:
        >>> j = judge(load_protocol(out), target=0.25)  # doctest: +SKIP
    """
    check_one_machine(df)
    ref = ref or reference(df)
    out: list[dict[str, Any]] = []
    for seed, by_seed in df.groupby("seed", sort=True):
        flops_rows = by_seed[by_seed["search"] == "flops"]
        flops_pick = pick(flops_rows, "flops", target, ref[1]) if not flops_rows.empty else None
        for search, rows in by_seed.groupby("search", sort=False):
            guide = GUIDES.get(search, "latency")
            front = kept_front(rows, guide)
            chosen = pick(rows, guide, target, ref[1])
            record = {
                "seed": seed, "search": search, "guide": guide, "trials": len(rows),
                "failed": int(rows["accuracy"].isna().sum()),
                "hypervolume": hypervolume(front["latency_ratio"], front["quality"], ref) if len(front) else 0.0,
                "front_size": len(front),
                "pick_accuracy": math.nan if chosen is None else float(chosen["accuracy"]),
                "pick_predicted": math.nan if chosen is None else float(chosen[RATIO[guide]]),
                "pick_latency": math.nan if chosen is None else float(chosen["latency_ratio"]),
                "pick_meets_target": chosen is not None and float(chosen["latency_ratio"]) <= target,
                "pick_label": "" if chosen is None else describe(chosen),
                "speedup_vs_flops_pick": math.nan,
            }
            if flops_pick is not None:
                record["speedup_vs_flops_pick"] = float(flops_pick["latency_ratio"]) / fastest_at(
                    rows, float(flops_pick["quality"]))
            out.append(record)
    return pd.DataFrame(out)


def family_label(row: pd.Series | dict) -> str:
    """A results row's pruning family and precision, e.g. "2:4 w8a8" (act_bits empty or NaN = same as bits).

    Example:
        >>> family_label({"pruner": "level", "block": "", "bits": 4, "act_bits": 8.0})
        'unstructured w4a8'
    """
    from sparta_explore.explore.trial.families import pattern_of, precision_of

    act = row.get("act_bits")
    act = None if act is None or (isinstance(act, float) and math.isnan(act)) else int(act)
    precision = precision_of(int(row.get("bits", 32)), act)
    return f"{pattern_of({'pruner': row.get('pruner'), 'block': row.get('block')})} {precision}"


def describe(row: pd.Series) -> str:
    """A trial's setting in a few characters: family, precision, per-layer sparsities.

    Example:
        >>> describe(pd.Series({"pruner": "nm", "block": "1x4", "bits": 8, "act_bits": float("nan"),
        ...                     "layer_sparsity": "", "sparsity": 0.5}))
        '2:4 w8a8 0.5'
    """
    layers = str(row.get("layer_sparsity") or "")
    sparsity = "/".join(part.split(":")[-1] for part in layers.split(";")) if layers and layers != "nan" else \
        f"{float(row.get('sparsity', math.nan)):g}"
    return f"{family_label(row)} {sparsity}"


def summarize(judged: pd.DataFrame) -> pd.DataFrame:
    """Per search: mean, standard deviation, min and max over seeds of each measure in `METRICS`.

    Example:
        >>> j = pd.DataFrame({"search": ["a", "a"], "seed": [0, 1], **{m: [1.0, 3.0] for m in METRICS}})
        >>> s = summarize(j)["hypervolume"]
        >>> float(s.loc["a", "mean"]), round(float(s.loc["a", "std"]), 3)
        (2.0, 1.414)
    """
    order = list(dict.fromkeys(judged["search"]))
    stats = judged.groupby("search")[list(METRICS)].agg(["mean", "std", "min", "max"])
    return stats.loc[order]


def goal_checks(judged: pd.DataFrame) -> list[tuple[str, bool, str]]:
    """The issue's goals on this run: (goal, met, the figures behind it).

    Example:
        >>> j = pd.DataFrame({"seed": [0, 0], "search": ["latency", "flops"], "hypervolume": [0.3, 0.2],
        ...                   "speedup_vs_flops_pick": [1.5, 1.0]})
        >>> [met for _, met, _ in goal_checks(j)]
        [True, True]
    """
    missing = sorted({"latency", "flops"} - set(judged["search"]))
    if missing:
        return [("latency-guided vs FLOPs-guided", False, f"search {', '.join(missing)} has no trials yet")]
    by = judged.pivot(index="seed", columns="search")
    hv_l, hv_f = by[("hypervolume", "latency")], by[("hypervolume", "flops")]
    speed = by[("speedup_vs_flops_pick", "latency")]
    wins = int((hv_l > hv_f).sum())
    hv_text = ", ".join(f"seed {s}: {a:.4f} vs {b:.4f}" for s, a, b in zip(by.index, hv_l, hv_f))
    fast = int((speed >= SPEEDUP_GOAL).sum())
    speed_text = ", ".join(f"seed {s}: " + (f"{v:.2f}x" if np.isfinite(v) else "no trial that accurate")
                           for s, v in zip(by.index, speed))
    return [
        (f"latency-guided hypervolume higher than FLOPs-guided in every seed ({wins} of {len(by)})",
         wins == len(by), hv_text),
        (f"at equal accuracy (within {EQUAL_ACCURACY * 100:g} points) latency-guided best >= {SPEEDUP_GOAL}x "
         f"faster than the FLOPs-guided pick in every seed ({fast} of {len(by)})",
         fast == len(by) and bool(np.isfinite(speed).all()), speed_text),
    ]
