"""The trial's stages: each takes and returns frozen values, and none changes what an earlier one returned."""

import dataclasses

import pytest
import torch

from sparta_explore.errors import ConfigError
from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.explore.trial.stages import (
    Calibrated,
    Compiled,
    Compressed,
    FineTuned,
    Measured,
    TrialSetup,
    calibrate,
    compile_stage,
    compress,
    finetune,
    measure,
)

STAGE_VALUES = (TrialSetup, Compressed, FineTuned, Calibrated, Compiled, Measured)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("cls", STAGE_VALUES, ids=lambda c: c.__name__)
def test_stage_values_are_frozen_and_hold_no_dicts_of_anything(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    for f in dataclasses.fields(cls):  # every field is typed: nothing rides along in a bag of Any
        assert f.type not in ("Any", "dict", "dict[str, Any]"), f"{cls.__name__}.{f.name}: {f.type}"


def test_setup_takes_params_not_a_dict():
    # the params are parsed once, by run_trial; a stage never parses them again
    with pytest.raises(ConfigError, match="TrialParams.from_dict"):
        TrialSetup.start({"workload": "digits-mlp"})


def test_stages_pass_values_along_without_changing_earlier_ones(cache_dir, digits, device):
    params = TrialParams(workload="digits-mlp", sparsity=0.75, block=(1, 32), finetune_epochs=1, batch=8,
                         calibrate=True, calibrate_threshold=0.05)
    setup = TrialSetup.start(params, cache_dir=cache_dir, runs=3, warmup=1)
    dense = _state(setup.workload.dense_model())
    compressed = compress(setup)
    assert isinstance(compressed, Compressed) and 0.7 < compressed.sparsity_pruned <= compressed.sparsity_propagated
    assert _same(_state(setup.workload.dense_model()), dense)  # the pruner worked on a fresh copy
    trained = _state(compressed.trained)
    tuned = finetune(setup, compressed)
    assert isinstance(tuned, FineTuned) and tuned.model is not compressed.trained
    assert _same(_state(compressed.trained), trained)
    fine = _state(tuned.model)
    calibrated = calibrate(setup, compressed, tuned)
    assert isinstance(calibrated, Calibrated) and calibrated.model is not tuned.model
    assert _same(_state(tuned.model), fine)  # calibration lowered bits on its own copy
    assert calibrated.propagation is not compressed.propagation
    with pytest.raises(dataclasses.FrozenInstanceError):
        calibrated.model = tuned.model  # type: ignore[misc]
    compiled = compile_stage(setup, calibrated)
    assert isinstance(compiled, Compiled) and compiled.seconds > 0
    measured = measure(setup, calibrated, compiled)
    assert isinstance(measured, Measured) and measured.compiled.median_ms > 0
    assert measured.effective_flops < measured.dense_flops


def test_calibrate_passes_through_when_not_asked(cache_dir, digits, device):
    setup = TrialSetup.start(TrialParams(workload="digits-mlp", finetune_epochs=0), cache_dir=cache_dir)
    compressed = compress(setup)
    tuned = finetune(setup, compressed)
    calibrated = calibrate(setup, compressed, tuned)
    assert calibrated.propagation is compressed.propagation and calibrated.model is tuned.model


@pytest.mark.parametrize("params", [
    {"pruner": "wanda", "sparsity": 0.5, "block": None},
    {"pruner": "sparsegpt", "sparsity": 0.5, "block": None, "bits": 4, "act_bits": 32, "quantizer": "gptq"},
])
def test_calibration_based_compressors_take_the_workloads_calibration_windows(params, cache_dir):
    pytest.importorskip("transformers")
    setup = TrialSetup.start(TrialParams.from_dict({"workload": "smollm2-tiny", "finetune_epochs": 0, **params}),
                             cache_dir=cache_dir)
    compressed = compress(setup)
    name = "model.layers.0.mlp.up_proj.weight"
    assert compressed.table[name].sparsity == pytest.approx(0.5)
    if "bits" in params:
        assert (compressed.table[name].kept_bits(), compressed.table[name].group) == ([4], 128)
