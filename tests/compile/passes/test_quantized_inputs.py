"""Passes that cut channels stand aside when an op's input is quantized: its grid is scaled over every channel.

An int8 (or 4-bit) op puts each input row on a symmetric grid whose scale is the row's
largest magnitude, over all its channels, pruned columns included. Folding a constant
channel into a bias, or cutting it out, changes that scale and so every quantized value of
the row: the compiled model would drift from the user's masked, quantized model.
"""

import warnings

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile import CompileConfig, compile
from sparta_explore.compile.choose import CompileWarning
from sparta_explore.compile.passes.pipeline import quantized_inputs, run_passes


def _model_and_table(bits: int) -> tuple[nn.Module, dict]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 8))
    with torch.no_grad():
        model[0].bias.uniform_(0.5, 2.0)  # the pruned rows' outputs are relu(bias): large constants
    mask = torch.ones(24, 16, dtype=torch.bool)
    mask[:12] = False  # whole rows pruned, their biases kept (a block pruner does this)
    table = {"0.weight": se.TeSA.from_mask(mask)}
    if bits < 32:
        table["2.weight"] = se.TeSA.dense((8, 24), bits=bits)
        table["_1"] = se.TeSA.dense((4, 24), bits=bits)  # the ReLU: the second linear's input
    return model, table


def test_quantized_inputs_names_the_activations_on_a_grid():
    model, table = _model_and_table(4)
    graph = se.capture(model, (torch.randn(4, 16),))
    assert quantized_inputs(graph, table) == ["_1"]
    assert quantized_inputs(graph, _model_and_table(32)[1]) == []


def test_channel_cutting_passes_are_skipped_and_say_why():
    model, table = _model_and_table(4)
    graph = se.capture(model, (torch.randn(4, 16),))
    _, _, reports = run_passes(graph, table)
    by_name = {r.name: r for r in reports}
    for name in ("constant_channels", "shrink", "attention_dims"):
        assert by_name[name].summary == "skipped" and "quantizes activations (_1)" in by_name[name].notes[0]
    _, _, fp32 = run_passes(graph, _model_and_table(32)[1])
    assert {r.name: r.summary for r in fp32}["constant_channels"] != "skipped"


@pytest.mark.parametrize("bits", [8, 4])
def test_compiled_quantized_model_matches_the_masked_quantized_model(bits, device, cache_dir):
    model, table = _model_and_table(bits)
    graph = se.capture(model, (torch.randn(4, 16),))
    propagated = se.run_propagation(graph, table)  # the pruned rows' relu(bias) channels become constant
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)  # a failed table check would warn and fall back
        cm = compile(graph, propagated, config=CompileConfig(device=device, cache_dir=cache_dir, tune=False))
    table_checks = cm.checks[cm.checks["check"] != "ops"]
    assert bool(table_checks["passed"].all()) and float(table_checks["error"].max()) < 1e-4
    assert "skipped: the table quantizes activations" in cm.summary()  # the user sees why


def test_activation_bits_from_a_capture_at_another_batch_survive_the_passes(device, cache_dir):
    # a trial propagates on the workload's example batch and compiles at its latency batch: the activations'
    # TeSAs (8 rows) describe tensors of 64 rows; the passes must carry them, or the ops lose their input bits
    model, table = _model_and_table(8)
    small = se.capture(model, (torch.randn(8, 16),))
    table["_1"] = se.TeSA.dense((8, 24), bits=8)
    propagated = se.run_propagation(small, table)
    big = se.capture(model, (torch.randn(64, 16),))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        cm = compile(big, propagated, config=CompileConfig(device=device, cache_dir=cache_dir, tune=False,
                                                           passes=("simplify",)))
    row = cm.report.set_index("op").loc["_2"]
    assert row["bits"] != "32" and "a8" in str(row["parts"]) + str(row["bits"]), cm.report
    assert bool(cm.checks["passed"].all())
