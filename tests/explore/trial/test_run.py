"""run_trial end to end on the digits MLP (compiled, verified, timed), and the pieces it is built from."""

import json
import math

import pytest
import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.explore.trial.objectives import score
from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.explore.trial.result import METRIC_FIELDS, ROW_COLUMNS, TrialResult, resolved_batch
from sparta_explore.explore.trial.run import run_trial
from sparta_explore.explore.trial.stages import calibration_ladder
from sparta_explore.pruners import PruneRequest, get_pruner
from sparta_explore.quantizers import QuantRequest, get_quantizer
from sparta_explore.tesa import TeSA
from sparta_explore.zoo.workloads import repeat_to

MLP = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
LAYERS = ("1",)  # the prunable layers of MLP: its head "3" stays dense


def _configs(pruner, **request):
    return get_pruner(pruner).configs_for(PruneRequest(layers=request.pop("layers", LAYERS), **request), MLP)


def test_block_and_nm_configs_are_built_by_their_registry_entries():
    (cfg,) = _configs("block", sparsity=0.75, block=(1, 32), scope="global")
    assert (cfg.block, cfg.sparsity, cfg.scope, cfg.op_names) == ((1, 32), 0.75, "global", LAYERS)
    (nm,) = _configs("nm", sparsity=0.5, block=(1, 4))
    assert (nm.n, nm.m, nm.op_names) == (2, 4, LAYERS)
    with pytest.raises(ConfigError, match="n=2.8"):
        _configs("nm", sparsity=0.3, block=(1, 4))
    with pytest.raises(ConfigError, match="needs a block shape"):
        _configs("block", sparsity=0.5, block=None)
    with pytest.raises(ConfigError, match="no global scope"):
        _configs("nm", sparsity=0.5, scope="global")


def test_nni_configs_take_granularity_and_global_groups():
    ((entry,),) = _configs("l1norm", sparsity=0.5)
    assert entry["granularity"] == "default" and entry["op_names"] == ["1"] and entry["op_types"] == ["Linear"]
    ((level,),) = _configs("level", sparsity=0.5, block=(1, 4))
    assert level["granularity"] == [1, 4]
    ((glob,),) = _configs("level", sparsity=0.5, scope="global")
    assert glob["global_group_id"] == 0 and glob["sparse_ratio"] == 0.5
    (uniform,) = get_quantizer("uniform").configs_for(QuantRequest(4, LAYERS), MLP)
    assert uniform.weight_bits == uniform.activation_bits == 4 and uniform.op_names == LAYERS


def test_per_layer_sparsity_groups_layers_by_their_sparsity():
    layers = ("0", "1", "2")
    groups = PruneRequest(0.5, layers, (("1", 0.9), ("2", 0.9))).groups()
    assert groups == [(0.5, ("0",)), (0.9, ("1", "2"))]
    assert PruneRequest(0.5, ("0",), (("0", 0.25),)).groups() == [(0.25, ("0",))]
    with pytest.raises(ConfigError, match="not prunable layers"):
        PruneRequest(0.5, layers, (("nope", 0.5),))
    with pytest.raises(ConfigError, match="conflict"):
        PruneRequest(0.5, layers, (("0", 0.5),), scope="global")


def test_small_helpers():
    assert calibration_ladder(32) == (16, 8, 4) and calibration_ladder(4) == (4,)
    x = repeat_to(torch.arange(6.0).reshape(3, 2), 7)
    assert x.shape == (7, 2) and x[3].tolist() == [0.0, 1.0]
    assert resolved_batch(TrialParams(workload="digits-mlp")) == 64


def test_row_is_flat_json_and_scored_by_its_objective():
    metrics = dict.fromkeys(METRIC_FIELDS, 1.0) | {"latency_ms": 4.0, "dense_latency_ms": 10.0, "accuracy": 0.9,
                                                   "effective_flops": 7.0, "dense_flops": 10.0}
    result = TrialResult(TrialParams(workload="digits-mlp", objective="flops", target=0.5), **metrics)
    row = json.loads(json.dumps(result.as_row()))
    assert list(row) == list(ROW_COLUMNS)
    assert row["speedup"] == pytest.approx(2.5) and row["flops_ratio"] == pytest.approx(0.7)
    assert row["score"] == pytest.approx(score(row, "flops", 0.5)) == pytest.approx(0.9 - 0.4)
    assert TrialParams.from_dict(json.loads(row["params_json"])) == result.params


def test_bad_names_fail_before_any_work(cache_dir):
    with pytest.raises(ConfigError, match="unknown quantizer 'fp8'"):
        run_trial({"workload": "digits-mlp", "bits": 8, "quantizer": "fp8"}, cache_dir=cache_dir)
    with pytest.raises(ConfigError, match="unknown pruner 'magic'"):
        run_trial({"workload": "digits-mlp", "pruner": "magic"}, cache_dir=cache_dir)


def _trial(params, cache_dir, digits, device, compile_options=None, **kw):
    lines = []
    result = run_trial({"workload": "digits-mlp", "batch": 64, **params}, cache_dir=cache_dir, runs=3,
                       warmup=1, compile_kwargs={"device": device, "tune": False, **(compile_options or {})},
                       echo=lines.append, **kw)
    return result, result.as_row(), lines


def test_fp32_trial_is_compiled_verified_and_measured(cache_dir, digits, device):
    result, row, lines = _trial({"block": "1x32", "sparsity": 0.75}, cache_dir, digits, device)
    assert list(row) == list(ROW_COLUMNS) and json.dumps(row)
    assert (row["workload"], row["block"], row["bits"], row["batch"]) == ("digits-mlp", "1x32", 32, 64)
    assert row["metric_name"] == "accuracy"
    # the classifier head stays dense, so a bit under 75% of all weights
    assert 0.70 < row["sparsity_pruned"] <= row["sparsity_propagated"] < 0.76
    assert result.table["layers.0.weight"].block_density((1, 32)) == pytest.approx(0.25)
    assert result.table["head.weight"].sparsity == 0.0
    assert row["flops_ratio"] == pytest.approx(1 - row["sparsity_propagated"], abs=0.02)
    assert row["mean_bits"] == 32.0 and row["compressed_weight_bytes"] < 0.3 * row["dense_weight_bytes"]
    assert 0 < row["latency_p10_ms"] <= row["latency_ms"] <= row["latency_p90_ms"] and row["dense_latency_ms"] > 0
    assert row["max_error"] <= 1e-3
    # fp32 kernels compute the masked model: the same predictions, to a digit or two
    assert abs(row["accuracy"] - row["finetuned_accuracy"]) <= 2 / len(digits.test_y)
    assert row["accuracy"] > 0.85 and row["dense_accuracy"] > 0.95
    assert set(result.compile_report["op"]) <= {"layers_0", "layers_1", "head"}
    assert "layers_1:" in row["kernel_choices"] and row["runs"] == 3
    assert row["score"] == pytest.approx(score(row, "latency", 0.5))
    assert [line.split()[0] for line in lines] == ["block", "fine-tuned", "compiled", "measured"]
    assert "after propagation" in lines[0]
    assert row["compile_capped"] == 0 and 0 < row["compile_s"] < row["wall_s"]


def test_a_capped_compile_is_counted_in_the_row(cache_dir, digits, device):
    result, row, _ = _trial({"block": "1x32", "sparsity": 0.75}, cache_dir, digits, device,
                            compile_options={"max_seconds": 0})
    planned = len(result.compile_report)
    assert planned > 0 and row["compile_capped"] == planned
    assert result.compile_report["notes"].str.contains("compile time cap").all()


def test_int8_trial_quantizes_the_body_not_the_head(cache_dir, digits, device):
    result, row, _ = _trial({"block": "32x32", "sparsity": 0.5, "bits": 8}, cache_dir, digits, device)
    assert result.table["layers.1.weight"].kept_bits() == [8] and result.table["head.weight"].kept_bits() == [32]
    assert 8 < row["mean_bits"] < 12
    assert row["accuracy"] >= row["finetuned_accuracy"] - 0.05
    assert not math.isnan(row["max_error"]) and row["max_error"] <= 2e-2
    # fusions tried (fused, or measured slower and kept apart) leave notes; none of them is a fallback
    report = result.compile_report
    assert row["fallbacks"] == int(report["fallback"].sum()) == 0, report[["op", "choice", "notes"]]


def test_calibrated_trial_lowers_bits_within_the_threshold(cache_dir, digits, device):
    result, row, lines = _trial({"block": "32x32", "sparsity": 0.5, "bits": 8, "calibrate": True,
                                 "calibrate_threshold": 0.02}, cache_dir, digits, device)
    # uncalibrated, the body is int8 and the head fp32: 9.19 mean bits over the kept weights
    assert row["calibrate"] and row["mean_bits"] < 9.0
    assert all(b <= 8 for name, t in result.table.items() if name.endswith("weight") for b in t.kept_bits())
    assert row["accuracy"] >= row["finetuned_accuracy"] - 0.05
    assert any(line.startswith("calibrated bits") for line in lines)
    # the calibrated table quantizes activations: channel-cutting passes stand aside, so the compiled model
    # matches the user's quantized model and nothing falls back to it
    assert row["fallbacks"] == 0 and row["max_error"] <= 2e-2


def test_fallbacks_count_rejected_kernels_not_notes(device, cache_dir):
    from sparta_explore.compile import CompileConfig, compile
    from sparta_explore.explore.trial.run import kernel_choices

    class Twice(nn.Module):  # one Linear called twice: compile leaves it as is, a fallback
        def __init__(self):
            super().__init__()
            self.fc, self.out = nn.Linear(32, 32), nn.Linear(32, 4)

        def forward(self, x):
            return self.out(self.fc(torch.relu(self.fc(x))))

    model = Twice()
    table = {"fc.weight": TeSA.from_mask(torch.rand(32, 32) > 0.8),
             "out.weight": TeSA.from_mask(torch.rand(4, 32) > 0.5)}
    cm = compile(model, table, (torch.randn(8, 32),), config=CompileConfig(device=device, cache_dir=cache_dir,
                                                                             tune=False, runs=2))
    report = cm.report
    twice = report["op"].str.startswith("fc")  # both calls of fc are planned ops, both left as is
    assert int(twice.sum()) == 2 and bool(report[twice]["fallback"].all())
    assert not bool(report[~twice]["fallback"].any())
    assert kernel_choices(report)[1] == 2


def test_per_layer_sparsity_prunes_each_layer_to_its_own_level(cache_dir, digits, device):
    result, row, _ = _trial({"block": "1x32", "sparsity@layers.0": 0.875, "sparsity@layers.1": 0.25}, cache_dir,
                            digits, device)  # every prunable layer overridden, as the NNI search space does
    assert result.table["layers.0.weight"].block_density((1, 32)) == pytest.approx(0.125)
    assert result.table["layers.1.weight"].block_density((1, 32)) == pytest.approx(0.75)
    assert row["layer_sparsity"] == "layers.0:0.875;layers.1:0.25" and row["sparsity"] == 0.5
    with pytest.raises(ConfigError, match="not prunable layers"):
        _trial({"block": "1x32", "sparsity@nope": 0.5}, cache_dir, digits, device)
