"""Calibration sets of every accepted form become single forward calls; too few samples is a clear error."""

from types import SimpleNamespace

import pytest
import torch

from sparta_explore.errors import ConfigError
from sparta_explore.oneshot import CalibrationSample, calibration_samples


def test_token_ids_split_into_rows_of_batch_one():
    ids = torch.arange(12).reshape(4, 3)
    samples = calibration_samples(ids, 3)
    assert [s.args[0].tolist() for s in samples] == [[[0, 1, 2]], [[3, 4, 5]], [[6, 7, 8]]]
    assert all(s.kwargs == {} for s in samples)


def test_a_dict_of_batched_inputs_splits_by_row_and_shares_the_rest():
    batch = {"input_ids": torch.zeros(3, 5, dtype=torch.long), "attention_mask": torch.ones(3, 5), "flag": True}
    samples = calibration_samples(batch)
    assert len(samples) == 3
    assert samples[1].kwargs["input_ids"].shape == (1, 5) and samples[1].kwargs["flag"] is True


def test_a_list_of_per_sample_inputs_keeps_each_one():
    rows = [torch.zeros(7, dtype=torch.long), {"input_ids": torch.zeros(1, 4, dtype=torch.long)},
            (torch.ones(1, 2),), CalibrationSample((torch.ones(1, 3),))]
    samples = calibration_samples(rows)
    assert samples[0].args[0].shape == (1, 7)  # a bare row of ids gains its batch dim
    assert samples[1].kwargs["input_ids"].shape == (1, 4)
    assert samples[2].args[0].shape == (1, 2) and samples[3].args[0].shape == (1, 3)


def test_a_workload_calibrates_on_its_calibration_inputs():
    task = SimpleNamespace(name="w", inputs=(torch.zeros(2, 8),), calibration_inputs=(torch.ones(6, 8),),
                           train_batches=None, loss=None, validation_metric=None, can_train=False,
                           evaluate=lambda model, validation=False: 0.0)
    samples = calibration_samples(task, 4)
    assert len(samples) == 4 and bool((samples[0].args[0] == 1).all())


def test_too_few_samples_says_how_many_there_are_and_were_asked():
    with pytest.raises(ConfigError, match="has 4 samples; the config asks for 16"):
        calibration_samples(torch.zeros(4, 8, dtype=torch.long), 16)


@pytest.mark.parametrize("source", [[], "tokens", torch.tensor(3)])
def test_unusable_sets_are_config_errors(source):
    with pytest.raises(ConfigError):
        calibration_samples(source)
