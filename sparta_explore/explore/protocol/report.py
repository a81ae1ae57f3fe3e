"""The latency-vs-FLOPs protocol's report: tables with mean +- spread over seeds, goal checks, one fronts plot.

`write_protocol_report(out)` reads a protocol folder (`protocol.run_protocol`), judges it
(`protocol_judge`), draws every search's kept fronts of every seed in one figure
(``fronts.png``) and writes ``report.md`` beside it; it returns the markdown.

Example:
    >>> text = write_protocol_report("results/latency_vs_flops/digits-ffn/<machine>")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd

from sparta_explore.cache import atomic_write
from sparta_explore.explore.protocol.judge import (
    EQUAL_ACCURACY,
    GUIDES,
    METRICS,
    family_label,
    goal_checks,
    judge,
    kept_front,
    reference,
    summarize,
)
from sparta_explore.explore.protocol.run import CONFIG_JSON, load_protocol
from sparta_explore.explore.report.sweep_report import markdown_table

COLORS = {"latency": "black", "flops": "tab:red", "tpe-latency": "tab:blue", "tpe-flops": "tab:orange"}
LABELS = {"hypervolume": "hypervolume", "pick_accuracy": "pick accuracy", "pick_predicted": "pick predicted ratio",
          "pick_latency": "pick measured latency ratio", "speedup_vs_flops_pick": "speedup vs FLOPs pick"}


def spread(mean: float, std: float, lo: float, hi: float) -> str:
    """``mean +- sd [min, max]`` with 3 significant digits; NaN parts print as "n/a".

    Example:
        >>> spread(0.5, 0.01, 0.49, 0.51)
        '0.5 +- 0.01 [0.49, 0.51]'
    """
    if not math.isfinite(mean):
        return "n/a"
    sd = f"{std:.2g}" if math.isfinite(std) else "n/a"
    return f"{mean:.3g} +- {sd} [{lo:.3g}, {hi:.3g}]"


def summary_table(judged: pd.DataFrame) -> pd.DataFrame:
    """One row per search, one column per measure, each cell `spread` over seeds.

    Example:
        >>> j = pd.DataFrame({"search": ["a", "a"], "seed": [0, 1], **{m: [1.0, 3.0] for m in METRICS}})
        >>> summary_table(j).iloc[0]["hypervolume"]
        '2 +- 1.4 [1, 3]'
    """
    stats = summarize(judged)
    rows = []
    for search in stats.index:
        row: dict[str, Any] = {"search": search}
        for m in METRICS:
            row[LABELS[m]] = spread(*(float(stats.loc[search, (m, k)]) for k in ("mean", "std", "min", "max")))
        rows.append(row)
    return pd.DataFrame(rows)


def plot_fronts(df: pd.DataFrame, target: float, path: str | os.PathLike, *, title: str = "") -> Path:
    """Every search's kept front of every seed, on measured latency ratio vs accuracy; writes `path` (PNG).

    Example:
        >>> plot_fronts(load_protocol(out), 0.25, "fronts.png")  # doctest: +SKIP
    """
    from sparta_explore.explore.report.plots import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 5.5), dpi=110)
    ref = reference(df)
    styles = ("-", "--", ":", "-.")
    for search, rows in df.groupby("search", sort=False):
        guide = GUIDES.get(search, "latency")
        for i, (seed, by_seed) in enumerate(rows.groupby("seed")):
            front = kept_front(by_seed, guide).sort_values("latency_ratio")
            best = front["accuracy"].cummax()
            ax.plot(front["latency_ratio"], best, drawstyle="steps-post", color=COLORS.get(search, "gray"),
                    ls=styles[i % len(styles)], lw=1.4, alpha=0.85, label=f"{search}, seed {seed}")
            ax.scatter(front["latency_ratio"], front["accuracy"], s=14, color=COLORS.get(search, "gray"), alpha=0.7)
    ax.axvline(target, color="gray", ls=":", lw=1.2, label=f"latency target ({target:g} x dense)")
    ax.axhline(ref[1], color="silver", lw=0.8, label=f"reference accuracy ({ref[1]:.3g})")
    ax.set_xlim(0, 1.05)
    # from just under the reference up: trials at chance accuracy would squash the useful band to a sliver
    top = float(pd.to_numeric(df["accuracy"], errors="coerce").max())
    if math.isfinite(top):
        ax.set_ylim(max(0.0, ref[1] - 0.05), min(1.0, top) + 0.01)
    ax.set_xlabel("measured latency / dense PyTorch latency (same trial)")
    ax.set_ylabel("accuracy (compiled model, held-out digits)")
    ax.set_title(title or "kept fronts per search and seed, judged on measured latency")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return _save(fig, path, plt)


def family_table(df: pd.DataFrame) -> pd.DataFrame:
    """Where FLOPs mislead, per (pattern, precision) over the distinct trials: FLOPs vs measured latency.

    Example:
        >>> rows = pd.DataFrame({"key": ["a", "b"], "pruner": ["nm", "nm"], "block": ["1x4", "1x4"],
        ...                      "bits": [32, 32], "act_bits": [None, None], "accuracy": [0.9, 0.8],
        ...                      "flops_ratio": [0.5, 0.5], "latency_ratio": [1.0, 0.9]})
        >>> row = family_table(rows).iloc[0]
        >>> row["family"], int(row["trials"]), float(row["latency / FLOPs"])
        ('2:4 fp32', 2, 1.9)
    """
    trials = df.drop_duplicates("key").dropna(subset=["accuracy", "latency_ratio", "flops_ratio"]).copy()
    trials["family"] = trials.apply(family_label, axis=1)
    out = trials.groupby("family").agg(trials=("key", "size"), flops_ratio=("flops_ratio", "median"),
                                       latency_ratio=("latency_ratio", "median"), best_accuracy=("accuracy", "max"))
    out["latency / FLOPs"] = (out["latency_ratio"] / out["flops_ratio"]).round(2)
    return out.reset_index().sort_values("latency / FLOPs", ascending=False)


def budget_table(df: pd.DataFrame, startup: int) -> pd.DataFrame:
    """What each search spent its own proposals on (steps from `startup` on): share on int kernels, per pattern.

    Example:
        >>> rows = pd.DataFrame({"search": ["a", "a"], "step": [8, 9], "bits": [8, 32], "act_bits": [None, None],
        ...                      "pruner": ["block", "level"], "block": ["32x32", ""]})
        >>> budget_table(rows, startup=8).iloc[0][["int kernels", "32x32", "unstructured"]].tolist()
        ['50%', '50%', '50%']
    """
    from sparta_explore.explore.trial.families import pattern_of

    own = df[df["step"] >= startup].copy()
    own["pattern"] = [pattern_of({"pruner": p, "block": b}) for p, b in zip(own["pruner"], own["block"])]
    act = pd.to_numeric(own["act_bits"], errors="coerce")
    own["int"] = (pd.to_numeric(own["bits"], errors="coerce") <= 8) & (act.isna() | (act <= 8))
    patterns = sorted(own["pattern"].unique())
    rows = []
    for search, mine in own.groupby("search", sort=False):
        row: dict[str, Any] = {"search": search, "proposals": len(mine), "int kernels": f"{mine['int'].mean():.0%}"}
        row.update({p: f"{(mine['pattern'] == p).mean():.0%}" for p in patterns})
        rows.append(row)
    return pd.DataFrame(rows)


def _per_seed(judged: pd.DataFrame) -> pd.DataFrame:
    cols = ["seed", "search", "hypervolume", "front_size", "pick_label", "pick_accuracy", "pick_predicted",
            "pick_latency", "pick_meets_target", "speedup_vs_flops_pick", "failed"]
    return judged[cols]


def render_protocol_report(folder: str | os.PathLike, *, image: str = "fronts.png") -> str:
    """The markdown of a protocol folder (see the module docstring).

    Example:
        >>> print(render_protocol_report(out)[:40])  # doctest: +SKIP
    """
    folder = Path(folder)
    config = json.loads((folder / CONFIG_JSON).read_text())
    df = load_protocol(folder)
    target = float(config["target"])
    judged = judge(df, target)
    ref = reference(df)
    trials = df.drop_duplicates("key")
    machine = trials.dropna(subset=["cpu_model"]).iloc[0] if trials["cpu_model"].notna().any() else None
    where = "unknown machine" if machine is None else \
        f"{machine['cpu_model']} ({machine['cpu_flags']}), {int(machine['threads'])} threads"
    dense_ms = float(trials["dense_latency_ms"].median())
    cap = "" if config.get("compile_cap") is None else f", compile capped at {config['compile_cap']:g} s"
    lines = [
        f"# Latency-guided vs FLOPs-guided search: {config['workload']}", "",
        f"Measured on {where}. Budget {config['budget']} trials per search, seeds {config['seeds']}, shared "
        f"random start of {config['startup']} trials, latency target {target:g} x dense. Space: "
        f"{config['space']['patterns']} x {config['space']['precisions']} x per-layer sparsity "
        f"{config['space']['sparsities']}. Fixed: {config['fixed'] or 'none'}; compile tile search "
        f"{'on' if config['tune'] else 'off'}{cap}; {config['runs']} timed calls per latency.", "",
        f"{len(trials)} distinct trials ({int(trials['accuracy'].isna().sum())} failed); trial wall time median "
        f"{trials['wall_s'].median():.1f} s, max {trials['wall_s'].max():.1f} s, total "
        f"{trials['wall_s'].sum() / 60:.1f} min, of which compile median {trials['compile_s'].median():.1f} s, "
        f"total {trials['compile_s'].sum() / 60:.1f} min. Dense PyTorch: {dense_ms:.2f} ms median, accuracy "
        f"{trials['dense_accuracy'].median():.4f}. Hypervolume reference: (latency ratio {ref[0]:g}, "
        f"accuracy {ref[1]:.4g}).", "",
        "## Goals", "",
    ]
    for goal, met, detail in goal_checks(judged):
        lines.append(f"* **{'met' if met else 'NOT met'}**: {goal}. {detail}.")
    lines += ["", "## Mean +- standard deviation [min, max] over seeds", "", markdown_table(summary_table(judged)),
              "", f"Pick: the most accurate trial whose own cost (its guide's ratio) is at most {target:g} "
              f"and whose accuracy is above the reference ({ref[1]:.4g}). "
              f"Speedup vs FLOPs pick: the FLOPs-guided pick's measured latency over the fastest trial of the "
              f"search at most {EQUAL_ACCURACY * 100:g} points less accurate.", "",
              "## Per seed", "", markdown_table(_per_seed(judged)), "",
              "## Where the budget went, and where FLOPs mislead", "",
              f"Share of each search's own proposals (steps {config['startup']}..{config['budget'] - 1}, all seeds):",
              "", markdown_table(budget_table(df, int(config["startup"]))), "",
              "Every distinct trial of the run by family: median FLOPs and measured latency (both / dense) and "
              "how far FLOPs underestimate the latency:", "", markdown_table(family_table(df)), "",
              "## The FLOPs-guided picks: predicted vs measured", "",
              markdown_table(judged[judged["guide"] == "flops"][["seed", "search", "pick_label", "pick_predicted",
                                                                 "pick_latency", "pick_meets_target"]]), "",
              f"![fronts]({image})", ""]
    return "\n".join(lines)


def write_protocol_report(folder: str | os.PathLike) -> str:
    """Draw ``fronts.png`` and write ``report.md`` in `folder`; returns the markdown.

    Example:
        >>> text = write_protocol_report(out)  # doctest: +SKIP
    """
    folder = Path(folder)
    config = json.loads((folder / CONFIG_JSON).read_text())
    plot_fronts(load_protocol(folder), float(config["target"]), folder / "fronts.png",
                title=f"{config['workload']}: kept fronts per search and seed")
    text = render_protocol_report(folder)
    atomic_write(folder / "report.md", lambda f: f.write(text.encode()))
    return text
