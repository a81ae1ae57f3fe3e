"""The guard's decisions: the fastest candidate runs; the reference only when even that is slower than dense."""

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile import guard


@pytest.fixture
def graph():
    model = nn.Linear(4, 4)
    return se.capture(model, torch.randn(2, 4))


def _clock(monkeypatch, ms: dict) -> None:
    # the decision is the guard's; what the clock says is the test's
    monkeypatch.setattr(guard, "alternating_ms", lambda graph, modules, runs, **kw: [ms[id(m)] for m in modules])


def test_the_fastest_candidate_runs(graph, monkeypatch):
    compiled, passes, reference = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
    _clock(monkeypatch, {id(graph.module): 5.0, id(compiled): 2.0, id(passes): 1.0, id(reference): 9.0})
    name, module, record = guard.guarded(graph, {"compiled": compiled, "graph passes only": passes}, reference, 3)
    assert name == "graph passes only" and module is passes
    assert record["runs"] == name and record["x_dense"] == 5.0 and "reference_ms" not in record


def test_the_reference_runs_only_when_everything_compiled_is_slower_than_dense(graph, monkeypatch):
    compiled, reference = nn.Linear(4, 4), nn.Linear(4, 4)
    _clock(monkeypatch, {id(graph.module): 1.0, id(compiled): 3.0, id(reference): 1.5})
    name, module, record = guard.guarded(graph, {"compiled": compiled}, reference, 3)
    assert name == "reference" and module is reference and record["reference_ms"] == 1.5
    _clock(monkeypatch, {id(graph.module): 1.0, id(compiled): 3.0, id(reference): 4.0})
    name, module, _ = guard.guarded(graph, {"compiled": compiled}, reference, 3)
    assert name == "compiled" and module is compiled  # slower than dense, but the fastest correct one
