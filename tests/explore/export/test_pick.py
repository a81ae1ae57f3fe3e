"""Picking the trial to export: by id, or the best under an accuracy floor and/or a latency target."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.export import load_trials, pick_trial

SAVED = Path(__file__).parents[1] / "data" / "saved"


@pytest.fixture
def trials():
    return pd.DataFrame({
        "key": ["aa11", "ab22", "bc33", "cd44", "de55"],
        "accuracy": [0.90, 0.95, 0.97, 0.99, None],
        "latency_ms": [1.0, 2.0, 3.0, 8.0, 0.5],
        "dense_latency_ms": [10.0, 10.0, 10.0, 10.0, 10.0],
        "score": [0.2, 0.9, 0.5, 0.1, None],
        "params_json": ["{}"] * 5,
        "nni_trial": ["t1", "t2", "t3", "t4", "t5"],
    })


def test_a_trial_is_named_by_key_prefix_or_nni_id(trials):
    assert pick_trial(trials, trial="bc")["key"] == "bc33"
    assert pick_trial(trials, trial="t4")["key"] == "cd44"
    with pytest.raises(ConfigError, match="ambiguous"):
        pick_trial(trials, trial="a")
    with pytest.raises(ConfigError, match="no trial 'zz'"):
        pick_trial(trials, trial="zz")
    with pytest.raises(ConfigError, match="not both"):
        pick_trial(trials, trial="bc", best=True)


def test_the_best_trial_follows_the_targets(trials):
    assert pick_trial(trials, best=True, max_latency_ms=3.0)["key"] == "bc33"      # most accurate within 3 ms
    assert pick_trial(trials, best=True, max_latency_ratio=0.3)["key"] == "bc33"   # the same target, as a ratio
    assert pick_trial(trials, best=True, min_accuracy=0.95)["key"] == "ab22"       # fastest at 0.95 or better
    assert pick_trial(trials, best=True, min_accuracy=0.95, max_latency_ms=2.5)["key"] == "ab22"
    assert pick_trial(trials, best=True)["key"] == "ab22"                          # highest score
    with pytest.raises(ConfigError, match="accuracy >= 0.999 and latency <= 1 ms"):
        pick_trial(trials, best=True, min_accuracy=0.999, max_latency_ms=1.0)


def test_a_failed_trial_is_never_the_best(trials):
    with pytest.raises(ConfigError, match="no finished trial"):
        pick_trial(trials, best=True, max_latency_ms=0.6)  # only the failed one is that fast


def test_nni_experiments_and_protocol_folders_are_results_too(tmp_path):
    shutil.copytree(SAVED, tmp_path / "saved")
    nni = load_trials(tmp_path / "saved" / "nni" / "hc2yfs3t")
    first = nni.dropna(subset=["nni_sequence"]).iloc[0]
    assert pick_trial(nni, trial=str(int(first["nni_sequence"])))["key"] == first["key"]
    assert len(load_trials(tmp_path / "saved" / "protocol")) > 0
    with pytest.raises((ConfigError, FileNotFoundError)):
        load_trials(tmp_path / "nothing-here")
