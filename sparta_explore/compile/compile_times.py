"""Where a compile's seconds went: per stage for the whole model, per step for each op.

Stages run once per compile (capture, prepare: tables, compiler check, device profile,
trusted reference; graph passes; plan; recording the ops' inputs; kernel passes; checks;
guard); the kernel choice is split into the steps every op records in `OpPlan.seconds`
(`choose.STEPS`: tile search, code generation, gcc and loading, the kernel's own check, its few-row path,
lowering, the check against the op's reference, candidate timing). "other" is what no stage
claims, so the rows always sum to the compile's wall time.

Example:
    >>> stage_frame({"capture": 1.0}, [], total=1.5)["seconds"].tolist()
    [1.0, 0.5]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pandas as pd

from sparta_explore.compile.choose import STEPS
from sparta_explore.plan import OpPlan

STAGES = ("capture", "prepare", "graph passes", "plan", "record inputs", *STEPS, "kernel passes", "checks", "guard")


def stage_frame(stages: Mapping[str, float], ops: Iterable[OpPlan], total: float) -> pd.DataFrame:
    """One row per stage that took time (`STAGES` order; the ops' steps summed), then "other": seconds and share.

    Example:
        >>> stage_frame({"guard": 2.0}, [], total=4.0).to_dict("list")
        {'stage': ['guard', 'other'], 'seconds': [2.0, 2.0], 'share': [0.5, 0.5]}
    """
    seconds = dict(stages)
    for op in ops:
        for step, s in op.seconds.items():
            seconds[step] = seconds.get(step, 0.0) + s
    rows = [(stage, seconds[stage]) for stage in STAGES if seconds.get(stage, 0.0) > 0]
    rows.append(("other", max(0.0, total - sum(s for _, s in rows))))
    frame = pd.DataFrame(rows, columns=["stage", "seconds"])
    frame["share"] = frame["seconds"] / total if total > 0 else 0.0
    return frame


def op_frame(ops: Iterable[OpPlan]) -> pd.DataFrame:
    """One row per op: its seconds in each step of `choose.STEPS` and their total.

    Example:
        >>> list(op_frame([]).columns)[:2]
        ['op', 'tile search']
    """
    rows = [{"op": op.op, **{step: op.seconds.get(step, 0.0) for step in STEPS}, "total": sum(op.seconds.values())}
            for op in ops]
    return pd.DataFrame(rows, columns=["op", *STEPS, "total"])


def times_text(stages: pd.DataFrame) -> str:
    """The stage breakdown on one line: 'total 12.3 s: gcc + load 4.1 s (33%), ...', largest first.

    Example:
        >>> times_text(stage_frame({"guard": 2.0}, [], total=4.0))
        'total 4.0 s: guard 2.0 s (50%), other 2.0 s (50%)'
    """
    total = float(stages["seconds"].sum())
    parts = [f"{r.stage} {r.seconds:.1f} s ({r.share:.0%})"
             for r in stages.sort_values("seconds", ascending=False, kind="stable").itertuples()]
    return f"total {total:.1f} s: " + ", ".join(parts)
