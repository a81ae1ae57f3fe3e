"""The table checks on the example's last item: which calls cut, which outputs split, and that only a pass is
decided on the item (a failure, or a model that mixes its batch, is compared on the whole example)."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.fx as fx
from plan.test_planner import Net
from torch import nn

import sparta_explore as se
from sparta_explore.compile import compile, item_call, pipeline, verify
from sparta_explore.compile.item_call import ItemCall
from sparta_explore.compile.verify import ModelOutputs
from sparta_explore.errors import ConfigError


def test_an_item_needs_one_batch_size_over_one_in_every_tensor_input():
    assert ItemCall.of((torch.zeros(1, 3),), {}) is None
    assert ItemCall.of((torch.zeros(3, 2),), {"mask": torch.zeros(2, 2)}) is None
    assert ItemCall.of((torch.zeros(3, 2), torch.tensor(1.0)), {}) is None
    assert ItemCall.of((), {}) is None
    x = torch.arange(12.0).view(3, 4)
    call = ItemCall.of((x, 2.5), {"extra": {"ids": torch.arange(6).view(3, 2)}})
    assert call.batch == 3 and call.args[1] == 2.5 and call.label == "item 3 of 3"
    assert torch.equal(call.args[0], x[2:]) and torch.equal(call.kwargs["extra"]["ids"], torch.tensor([[4, 5]]))


def test_outputs_cut_to_the_item_only_where_they_split_along_dim_0():
    call = ItemCall.of((torch.zeros(4, 2),), {})
    rows = torch.arange(24.0).view(12, 2)  # (batch x 3 rows) flattened batch-major
    assert torch.equal(call.cut([rows], [torch.zeros(3, 2)])[0], rows[9:])
    assert call.cut([rows], [torch.zeros(3, 1)]) is None  # other trailing shape
    assert call.cut([torch.zeros(2, 4)], [torch.zeros(1, 4)]) is None  # dim 0 is not the batch
    assert call.cut([torch.zeros(())], [torch.zeros(())]) is None  # a scalar (a loss): whole only
    assert call.cut([rows], []) is None


class Counting(nn.Module):
    """A module that notes the batch size of every call."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.batches = inner, []

    def forward(self, x):
        self.batches.append(x.shape[0])
        return self.inner(x)


class MixesBatch(nn.Module):
    """Subtracts the batch mean: its output on one item is not that item of its whole-example output."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        y = self.inner(x)
        return y - y.mean(0, keepdim=True)


def _outputs(model: nn.Module, x: torch.Tensor, tol: float = 1e-5) -> ModelOutputs:
    graph = se.capture(model, (x,))
    return ModelOutputs(graph, ItemCall.of(graph.call_args, graph.call_kwargs), tol)


def test_a_marked_reference_runs_on_the_item_and_a_pass_is_decided_there():
    torch.manual_seed(0)
    linear, x = nn.Linear(6, 3), torch.randn(5, 6)
    outputs = _outputs(linear, x)
    compiled, reference = Counting(linear), Counting(nn.Linear(6, 3))
    reference.inner.load_state_dict(linear.state_dict())
    outputs.on_item(reference)
    error, on = outputs.compared(compiled, reference)
    assert on == "item 5 of 5" and error <= 1e-6
    assert compiled.batches == [5] and reference.batches == [1]  # the compiled model ran the whole example
    assert outputs.ran(reference) and outputs.seconds(reference) is None and outputs.dense_seconds(reference) is None
    assert outputs.seconds(compiled) > 0


class _WrongRow(nn.Module):
    def __init__(self, linear: nn.Linear, row: int) -> None:
        super().__init__()
        self.linear, self.row = linear, row

    def forward(self, x):
        y = self.linear(x).clone()
        y[self.row] += 1.0
        return y


@pytest.mark.parametrize("wrong_row", [0, 4])
def test_a_difference_is_measured_on_the_whole_example_wherever_it_is(wrong_row):
    torch.manual_seed(0)
    linear, x = nn.Linear(6, 3), torch.randn(5, 6)
    outputs = _outputs(linear, x)
    reference, compiled = Counting(linear), _WrongRow(linear, wrong_row)
    outputs.on_item(reference)
    error, on = outputs.compared(compiled, reference)
    if wrong_row == 4:  # on the item: it fails there, and the error reported is the whole example's
        assert on == "whole example" and reference.batches == [1, 5] and error > 0.1
    else:  # off the item: the item passes (what the kernel checks on full-size inputs cover)
        assert on == "item 5 of 5" and error <= 1e-6


def test_a_model_mixing_its_batch_fails_on_the_item_and_passes_whole():
    torch.manual_seed(0)
    model, x = MixesBatch(nn.Linear(6, 3)), torch.randn(5, 6)
    outputs = _outputs(model, x)
    reference = Counting(model)
    outputs.on_item(reference)
    error, on = outputs.compared(model, reference)
    assert on == "whole example" and error == 0.0 and reference.batches == [1, 5]


class SumsBatch(nn.Module):
    """One row whatever the batch (a loss-like output): not split into items."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x).sum(0, keepdim=True)


def test_outputs_that_do_not_split_are_compared_whole():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(6, 3), nn.Flatten(0)), torch.randn(5, 6)  # (15,) splits: 3 per item
    outputs = _outputs(model, x)
    reference = Counting(model)
    outputs.on_item(reference)
    assert outputs.compared(model, reference)[1] == "item 5 of 5"
    model = SumsBatch(nn.Linear(6, 3))
    outputs = _outputs(model, x)
    reference = Counting(model)
    outputs.on_item(reference)
    error, on = outputs.compared(model, reference)
    assert on == "whole example" and error == 0.0 and reference.batches == [1, 5]


def test_compile_checks_a_large_model_on_its_last_item(device, cache_dir, monkeypatch):
    """Under `ITEM_CHECK_SECONDS` (here 0: every model counts as large) the masked references run on one item and
    the guard takes capture's dense call; the compiled model still computes the user's masked model."""
    monkeypatch.setattr(pipeline, "ITEM_CHECK_SECONDS", 0.0)
    torch.manual_seed(0)
    model, x = Net(), torch.randn(33, 64)
    g = se.capture(model, (x,))
    assert g.dense_seconds is not None and g.dense_seconds > 0
    table = {n: se.TeSA.from_mask(torch.rand(p.shape) < 0.2) for n, p in model.named_parameters() if p.dim() == 2}
    runs = []
    real = ModelOutputs._run
    monkeypatch.setattr(ModelOutputs, "_run", lambda self, module, on_item: runs.append(on_item) or
                        real(self, module, on_item))
    cm = compile(g, table, device=device, cache_dir=cache_dir, tune=False, runs=1)
    checks = cm.checks.set_index("check")
    assert checks.loc["table", "on"] == "item 33 of 33" and bool(checks["passed"].all())
    assert runs[:2] == [False, True]  # the compiled model on the whole example, the masked model on its item
    with torch.no_grad():
        assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-4)  # every item, not only the last
    whole = compile(g, table, device=device, cache_dir=cache_dir, tune=False, runs=1, verify="whole")
    assert whole.checks.set_index("check").loc["table", "on"] == "whole example"


def test_small_models_and_a_bad_verify_option_keep_the_whole_example(device, cache_dir):
    model, x = Net(), torch.randn(33, 64)
    g = se.capture(model, (x,))
    assert g.dense_seconds < item_call.ITEM_CHECK_SECONDS  # a small model: its references run whole
    table = {n: se.TeSA.from_mask(torch.rand(p.shape) < 0.5) for n, p in model.named_parameters() if p.dim() == 2}
    cm = compile(g, table, device=device, cache_dir=cache_dir, tune=False, runs=1)
    assert set(cm.checks["on"]) <= {"whole example", "not run"}
    with pytest.raises(ConfigError, match="CompileConfig.verify"):
        compile(g, table, device=device, cache_dir=cache_dir, verify="item")


class _WrongOnLastRow(nn.Module):
    """A 'kernel' wrong on the example's last row only (a ragged tile tail), its reference right."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x):
        y = self.linear(x).clone()
        y[-1] += 1.0
        return y

    def reference(self, x):
        return self.linear(x)


class _Leaves(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, _WrongOnLastRow) or super().is_leaf_module(m, qualname)


def test_a_kernel_wrong_on_its_tile_tail_is_caught_by_the_item_check_and_falls_back():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 4)), torch.randn(5, 8)
    graph = se.capture(model, (x,))
    root = nn.Sequential(_WrongOnLastRow(model[0]))
    gm = fx.GraphModule(root, _Leaves().trace(root))
    outputs = ModelOutputs(graph, ItemCall.of(graph.call_args, graph.call_kwargs), 1e-3)
    outputs.on_item(graph.module)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run, rows = verify.verified_module(graph, gm, SimpleNamespace(ops={}), {"0": gm.get_submodule("0")},
                                           [("table", graph.module)], 1e-3, verify=True, outputs=outputs)
    checks = {r["check"]: r for r in rows}
    assert run is not gm and not checks["ops"]["passed"] and checks["ops"]["on"] == "whole example"
    assert checks["table"]["passed"] and torch.allclose(run(x), model(x))
    assert any("reference ops" in str(w.message) for w in caught)
    assert not np.isnan(checks["ops"]["error"])


@pytest.mark.parametrize("same_threads", [True, False])
def test_the_guard_takes_captures_dense_call_only_from_as_many_threads(same_threads, device, cache_dir, monkeypatch):
    monkeypatch.setattr(pipeline, "ITEM_CHECK_SECONDS", 0.0)
    seen = []
    real = pipeline.guarded
    monkeypatch.setattr(pipeline, "guarded", lambda *a, **k: seen.append(a[4]["dense"]) or real(*a, **k))
    torch.manual_seed(0)
    model, x = Net(), torch.randn(33, 64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads if same_threads else threads + 1)
        g = se.capture(model, (x,))
    finally:
        torch.set_num_threads(threads)
    table = {n: se.TeSA.from_mask(torch.rand(p.shape) < 0.2) for n, p in model.named_parameters() if p.dim() == 2}
    cm = compile(g, table, device=device, cache_dir=cache_dir, tune=False, runs=1)
    assert seen == [g.dense_seconds if same_threads else None]
    assert (cm.guard.get("dense_from") == "capture") <= same_threads  # never from a call on other threads


class FixedBatch(nn.Module):
    """A forward with its batch size baked in: it fails on one item."""

    def __init__(self, inner: nn.Module, batch: int) -> None:
        super().__init__()
        self.inner, self.batch = inner, batch

    def forward(self, x):
        return self.inner(x).view(self.batch, -1)


def test_a_reference_that_fails_on_one_item_runs_the_whole_example():
    torch.manual_seed(0)
    model, x = FixedBatch(nn.Linear(6, 3), 5), torch.randn(5, 6)
    outputs = _outputs(model, x)
    reference = FixedBatch(model.inner, 5)
    outputs.on_item(reference)
    error, on = outputs.compared(model, reference)
    assert on == "whole example" and error == 0.0 and outputs.seconds(reference) is not None
