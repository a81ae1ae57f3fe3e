"""Calibrated bits, compiled: the compiled model's accuracy equals the calibrated one within 0.5 points."""

import warnings

import pytest

from sparta_explore.compile import compile
from sparta_explore.quantizers.calibrate_config import CalibrationConfig
from sparta_explore.quantizers.calibrate_split import calibrate_on_split, calibration_data
from sparta_explore.zoo.training import evaluate


@pytest.mark.parametrize("name", ["digits-mlp", "digits-cnn"])
def test_compiled_accuracy_matches_calibration(trained, digits, device, cache_dir, one_thread, name):
    model = trained(name).eval()
    cd = calibration_data(digits, val_source="train")
    result = calibrate_on_split(model, None, cd, CalibrationConfig(bits=(16, 8), threshold=0.01, progress=False))
    bits = result.assignment()
    assert sum(b <= 8 for b in bits.values()) * 2 > len(bits), bits  # most tensors at 8 bits or below
    result.apply_weights(model)
    calibrated = evaluate(result.model, cd.held_x, cd.held_y)
    x = (cd.held_x[:64],)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cm = compile(model, result.table, x, device=device, cache_dir=cache_dir, tune=False, runs=2)
    compiled = evaluate(cm, cd.held_x, cd.held_y)
    assert abs(compiled - calibrated) <= 0.005, (compiled, calibrated)
    assert any(op.weight_bits <= 8 for op in cm.plan.ops.values())
    if name == "digits-mlp":  # linears with 8-bit inputs: int8 kernels are among the candidates
        kinds = {p.kernel for op in cm.plan.ops.values() for c in op.candidates for p in c.parts}
        assert "int8" in kinds
