"""Calibration on the digits: the held-out accuracy drop stays within the threshold, most tensors at <= 8 bits."""

import pytest
import torch

from sparta_explore.errors import ConfigError
from sparta_explore.quantizers import CalibrationConfig, accuracy_on, calibrate, calibrate_on_split, calibration_data
from sparta_explore.zoo import DataSplit, DigitsMLP, TrainConfig, evaluate, train

pytestmark = pytest.mark.usefixtures("one_thread")


def _check(model, data, config):
    before = evaluate(model, data.held_x, data.held_y)
    r = calibrate_on_split(model, None, data, config)
    after = evaluate(r.model, data.held_x, data.held_y)  # the held-out data is never seen by calibration
    widths = r.assignment()
    assert before - after <= config.threshold, (before, after, widths)
    assert sum(b <= 8 for b in widths.values()) > len(widths) / 2, widths
    assert r.accuracy_before - r.accuracy_after <= config.threshold
    return r, widths


def test_small_mlp_validated_on_unseen_examples_keeps_its_held_out_accuracy(digits):
    # the cleanest protocol: train on part of the train split, steer calibration by accuracy on the rest
    fit = DataSplit(digits.train_x[:1000], digits.train_y[:1000], digits.test_x, digits.test_y, 10, "fit")
    torch.manual_seed(0)
    model = DigitsMLP(hidden=(48,))
    train(model, fit, TrainConfig(epochs=20))
    config = CalibrationConfig(steps=10, progress=False)
    before = evaluate(model, digits.test_x, digits.test_y)
    r = calibrate(model, None, digits.train_x[:256], accuracy_on(digits.train_x[1000:], digits.train_y[1000:]), config)
    assert before - evaluate(r.model, digits.test_x, digits.test_y) <= config.threshold
    assert r.accuracy_before - r.accuracy_after <= config.threshold
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
    r, widths = _check(trained(name), cd, CalibrationConfig(progress=False))
    weights = [b for t, b in widths.items() if t.endswith(".weight")]
    assert all(b <= 8 for b in weights)
