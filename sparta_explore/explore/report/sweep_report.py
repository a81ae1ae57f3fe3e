"""A short markdown report of a results table: the best model per objective, the fronts, FLOPs vs clock.

A line naming where the project's own benchmark pages live (`BENCHMARK_PAGES`), then per
workload: setup and dense baseline; the pick of every registered objective at the target
(latency-guided and FLOPs-guided picks side by side, both on measured latency); the two
fronts' hypervolumes; where FLOPs mislead (rank correlation of FLOPs and latency, the
trials furthest from what FLOPs predict); the figures; every trial.

Example:
    >>> text = render_report(load_results("results/demo"))  # doctest: +SKIP
    >>> write_report(load_results("results/demo"), "results/demo/report.md")  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sparta_explore.cache import atomic_write
from sparta_explore.errors import ConfigError
from sparta_explore.explore.report.pareto import front_hypervolume, guided_front, reference_point
from sparta_explore.explore.report.plots import higher_is_better, metric_label, pattern_label, result_groups
from sparta_explore.explore.trial.objectives import get_objective, objective_names

# this report holds one sweep's numbers; the project's own measured figures (kernels, whole models, peers) are
# kept in the repository, which a report written anywhere else can name only by path
BENCHMARK_PAGES = ("Benchmark pages: docs/benchmarks/ in the sparta-explore repository "
                   "(benchmarks/README.md indexes them).")
TABLE_COLUMNS = ("pattern", "sparsity", "bits", "accuracy", "latency_ms", "speedup", "flops_ratio",
                 "sparsity_propagated", "mean_bits", "kernel_choices")


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    return str(value).replace("|", "\\|")


def markdown_table(df: pd.DataFrame, columns: Sequence[str] | None = None) -> str:
    """`df` (or its `columns`) as a GitHub markdown table; floats to 4 significant digits.

    Example:
        >>> print(markdown_table(pd.DataFrame({"a": [1, 2], "b": [0.123456, float("nan")]})))
        | a | b |
        |---|---|
        | 1 | 0.1235 |
        | 2 |  |
    """
    cols = list(columns) if columns is not None else list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, row in df[cols].iterrows():
        lines.append("| " + " | ".join(_fmt(row[c]) for c in cols) + " |")
    return "\n".join(lines)


def objective_picks(df: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per registered objective, the trial it scores highest at `target`, with how it really measured.

    `meets_latency_target` is judged on measured latency for every objective, so a
    FLOPs-guided pick that misses the latency target shows it.

    Example:
        >>> df = pd.DataFrame({"accuracy": [0.9, 0.95], "latency_ms": [4.0, 8.0], "dense_latency_ms": [10.0, 10.0],
        ...                    "effective_flops": [6.0, 4.0], "dense_flops": [10.0, 10.0], "pruner": "block",
        ...                    "block": "32x32", "sparsity": [0.5, 0.6], "bits": 32})
        >>> objective_picks(df, 0.5).set_index("objective").loc[["latency", "flops"], "latency_ms"].tolist()
        [4.0, 8.0]
    """
    rows = []
    for name in objective_names():
        obj = get_objective(name)
        scores = df.apply(lambda r, o=obj: o.score(r, target), axis=1)
        best = df.loc[scores.idxmax()]
        rows.append({"objective": name, "guide": obj.guide, "pattern": pattern_label(best),
                     "sparsity": best["sparsity"], "bits": best["bits"], "score": float(scores.max()),
                     "accuracy": best["accuracy"], "latency_ms": best["latency_ms"],
                     "latency_ratio": best["latency_ms"] / best["dense_latency_ms"],
                     "flops_ratio": best["effective_flops"] / best["dense_flops"],
                     "meets_latency_target": bool(best["latency_ms"] <= target * best["dense_latency_ms"])})
    return pd.DataFrame(rows)


def _misleading(df: pd.DataFrame) -> tuple[float, pd.DataFrame]:
    # Spearman on ranks: does ordering by FLOPs order by latency? 1.0 would mean FLOPs never mislead
    rho = float(df["effective_flops"].rank().corr(df["latency_ms"].rank())) if len(df) > 2 else math.nan
    predicted = df["dense_latency_ms"] * df["effective_flops"] / df["dense_flops"]
    worst = df.assign(pattern=df.apply(pattern_label, axis=1), flops_predicted_ms=predicted,
                      measured_over_predicted=df["latency_ms"] / predicted)
    return rho, worst.sort_values("measured_over_predicted", ascending=False).head(3)


def _section(df: pd.DataFrame, target: float, images: Sequence[str]) -> list[str]:
    ref = reference_point(df)
    metric = metric_label(df)
    dense_acc = float(df["dense_accuracy"].median())
    model, batch = df["workload"].iloc[0], int(df["batch"].iloc[0])
    threads = int(df["threads"].median()) if "threads" in df.columns else "?"
    spread = (f" Dense latency across trials: {df['dense_latency_ms'].min():.3f} to "
              f"{df['dense_latency_ms'].max():.3f} ms (machine load; each trial's speedup is against its own "
              "dense run, timed alternately with it)." if len(df) > 1 else "")
    out = [f"## {model}, latency batch {batch}", "",
           f"{len(df)} trials; {threads} threads on {_where(df)}. Dense PyTorch: "
           f"{ref[0]:.3f} ms median, {metric} {dense_acc:.4f}, {float(df['dense_flops'].median()) / 1e9:.3f} GFLOPs. "
           f"Target: {target:g} x the dense cost ({target * ref[0]:.3f} ms).{spread}", "",
           "### Best trial per objective", "",
           "Latency-guided objectives limit measured latency; FLOPs-guided ones limit effective FLOPs. "
           "Every pick is shown with the latency it measured.", ""]
    picks = objective_picks(df, target)
    out += [markdown_table(picks), ""]
    by = picks.set_index("objective")
    if {"latency", "flops"} <= set(by.index):
        lat, flo = by.loc["latency"], by.loc["flops"]
        out += [f"Under the {target:g} x target, the latency-guided pick {_pick(lat, metric)}; the FLOPs-guided pick "
                f"{_pick(flo, metric)}.", ""]
    hv_lat, hv_flo = front_hypervolume(df, "latency", ref), front_hypervolume(df, "flops", ref)
    box = ref[0] * (1.0 - ref[1])
    lower = "" if higher_is_better(df) else (f" {metric} is lower-is-better: fronts and hypervolumes are on quality, "
                                             f"the dense {metric} over the trial's (1.0 at the dense model, 0.5 at "
                                             f"twice its {metric}).")
    out += [f"### Pareto fronts ({metric} vs measured latency)", "",
            f"Reference point: ({ref[0]:.3f} ms, {metric if lower == '' else 'quality'} {ref[1]:g}); only "
            f"trials faster than dense count.{lower}", "",
            markdown_table(pd.DataFrame([
                {"front": "latency-guided", "trials": len(guided_front(df, "latency")), "hypervolume": hv_lat,
                 "share of box": hv_lat / box if box else math.nan},
                {"front": "FLOPs-guided", "trials": len(guided_front(df, "flops")), "hypervolume": hv_flo,
                 "share of box": hv_flo / box if box else math.nan}])), "",
            "FLOPs cannot tell apart trials of equal FLOPs and accuracy (e.g. fp32 and int8 of one pattern): "
            "all of them stay on the FLOPs-guided front, which flatters its hypervolume.", ""]
    rho, worst = _misleading(df)
    out += ["### Where FLOPs mislead", "",
            f"Rank correlation of effective FLOPs with measured latency: {rho:.2f} (1 = FLOPs order the trials "
            "as the clock does). Trials slowest relative to what their FLOPs predict:", "",
            markdown_table(worst, ["pattern", "sparsity", "bits", "flops_ratio", "flops_predicted_ms", "latency_ms",
                                   "measured_over_predicted"]), ""]
    if images:
        out += ["### Figures", ""] + [f"![{Path(i).stem}]({i})" for i in images] + [""]
    table = df.assign(pattern=df.apply(pattern_label, axis=1)).sort_values("latency_ms")
    out += ["### All trials (by measured latency)", "",
            markdown_table(table, [c for c in TABLE_COLUMNS if c in table.columns]), ""]
    return out


def _pick(p: pd.Series, metric: str) -> str:
    met = "meets" if p["meets_latency_target"] else "misses"
    return (f"({p['pattern']}, sparsity {p['sparsity']:g}, {int(p['bits'])} bits) reaches {metric} "
            f"{p['accuracy']:.4f} at {p['latency_ms']:.3f} ms ({p['latency_ratio']:.2f} x dense: {met} the "
            "latency target)")


def _where(df: pd.DataFrame) -> str:
    # the machine the rows record (rows from before the machine columns: this one's CPU)
    if "cpu_model" in df.columns and df["cpu_model"].notna().any() and str(df["cpu_model"].dropna().iloc[0]):
        row = df.dropna(subset=["cpu_model"]).iloc[0]
        return f"{row['cpu_model']} ({row.get('cpu_flags', '')}, machine {row.get('machine', '?')})"
    from sparta_explore.device import cpu_model

    return f"{platform.machine()} ({cpu_model()})"


def _intro(df: pd.DataFrame) -> str:
    # the metric and its data are the workload's own: digits accuracy is only the built-in case
    workloads = ", ".join(sorted(str(w) for w in df["workload"].dropna().unique()))
    return ("Latency is measured on the machine each section names (compiled kernels vs dense PyTorch, timed "
            f"alternately); {metric_label(df)} is the compiled model's, as each workload ({workloads}) scores "
            "it on its own held-out data.")


def render_report(df: pd.DataFrame, *, target: float | None = None, images: Sequence[str] = ()) -> str:
    """The markdown report of `df`; `target` defaults to the rows' own; `images` are linked as given.

    Example:
        >>> render_report(pd.DataFrame())
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: no results to report
    """
    if df.empty:
        raise ConfigError("no results to report")
    target = float(target if target is not None else df["target"].median())
    lines = ["# sparta-explore results", "", _intro(df), "", BENCHMARK_PAGES, ""]
    for suffix, rows in result_groups(df):
        own = [i for i in images if Path(i).stem.endswith(suffix)] if suffix else list(images)
        lines += _section(rows, target, own)
    return "\n".join(lines)


def write_report(df: pd.DataFrame, path: str | os.PathLike, *, target: float | None = None,
                 images: Sequence[str | os.PathLike] = ()) -> Path:
    """Write `render_report(df)` to `path`; images are linked relative to the report's folder.

    Example:
        >>> write_report(load_results("results/demo"), "results/demo/report.md")  # doctest: +SKIP
    """
    path = Path(path)
    rel = [os.path.relpath(Path(i), path.parent) for i in images]
    return atomic_write(path, lambda f: f.write(render_report(df, target=target, images=rel).encode()))
