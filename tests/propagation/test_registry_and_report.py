"""User rules: registered by decorator into a RuleSet, or given for one call; the report names them."""

import torch
from torch import nn

from sparta_explore import capture
from sparta_explore.propagation import OpUpdate, RuleSet, default_rules, register_rule, run_propagation


class Halve(nn.Module):
    def forward(self, x):
        return x[..., : x.shape[-1] // 2] * 0.5


def test_user_rule_for_one_call_replaces_scrambling():
    model = nn.Sequential(nn.Linear(4, 8), Halve(), nn.Linear(4, 2)).eval()
    graph = capture(model, torch.randn(2, 4), leaf_modules=[Halve])
    mine = RuleSet()

    @register_rule(Halve, rules=mine)
    def halve_rule(op):
        x = op.args[0]
        rel = torch.zeros(x.shape, dtype=torch.bool)
        rel[..., : x.shape[-1] // 2] = op.output.kept
        return OpUpdate(output=x.kept[..., : x.shape[-1] // 2], args={0: rel})

    result = run_propagation(graph, {}, rules=mine)
    assert not result.report.scrambled
    assert result.table["0.weight"].pruned[4:].all()  # Halve never reads the upper half
    per_op = result.report.per_op()
    assert "halve_rule" in set(per_op["rule"])
    assert Halve not in default_rules().targets()  # the override did not leak into the built-ins


def test_per_op_report_and_compare():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    graph = capture(model, torch.randn(2, 4))
    from sparta_explore import TeSA
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[:, 0] = False
    result = run_propagation(graph, {"2.weight": TeSA.from_mask(keep)})
    ev = result.report.events_frame()
    assert {"node", "rule", "tensor", "direction", "newly_pruned"} <= set(ev.columns)
    assert (ev["newly_pruned"] > 0).any()
    cmp = result.compare().set_index("name")
    assert cmp.loc["0.weight", "sparsity_before"] == 0.0 and cmp.loc["0.weight", "sparsity_after"] == 0.25
