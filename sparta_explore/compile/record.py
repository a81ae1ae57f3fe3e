"""What a compile keeps beyond the module it returns: the record a package needs, and the report as text.

Both `CompiledModel` and a model compiled in place (`InPlaceCompile`) hold a `CompileRecord`;
`summary_text` prints either one's passes, per-op choices, checks, timing and notes.

Example:
    >>> CompileRecord().notes
    ()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class CompileRecord:
    """What a compiled model keeps beyond its module, for saving it and saying where it came from.

    `graph` (the captured `Graph`) and `table` / `input_table` (the TeSAs compile used and
    the ones propagation started from) are compile's; `example` is the (args, kwargs) call
    the checks ran; `tolerance` the relative error the checks allowed. A loaded model has no
    graph and no plan: `report` holds its saved per-op table, `notes` say how it was loaded and
    `loaded` the load's figures (path, mode, seconds, bit_identical, error vs the saved outputs).
    """

    graph: Any = None
    table: Mapping[str, Any] | None = None
    input_table: Mapping[str, Any] | None = None
    example: tuple[tuple, dict] | None = None
    tolerance: float | None = None
    report: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: tuple[tuple[str, str], ...] = ()
    loaded: Mapping[str, Any] | None = None


def summary_text(ops: pd.DataFrame, passes: pd.DataFrame, checks: pd.DataFrame, guard: Mapping[str, Any] | None,
                 notes: Sequence[tuple[str, str]] = ()) -> str:
    """A compile's passes, per-op choices, checks, whole-model timing and notes as plain text.

    Example:
        >>> print(summary_text(cm.report, cm.passes, cm.checks, cm.guard))   # doctest: +SKIP
    """
    cols = [c for c in ("op", "shape", "choice", "parts", "meas_ms", "dense_ms", "notes") if c in ops.columns]
    passes = passes[["pass", "changed", "seconds", "notes"]].fillna("")
    if not bool((passes["notes"] != "").any()):  # notes say why a pass was skipped or what it baked in
        passes = passes.drop(columns="notes")
    parts = ["passes:", passes.to_string(index=False),
             "ops:", ops[cols].to_string(index=False) if len(ops) else "no pruned or quantized weighted ops",
             "checks:", checks.to_string(index=False)]
    if guard is not None:
        parts += ["whole model:", ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in guard.items())]
    parts += [f"{label}: {note}" for label, note in notes]
    return "\n".join(parts)
