"""Matplotlib figures of a results table (Agg backend; files only, no windows).

* `plot_accuracy_latency`: every trial on measured latency vs accuracy, with the
  latency-guided front and the FLOPs-guided front (chosen on FLOPs, drawn at the latency
  they really measured, with the staircase of the best accuracy they reach within each
  latency: its area is the front's hypervolume; for a metric to minimize, a perplexity, the
  hypervolume is the area in quality, `sparta_explore.quality`) overlaid, the dense model,
  and the target.
* `plot_latency_flops`: measured latency vs effective FLOPs, each relative to the dense
  model (latency: the dense run timed alternately in the same trial), with the line FLOPs
  predict (y = x); trials far above it are where FLOPs mislead.

Results with several (model, batch) groups get one pair of figures per group.

Example:
    >>> paths = plot_results(load_results("results/demo"), "results/demo")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pandas as pd

from sparta_explore.errors import ConfigError
from sparta_explore.explore.report.pareto import (
    front_hypervolume,
    guided_front,
    machines_of,
    pareto_front,
    reference_point,
)
from sparta_explore.quality import as_bool

ACCURACY_LATENCY_PNG = "pareto_accuracy_latency.png"
LATENCY_FLOPS_PNG = "latency_vs_flops.png"
_MARKERS = {32: "o", 16: "D", 8: "s", 6: "P", 4: "^", 3: "v", 2: "X"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only: never open a window, work with no display
    import matplotlib.pyplot as plt

    return plt


def pattern_label(row: pd.Series | dict) -> str:
    """How a trial's pruning pattern reads in legends: pruner plus block ("block 32x32", "l1norm").

    Example:
        >>> pattern_label({"pruner": "block", "block": "1x32"}), pattern_label({"pruner": "l1norm", "block": None})
        ('block 1x32', 'l1norm')
    """
    block = row.get("block")
    block = "" if block is None or (isinstance(block, float) and pd.isna(block)) else str(block)
    return f"{row['pruner']} {block}".strip()


def _check(df: pd.DataFrame, columns: tuple[str, ...]) -> None:
    if df.empty:
        raise ConfigError("no results to plot")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(f"results lack the columns {missing} needed for this plot")


def _scatter_trials(ax: Any, df: pd.DataFrame, x: str, y: str) -> None:
    patterns = sorted({pattern_label(r) for _, r in df.iterrows()})
    colors = {p: f"C{i % 10}" for i, p in enumerate(patterns)}
    for (pattern, bits), group in df.groupby([df.apply(pattern_label, axis=1), df["bits"]], sort=True):
        label = f"{pattern}, {'fp32' if int(bits) == 32 else f'int{int(bits)}'}"
        ax.scatter(group[x], group[y], s=36, alpha=0.75, color=colors[pattern],
                   marker=_MARKERS.get(int(bits), "o"), label=label, zorder=3)


def plot_accuracy_latency(df: pd.DataFrame, path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Accuracy vs measured latency with both guided fronts; writes `path` (PNG) and returns it.

    Example:
        >>> plot_accuracy_latency(df, "results/demo/pareto_accuracy_latency.png")  # doctest: +SKIP
    """
    _check(df, ("latency_ms", "accuracy", "effective_flops", "dense_latency_ms", "dense_accuracy", "pruner", "bits"))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10.5, 5.5), dpi=110)
    _scatter_trials(ax, df, "latency_ms", "accuracy")
    ref = reference_point(df)
    styles = {"latency": dict(color="black", ls="-", lw=2.0, marker="o", label="latency-guided front"),
              "flops": dict(color="tab:red", ls="--", lw=1.6, marker="x", label="FLOPs-guided front")}
    for guide, style in styles.items():
        front = guided_front(df, guide)
        hv = front_hypervolume(df, guide, ref)
        marker = style.pop("marker")
        # the members, where they measured; then the best accuracy they reach within each latency
        # (the staircase whose area is the hypervolume)
        colors = {"facecolors": "none", "edgecolors": style["color"]} if marker == "o" else {"c": style["color"]}
        ax.scatter(front["latency_ms"], front["accuracy"], marker=marker, s=70, zorder=4, **colors)
        steps = pareto_front(front)
        ax.plot(steps["latency_ms"], steps["accuracy"], drawstyle="steps-post", zorder=4,
                **dict(style, label=f"{style['label']} ({len(front)} trials), HV {hv:.3g}"))
    dense_ms, dense_acc = ref[0], float(df["dense_accuracy"].median())
    ax.scatter([dense_ms], [dense_acc], marker="*", s=220, color="gold", edgecolor="black", zorder=5,
               label=f"dense PyTorch ({dense_ms:.2f} ms)")
    if "target" in df.columns and df["target"].notna().any():
        target = float(df["target"].median())
        ax.axvline(target * dense_ms, color="gray", ls=":", lw=1.2, label=f"latency target ({target:g} x dense)")
    label = metric_label(df)
    lower = "" if higher_is_better(df) else ", lower is better"
    return _finish(fig, ax, path, plt, "measured latency (ms, median)",
                   f"{label} (compiled model, held-out data{lower})", title or f"{label} vs measured latency")


def plot_latency_flops(df: pd.DataFrame, path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Measured latency vs effective FLOPs, both relative to dense, against the line FLOPs predict; writes `path`.

    Each trial's latency is divided by the dense latency timed alternately with it in the same
    trial, so a burst of machine load moves both and leaves the ratio (and this plot) alone.

    Example:
        >>> plot_latency_flops(df, "results/demo/latency_vs_flops.png")  # doctest: +SKIP
    """
    _check(df, ("latency_ms", "effective_flops", "dense_flops", "dense_latency_ms", "pruner", "bits"))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10.5, 5.5), dpi=110)
    plotted = df.assign(flops_x=df["effective_flops"] / df["dense_flops"],
                        latency_y=df["latency_ms"] / df["dense_latency_ms"])
    _scatter_trials(ax, plotted, "flops_x", "latency_y")
    ax.scatter([1.0], [1.0], marker="*", s=220, color="gold", edgecolor="black", zorder=5,
               label=f"dense PyTorch (median {float(df['dense_latency_ms'].median()):.2f} ms, "
                     f"{float(df['dense_flops'].median()) / 1e9:.3g} GFLOPs)")
    top = max(1.05, float(plotted["flops_x"].max()) * 1.05)
    ax.plot([0.0, top], [0.0, top], color="gray", ls="--", lw=1.2,
            label="what FLOPs predict (latency proportional to FLOPs)")
    ax.axhline(1.0, color="gray", ls=":", lw=1.0, label="as slow as dense")
    # the trials furthest from what FLOPs predict: FLOPs say they are fast, the clock disagrees
    excess = (plotted["latency_y"] / plotted["flops_x"].where(plotted["flops_x"] > 0)).dropna()
    for idx in excess.sort_values(ascending=False).index[:3]:
        row = plotted.loc[idx]
        ax.annotate(f"{excess[idx]:.1f}x FLOPs' estimate", (row["flops_x"], row["latency_y"]), fontsize=7,
                    xytext=(6, 6), textcoords="offset points")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, path, plt, "effective FLOPs / dense FLOPs (nonzero weights only)",
                   "measured latency / dense latency (same trial)", title or "measured latency vs effective FLOPs")


def _legend(ax: Any) -> None:
    # outside the axes: inside, it hides exactly the corner where the interesting trials sit
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, framealpha=0.9)


def _finish(fig: Any, ax: Any, path: str | os.PathLike, plt: Any, xlabel: str, ylabel: str, title: str) -> Path:
    """Labels, grid and legend shared by every plot, then the atomic save."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    _legend(ax)
    return _save(fig, path, plt)


def _save(fig: Any, path: str | os.PathLike, plt: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)  # a reader (the report, a browser) never sees half a PNG
    return path


def result_groups(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(suffix, rows) per (model, batch, machine) group; the suffix is "" when there is only one group.

    Rows measured on different machines never share a figure or a front: the machine key
    joins the suffix when the rows come from more than one.

    Example:
        >>> [s for s, _ in result_groups(pd.DataFrame({"workload": ["a", "b"], "batch": [1, 1]}))]
        ['-a-b1', '-b-b1']
        >>> two = pd.DataFrame({"workload": ["a", "a"], "batch": [1, 1], "machine": ["m1", "m2"]})
        >>> [s for s, _ in result_groups(two)]
        ['-a-b1-m1', '-a-b1-m2']
    """
    if df.empty:
        return []
    several = len(machines_of(df)) > 1
    keys = ["workload", "batch"] + (["machine"] if several else [])
    groups = list(df.groupby(keys, sort=True))
    if len(groups) == 1:
        return [("", df)]
    return [("-".join(["", _slug(key[0]), f"b{key[1]}"] + ([_slug(key[2])] if several else [])), rows)
            for key, rows in groups]


def _slug(name: object) -> str:
    # a workload may be named by a path ("experiments/workloads/bert.py:workload"): keep file names flat
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name)).strip("_") or "workload"


def metric_label(df: pd.DataFrame) -> str:
    """The workload's metric name ("accuracy" for the digits), from the rows.

    Example:
        >>> metric_label(pd.DataFrame({"metric_name": ["f1"]}))
        'f1'
    """
    if "metric_name" in df.columns and df["metric_name"].notna().any():
        return str(df["metric_name"].dropna().iloc[0])
    return "accuracy"


def higher_is_better(df: pd.DataFrame) -> bool:
    """Whether the rows' metric improves upwards (their `higher_is_better` column; True without one).

    Example:
        >>> higher_is_better(pd.DataFrame({"higher_is_better": [False]})), higher_is_better(pd.DataFrame())
        (False, True)
    """
    if "higher_is_better" not in df.columns or df["higher_is_better"].dropna().empty:
        return True
    return as_bool(df["higher_is_better"].dropna().iloc[0])


def plot_results(df: pd.DataFrame, out_dir: str | os.PathLike) -> list[Path]:
    """Both figures for every (model, batch) group of `df`, written into `out_dir`.

    Example:
        >>> plot_results(load_results("results/demo"), "results/demo")  # doctest: +SKIP
        [PosixPath('results/demo/pareto_accuracy_latency.png'), PosixPath('results/demo/latency_vs_flops.png')]
    """
    out = Path(out_dir)
    paths = []
    for suffix, rows in result_groups(df):
        model, batch = rows["workload"].iloc[0], int(rows["batch"].iloc[0])
        paths.append(plot_accuracy_latency(rows, out / ACCURACY_LATENCY_PNG.replace(".png", f"{suffix}.png"),
                                           title=f"{model}, batch {batch}: {metric_label(rows)} vs measured latency"))
        paths.append(plot_latency_flops(rows, out / LATENCY_FLOPS_PNG.replace(".png", f"{suffix}.png"),
                                        title=f"{model}, batch {batch}: measured latency vs effective FLOPs"))
    if not paths:
        raise ConfigError("no results to plot")
    return paths
