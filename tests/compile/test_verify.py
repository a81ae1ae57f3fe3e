"""The checks' bookkeeping: a module's outputs computed once, or taken from a run made already; an fp32 compile's
ops check reuses the run that recorded the ops' inputs, a quantized one's runs only to explain a failed table check,
and an input table saying what the table says is not run."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.fx as fx
from plan.test_planner import Net
from torch import nn

import sparta_explore as se
from sparta_explore.compile import compile, pipeline, verify
from sparta_explore.compile.verify import ModelOutputs


class Counting(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x):
        self.calls += 1
        return self.inner(x)


def test_model_outputs_run_each_module_once_and_take_given_outputs():
    graph = se.capture(nn.Linear(4, 3), (torch.randn(2, 4),))
    outputs = ModelOutputs(graph)
    ran, given = Counting(nn.Linear(4, 3)), Counting(nn.Linear(4, 3))
    outputs.of(ran)
    outputs.of(ran)
    assert ran.calls == 1 and outputs.seconds(ran) > 0
    out = given.inner(torch.randn(2, 4))
    outputs.given(given, out, 0.5, label="given")
    assert torch.equal(outputs.of(given)[0], out) and given.calls == 0 and outputs.seconds("given") == 0.5


def test_fp32_compile_checks_its_ops_on_the_recorded_run_and_int8_builds_the_reference_graph(
        device, cache_dir, monkeypatch):
    built = []
    real = verify.reference_module
    monkeypatch.setattr(verify, "reference_module", lambda gm, compiled: built.append(1) or real(gm, compiled))
    model, x = Net(), torch.randn(33, 64)
    g = se.capture(model, (x,))
    table = {n: se.TeSA.from_mask(torch.rand(p.shape) < 0.8) for n, p in model.named_parameters() if p.dim() == 2}
    cm = compile(g, table, device=device, cache_dir=cache_dir, tune=False, runs=1)
    assert not built  # the ops' reference outputs came from the run that recorded their inputs
    row = cm.checks.set_index("check").loc["ops"]
    assert bool(row["passed"]) and 0 <= cm.max_error < 1e-3
    with torch.no_grad():
        assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-4)
    if 8 not in device.bits:
        pytest.skip("no int8 kernels on this machine: the quantized half needs them")
    first = next(n for n, p in model.named_parameters() if p.dim() == 2)
    q = dict(table) | {first: se.TeSA.dense(tuple(model.get_parameter(first).shape), bits=8),
                       g.inputs[0]: se.TeSA.dense((1, 64), bits=8)}
    cm = compile(g, q, device=device, cache_dir=cache_dir, tune=False, runs=1)
    assert not built  # quantized: the reference graph runs only to explain a failed table check
    checks = cm.checks.set_index("check")
    assert bool(checks["passed"].all()) and cm.max_error == checks.loc["table", "error"]
    if any(op.candidate(op.chosen).parts[0].kernel == "int8" for op in cm.plan.ops.values()
           if op.chosen not in (None, "original")):
        assert np.isnan(checks.loc["ops", "error"])  # not run: the table check compared with the user's model


def test_an_input_table_saying_what_the_table_says_is_checked_without_another_run(device, cache_dir, monkeypatch):
    model, x = Net(), torch.randn(33, 64)
    g = se.capture(model, (x,))
    table = {n: se.TeSA.from_mask(torch.rand(p.shape) < 0.5) for n, p in model.named_parameters() if p.dim() == 2}
    result = se.run_propagation(g, table)
    built = []
    real = pipeline.table_reference
    monkeypatch.setattr(pipeline, "table_reference", lambda *a, **k: built.append(1) or real(*a, **k))
    cm = compile(g, result, device=device, cache_dir=cache_dir, tune=False, runs=1)
    checks = cm.checks.set_index("check")
    assert {"table", "input table"} <= set(checks.index) and bool(checks["passed"].all())
    assert not built  # propagation pruned no weight further here: the tables say one model, built and run once
    assert checks.loc["input table", "error"] == checks.loc["table", "error"]


class _Wrong(nn.Module):
    """A 'kernel' off by `off` whose reference is right: a kernel bug the checks must catch."""

    def __init__(self, linear: nn.Linear, off: float) -> None:
        super().__init__()
        self.linear, self.off = linear, off

    def forward(self, x):
        return self.linear(x) + self.off

    def reference(self, x):
        return self.linear(x)


class _KernelsAsLeaves(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, _Wrong) or super().is_leaf_module(m, qualname)


@pytest.mark.parametrize("off", [0.0, 1.0])
def test_without_an_ops_reference_the_reference_graph_runs_only_to_explain_a_failed_table_check(off, monkeypatch):
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 4)), torch.randn(5, 8)
    graph = se.capture(model, (x,))
    root = nn.Sequential(_Wrong(model[0], off))
    gm = fx.GraphModule(root, _KernelsAsLeaves().trace(root))
    built = []
    real = verify.reference_module
    monkeypatch.setattr(verify, "reference_module", lambda gm, compiled: built.append(1) or real(gm, compiled))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run, rows = verify.verified_module(graph, gm, SimpleNamespace(ops={}), {"0": gm.get_submodule("0")},
                                           [("table", graph.module)], 1e-3, verify=True)
    checks = {r["check"]: r for r in rows}
    if off == 0:
        assert run is gm and not built and np.isnan(checks["ops"]["error"]) and checks["table"]["passed"]
        assert not caught
    else:  # the kernel is wrong, its reference right: the reference ops run, and the rows say which check failed
        assert built and run is not gm and checks["ops"]["error"] > 1e-3 and not checks["ops"]["passed"]
        assert checks["table"]["passed"] and torch.allclose(run(x), model(x))
        assert any("reference ops" in str(w.message) for w in caught)


def test_where_propagation_pruned_further_the_input_table_is_checked_and_the_table_only_explains(
        device, cache_dir, monkeypatch):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(33, 64)
    g = se.capture(model, (x,))
    fc2 = torch.rand(64, 96) < 0.5
    fc2[:, :40] = False  # columns of fc2 nobody reads: propagation prunes those rows of fc1 too
    table = {"fc1.weight": se.TeSA.from_mask(torch.rand(96, 64) < 0.5), "fc2.weight": se.TeSA.from_mask(fc2)}
    result = se.run_propagation(g, table)
    assert not pipeline.same_references(g, result.table, table)
    built = []
    real = pipeline.table_reference
    monkeypatch.setattr(pipeline, "table_reference", lambda *a, **k: built.append(1) or real(*a, **k))
    cm = compile(g, result, device=device, cache_dir=cache_dir, tune=False, runs=1)
    checks = cm.checks.set_index("check")
    assert np.isnan(checks.loc["table", "error"]) and bool(checks.loc["input table", "passed"])  # never run
    assert cm.table_error == checks.loc["input table", "error"] and len(built) == 1  # the input table's only
    with torch.no_grad():
        assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-4)  # what the user's table says


def test_a_failed_check_runs_the_checks_it_explains():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 4)), torch.randn(5, 8)
    graph = se.capture(model, (x,))
    root = nn.Sequential(_Wrong(model[0], 1.0))
    gm = fx.GraphModule(root, _KernelsAsLeaves().trace(root))
    outputs = ModelOutputs(graph)
    outputs.given(gm, gm(x), 0.1)  # the ops reference computes what gm does: the bug is not the kernels'
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run, rows = verify.verified_module(graph, gm, SimpleNamespace(ops={}), {}, [("input table", graph.module)],
                                           1e-3, verify=True, outputs=outputs, ops_reference=gm,
                                           explain=[("table", graph.module)])
    checks = {r["check"]: r for r in rows}
    assert run is graph.module and not checks["input table"]["passed"]
    assert checks["table"]["error"] > 1e-3 and not checks["table"]["passed"]  # measured, not NaN
    _, rows = verify.verified_module(graph, model, SimpleNamespace(ops={}), {}, [("input table", graph.module)],
                                     1e-3, verify=True, ops_reference=model, explain=[("table", graph.module)])
    assert np.isnan({r["check"]: r for r in rows}["table"]["error"])  # passed: the explaining check never ran
