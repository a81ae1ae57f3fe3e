"""What propagation did: per-op rule, tensors changed, sparsity before and after."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from sparta_explore.compact import both, core, count_true, spread
from sparta_explore.tesa import TeSA
from sparta_explore.tesa_table import TeSATable


@dataclass
class PropagationReport:
    """Every change a rule made, plus the ops that were scrambled or could not be analysed."""

    events: list[dict] = field(default_factory=list)
    visits: int = 0
    nodes: int = 0
    seconds: float = 0.0
    scrambled: set[str] = field(default_factory=set)
    unsupported: dict[str, str] = field(default_factory=dict)
    stopped_early: bool = False

    def record(self, node: str, op: str, rule: str, tensor: str, direction: str, before: TeSA, after: TeSA) -> None:
        # counted on the cores of broadcast keys (count_nonzero: a bool .sum() widens to int64)
        newly_pruned = count_true(both(before.kept, after.pruned))
        # newly pruned elements went to 0 bits, so they are among the lowered ones: take them out
        old, new = before._key, after._key
        lowered = count_true(spread((core(new) >> 2) < (core(old) >> 2), old.shape)) - newly_pruned
        self.events.append({"visit": self.visits, "node": node, "op": op, "rule": rule, "tensor": tensor,
                            "direction": direction, "newly_pruned": newly_pruned, "bits_lowered": lowered})

    def events_frame(self) -> pd.DataFrame:
        """One row per change: visit, node, op, rule, tensor, direction, newly_pruned, bits_lowered."""
        return pd.DataFrame(self.events, columns=["visit", "node", "op", "rule", "tensor", "direction",
                                                  "newly_pruned", "bits_lowered"])

    def per_op(self) -> pd.DataFrame:
        """Per op: the rule that fired and how many elements it pruned / lowered, summed over visits.

        Example:
            >>> result.report.per_op().head()  # doctest: +SKIP
        """
        ev = self.events_frame()
        if ev.empty:
            return pd.DataFrame(columns=["node", "op", "rule", "changes", "newly_pruned", "bits_lowered"])
        out = ev.groupby(["node", "op", "rule"], sort=False).agg(
            changes=("tensor", "size"), newly_pruned=("newly_pruned", "sum"), bits_lowered=("bits_lowered", "sum"))
        return out.reset_index()


@dataclass
class PropagationResult:
    """The propagated table, the table it started from (completed to every tensor), the report and the check.

    `input_table` is the table as the user gave it (what `compile` verifies against as well);
    `check` is the self-check (`self_check.SelfCheck`: output change, reverted tensors).
    """

    table: TeSATable
    before: TeSATable
    report: PropagationReport
    check: Any = None
    input_table: Mapping[str, TeSA] | None = None

    def compare(self) -> pd.DataFrame:
        """Per tensor: sparsity and mean bits before and after propagation."""
        a, b = self.before.summary().set_index("name"), self.table.summary().set_index("name")
        out = pd.DataFrame({"shape": b["shape"], "numel": b["numel"], "sparsity_before": a["sparsity"],
                            "sparsity_after": b["sparsity"], "bits_before": a["bits"], "bits_after": b["bits"]})
        return out.reset_index()
