"""Calibration on the digits: what it promises, tested exactly, and held-out data agreeing within its noise.

The promise: the accuracy drop on the validation data `eval_fn` scores is at most the
threshold. On data calibration never saw, the drop may exceed that by sampling noise
only, bounded by `held_out_margin` (3 standard errors). Nothing here depends on the CPU's
float rounding: the assertions hold for any trained weights, only their values differ.
"""

import pytest
import torch

from sparta_explore.errors import ConfigError
from sparta_explore.quantizers import (
    CalibrationConfig,
    accuracy_on,
    calibrate,
    calibrate_on_split,
    calibration_data,
    flip_rate,
    held_out_margin,
)
from sparta_explore.zoo import DataSplit, DigitsMLP, TrainConfig, evaluate, train

pytestmark = pytest.mark.usefixtures("one_thread")


def _check_promise(model, r, val_x, val_y, held_x, held_y, threshold):
    """The validation drop is within the threshold exactly; the held-out drop within threshold + noise."""
    val_before, val_after = evaluate(model, val_x, val_y), evaluate(r.model, val_x, val_y)
    assert r.accuracy_before == pytest.approx(val_before) and r.accuracy_after == pytest.approx(val_after)
    assert val_before - val_after <= threshold  # the promise, on the data calibration was steered by
    held_drop = evaluate(model, held_x, held_y) - evaluate(r.model, held_x, held_y)
    flips = flip_rate(model, r.model, torch.cat([val_x, held_x]), torch.cat([val_y, held_y]))
    margin = held_out_margin(flips, len(val_x), len(held_x))
    assert held_drop <= threshold + margin, (held_drop, threshold, margin, r.assignment())
    return held_drop, margin


def test_small_mlp_validated_on_unseen_examples_keeps_its_held_out_accuracy(digits):
    # the cleanest protocol: train on part of the train split, steer calibration by accuracy on the rest
    fit = DataSplit(digits.train_x[:1000], digits.train_y[:1000], digits.test_x, digits.test_y, 10, "fit")
    torch.manual_seed(0)
    model = DigitsMLP(hidden=(48,))
    train(model, fit, TrainConfig(epochs=20))
    config = CalibrationConfig(steps=10, progress=False)
    val_x, val_y = digits.train_x[1000:], digits.train_y[1000:]
    r = calibrate(model, None, digits.train_x[:256], accuracy_on(val_x, val_y), config)
    _check_promise(model, r, val_x, val_y, digits.test_x, digits.test_y, config.threshold)
    # greedy in topological order: the first layer's weight and input take the low widths first
    assert r.assignment()["layers.0.weight"] <= 8 and r.assignment()["flatten"] <= 8


@pytest.mark.parametrize("val_source", ["train", "test"])
def test_calibration_data_is_disjoint(digits, val_source):
    cd = calibration_data(digits, calib_size=100, val_source=val_source, seed=3)
    assert len(cd.calib_x) == 100
    ids = lambda t: {hash(tuple(r.tolist())) for r in t.flatten(1)}  # noqa: E731
    calib, val, held = ids(cd.calib_x), ids(cd.val_x), ids(cd.held_x)
    # the digits hold a few duplicate images, so compare against the overlap the split itself has
    duplicates = len(digits.train_x) + len(digits.test_x) - len(ids(digits.train_x) | ids(digits.test_x))
    assert len(calib & val) + len(calib & held) + len(val & held) <= duplicates
    expected_val = len(digits.train_x) - 100 if val_source == "train" else len(digits.test_x) // 2
    assert len(cd.val_x) == len(cd.val_y) == expected_val
    with pytest.raises(ConfigError, match="calib_size"):
        calibration_data(digits, calib_size=0)
    with pytest.raises(ConfigError, match="val_source"):
        calibration_data(digits, val_source="valid")
    with pytest.raises(ConfigError, match="labels"):
        accuracy_on(cd.val_x, cd.val_y[:3])


@pytest.mark.parametrize("name", ["digits-cnn", "digits-mlp"])
@pytest.mark.parametrize("val_source", ["train", "test"])
def test_pretrained_digits_models_reach_low_bits_within_the_threshold(trained, digits, name, val_source):
    # steered by accuracy on train examples (which the model saw) or on half the test split; checked on
    # data calibration never saw: the whole test split, or its other half
    cd = calibration_data(digits, val_source=val_source)
    model = trained(name)
    config = CalibrationConfig(progress=False)
    r = calibrate_on_split(model, None, cd, config)
    _check_promise(model, r, cd.val_x, cd.val_y, cd.held_x, cd.held_y, config.threshold)
    widths = r.assignment()
    # 8-bit weights cost a 97%-accurate model a point only if three more validation digits flip
    assert all(b <= 8 for t, b in widths.items() if t.endswith(".weight")), widths
    assert sum(b <= 8 for b in widths.values()) > len(widths) / 2, widths


def test_held_out_margin_grows_with_flips_and_shrinks_with_data():
    assert held_out_margin(0.0, 100, 100) == 0.0
    assert held_out_margin(0.05, 100, 100) > held_out_margin(0.01, 100, 100)
    assert held_out_margin(0.05, 1000, 1000) < held_out_margin(0.05, 100, 100)
    with pytest.raises(ConfigError, match="held_out_margin"):
        held_out_margin(1.5, 10, 10)


def test_a_model_that_loses_accuracy_everywhere_fails_the_held_out_check(digits):
    # the margin is a noise bound, not a blanket: a model broken everywhere is caught
    torch.manual_seed(0)
    model = DigitsMLP(hidden=(48,))
    train(model, digits, TrainConfig(epochs=5))
    broken = DigitsMLP(hidden=(48,))  # untrained: about 10% accuracy
    flips = flip_rate(model, broken, digits.test_x, digits.test_y)
    drop = evaluate(model, digits.test_x, digits.test_y) - evaluate(broken, digits.test_x, digits.test_y)
    assert drop > 0.01 + held_out_margin(flips, 225, 225)
