"""Export: a tiny sweep's best trial rebuilt from its row, its metric reproduced, saved, and loaded back."""


import pytest

import sparta_explore as se
from sparta_explore.cli import main
from sparta_explore.explore.export import load_trials, pick_trial
from sparta_explore.explore.export.rebuild import _differences
from sparta_explore.explore.sweep import sweep
from sparta_explore.workload import load_workload


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory, cache_dir):
    out = tmp_path_factory.mktemp("sweep")
    sweep({"workload": "digits-mlp", "sparsity": [0.75], "block": ["32x32"], "bits": [32, 8], "finetune_epochs": 1},
          out, progress=False, trial_kwargs={"cache_dir": cache_dir, "runs": 2, "compile_kwargs": {"tune": False}})
    return out


def test_the_best_trial_of_a_sweep_exports_with_its_metric_reproduced(tiny_sweep, cache_dir, capsys):
    df = load_trials(tiny_sweep)
    floor = float(df["accuracy"].median())
    row = pick_trial(df, best=True, min_accuracy=floor)
    status = main(["export", str(tiny_sweep), "--best", "--min-accuracy", str(floor), "--runs", "2",
                   "--cache-dir", str(cache_dir)])
    out = capsys.readouterr().out
    assert status == 0, out
    path = tiny_sweep / "exported" / f"{row['key']}.sparta"
    assert f"wrote {path}" in out and "reproduced exactly" in out and "latency" in out
    cm = se.load(path, cache_dir=cache_dir)
    meta = cm.record.loaded["manifest"]["metadata"]
    assert meta["trial"]["key"] == row["key"] and meta["metric"] == meta["row_metric"] == row["accuracy"]
    assert meta["trial"]["params"]["sparsity"] == row["sparsity"] and meta["differences"] == []
    workload = load_workload("digits-mlp", cache_dir=cache_dir)
    assert workload.evaluate(cm) == row["accuracy"]  # the loaded package scores what the sweep's row says


def test_constraints_belong_to_best(tiny_sweep, capsys):
    assert main(["export", str(tiny_sweep), "--trial", "abc", "--min-accuracy", "0.5"]) == 2
    assert "pick the --best trial" in capsys.readouterr().err


def test_every_difference_from_the_row_is_named_with_its_cause():
    row = {"machine": "aaaa", "cpu_model": "Other CPU", "accuracy": 0.95, "finetuned_accuracy": 0.96,
           "kernel_choices": "fc1:sparse;fc2:int8"}
    said = _differences(row, metric=0.94, finetuned=0.96, choices="fc1:dense;fc2:int8", guard=None, machine="bbbb")
    assert len(said) == 2
    assert "machine aaaa (Other CPU)" in said[0] and "fc1: sparse -> dense" in said[1] and "fine-tuned equal" in said[1]
    same = {**row, "machine": "bbbb"}
    assert _differences(same, metric=0.95, finetuned=0.96, choices="fc1:sparse;fc2:int8", guard=None,
                        machine="bbbb") == []
    said = _differences(same, metric=0.95, finetuned=0.97, choices="fc1:sparse;fc2:int8", guard=None, machine="bbbb")
    assert "did not repeat bit for bit on the same machine" in said[0]
