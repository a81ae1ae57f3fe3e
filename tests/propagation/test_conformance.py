"""Every registered rule is sound on random values, and every registered target has a case."""

import pytest
import torch

from sparta_explore import TeSA, TeSATable, capture
from sparta_explore.propagation import default_rules, run_propagation
from sparta_explore.propagation.verify import max_output_change

from .cases import conformance_cases

CASES = conformance_cases()


def random_table(graph, seed: int) -> TeSATable:
    """Random pruning of weights and float inputs: whole rows, whole columns and single elements."""
    g = torch.Generator().manual_seed(seed)
    table = TeSATable(shapes=graph.shapes())
    names = [n for n, i in graph.tensors.items() if i.kind == "param"] + \
        [n for n in graph.inputs if graph.tensors[n].dtype.is_floating_point]
    for name in names:
        shape = graph.tensors[name].shape
        if not shape:
            continue
        pruned = torch.rand(shape, generator=g) < 0.2
        if len(shape) >= 2:
            pruned |= (torch.rand(shape[0], generator=g) < 0.25).reshape(-1, *([1] * (len(shape) - 1)))
            pruned |= (torch.rand(shape[1], generator=g) < 0.25).reshape(1, -1, *([1] * (len(shape) - 2)))
        table[name] = TeSA.from_mask(~pruned)
    return table


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rule_is_sound(case):
    model, inputs = case.build()
    graph = capture(model, inputs)
    for seed in (0, 1):
        before = random_table(graph, seed)
        result = run_propagation(graph, before)
        assert not result.report.scrambled, f"{case}: fell back to scrambling for {result.report.scrambled}"
        assert not result.report.unsupported, f"{case}: {result.report.unsupported}"
        assert max_output_change(graph, before, result.table, trials=2, seed=seed) < 1e-4, case.name


def test_every_registered_target_has_a_conformance_case():
    covered = set()
    for case in CASES:
        covered.update(case.targets)
    missing = [t for t in default_rules().targets() if t not in covered]
    assert not missing, f"registered targets without a conformance case: {missing}"


def test_cases_reach_their_targets():
    # a case must really produce its target in the traced graph, or it proves nothing
    absent = []
    for case in CASES:
        model, inputs = case.build()
        graph = capture(model, inputs)
        seen = set()
        for n in graph.nodes():
            seen.add(type(graph.module.get_submodule(n.target)) if n.op == "call_module" else n.target)
        absent += [f"{case}: {t}" for t in case.targets if t not in seen]
    assert not absent, f"targets missing from their case's graph: {absent}"
