"""Sparsity-attribute propagation: rules per op, the TeSA algebra, scrambling, a worklist fixpoint.

Example:
    >>> from sparta_explore.propagation import propagate
    >>> table = propagate(graph, pruned_table)  # doctest: +SKIP
"""

from sparta_explore.propagation.builtin_rules import default_rules
from sparta_explore.propagation.engine import propagate, run_propagation
from sparta_explore.propagation.registry import OpUpdate, OpView, RuleEntry, RuleSet, Unsupported, register_rule
from sparta_explore.propagation.report import PropagationReport, PropagationResult
from sparta_explore.propagation.scramble import scramble

__all__ = ["OpUpdate", "OpView", "PropagationReport", "PropagationResult", "RuleEntry", "RuleSet", "Unsupported",
           "default_rules", "propagate", "register_rule", "run_propagation", "scramble"]
