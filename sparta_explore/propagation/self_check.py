"""Propagation checks itself: a tensor whose new pruning changes the output keeps its input TeSA.

After the fixpoint, the model with every newly pruned element set to random values (and
pruned activations forced to zero) is compared with the model masked by the input table,
on the example inputs (`verify.max_output_change`: on their first item where no later item
prunes what the first keeps; a change one item shows is confirmed on the whole example, which
then bisects). If they differ, the tensors at fault are found by bisection over the changed
tensors (a few extra runs per culprit), reverted to their input TeSAs, and named with the ops
and rules that pruned them; if the reverted table still differs, every tensor is reverted. A
wrong table never leaves propagation.

Example:
    >>> table, check = checked_table(graph, before, after, report)  # doctest: +SKIP
    >>> check.reverted  # doctest: +SKIP
    {}
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sparta_explore.compact import both, count_true, equal
from sparta_explore.graph import Graph
from sparta_explore.propagation.report import PropagationReport
from sparta_explore.propagation.verify import max_output_change
from sparta_explore.tesa import TeSA
from sparta_explore.tesa_table import TeSATable


class PropagationWarning(UserWarning):
    """Propagation pruned something that changed the output; those tensors were reverted."""


@dataclass
class SelfCheck:
    """What the self-check measured: the output change before and after reverting, and what was reverted.

    `reverted` maps each reverted tensor to the ops and rules that had pruned it.
    """

    error: float = 0.0
    final_error: float = 0.0
    tolerance: float = 1e-4
    runs: int = 0
    reverted: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.error <= self.tolerance


def _newly_pruned(before: Mapping[str, TeSA], after: Mapping[str, TeSA]) -> list[str]:
    # key equality first (on the cores of broadcast keys): cheap for the many unchanged tensors
    return [n for n, t in after.items() if n in before and not equal(t._key, before[n]._key)
            and count_true(both(t.pruned, before[n].kept)) > 0]


class _Checker:
    def __init__(self, graph: Graph, before: TeSATable, after: TeSATable, tolerance: float, trials: int) -> None:
        self.graph, self.before, self.after = graph, before, after
        self.tolerance, self.trials, self.runs = tolerance, trials, 0
        self.one_item = True  # until a run on one item finds a change: the whole example confirms it, and bisects

    def mixed(self, names: Sequence[str]) -> TeSATable:
        chosen = set(names)
        out = TeSATable(shapes=self.before.shapes)
        for name, tesa in self.after.items():
            out[name] = tesa if name in chosen or name not in self.before else self.before[name]
        return out

    def error(self, names: Sequence[str]) -> float:
        self.runs += 1
        table = self.mixed(names)
        if self.one_item:
            error = max_output_change(self.graph, self.before, table, trials=self.trials, one_item=True)
            if error <= self.tolerance:
                return error
            self.one_item = False
        return max_output_change(self.graph, self.before, table, trials=self.trials)

    def culprits(self, names: Sequence[str]) -> list[str]:
        """The tensors among `names` (whose changes together are unsound) that are unsound on their own."""
        if len(names) == 1:
            return list(names)
        half = len(names) // 2
        found: list[str] = []
        for part in (names[:half], names[half:]):
            if self.error(part) > self.tolerance:
                found += self.culprits(part)
        return found or list(names)  # unsound only together: revert the whole group


def _provenance(report: PropagationReport, tensor: str) -> str:
    seen = []
    for e in report.events:
        if e["tensor"] == tensor and e["newly_pruned"]:
            what = f"op {e['node']!r} ({e['op']}, rule {e['rule']}, {e['direction']})"
            if what not in seen:
                seen.append(what)
    return "; ".join(seen) or "no recorded rule"


def checked_table(graph: Graph, before: TeSATable, after: TeSATable, report: PropagationReport, *,
                  tolerance: float = 1e-4, trials: int = 1) -> tuple[TeSATable, SelfCheck]:
    """`after` with every tensor whose new pruning changes the output reverted to `before`; see the module doc.

    Example:
        >>> table, check = checked_table(graph, result.before, result.table, result.report)  # doctest: +SKIP
    """
    checker = _Checker(graph, before, after, tolerance, trials)
    changed = _newly_pruned(before, after)
    check = SelfCheck(tolerance=tolerance)
    if not changed:
        return after, check
    check.error = checker.error(changed)
    check.final_error = check.error
    if check.passed:
        check.runs = checker.runs
        return after, check
    bad = checker.culprits(changed)
    kept = [n for n in changed if n not in set(bad)]
    check.final_error = checker.error(kept) if kept else 0.0
    if check.final_error > tolerance:  # unsound in a way bisection could not isolate: trust nothing new
        bad, kept, check.final_error = changed, [], 0.0
    check.reverted = {name: _provenance(report, name) for name in bad}
    check.runs = checker.runs
    names = ", ".join(f"{n!r} (pruned by {why})" for n, why in list(check.reverted.items())[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    warnings.warn(f"propagation changed the model's output by {check.error:.3g} (relative, > {tolerance:g}); "
                  f"reverted {len(bad)} tensor(s) to their input TeSAs: {names}{more}. Please report the rule",
                  PropagationWarning, stacklevel=3)
    return checker.mixed(kept), check
