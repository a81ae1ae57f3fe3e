"""Sweeps: grid expansion, and a resumable results folder (killed, failed, extended) with no lost or doubled rows."""

import json
import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from sparta_explore.errors import ConfigError, FileFormatError
from sparta_explore.explore.sweep import CorruptRowWarning, expand_grid, load_results, read_grid, set_aside, sweep
from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.explore.trial.result import ROW_COLUMNS

from ..conftest import GRID, synthetic_result


def test_grid_is_a_product_in_axis_order():
    points = expand_grid({"sparsity": [0.5, 0.9], "bits": [32, 8]}, base={"model": "digits-mlp"})
    assert [(p.sparsity, p.bits) for p in points] == [(0.5, 32), (0.5, 8), (0.9, 32), (0.9, 8)]
    assert all(p.workload == "digits-mlp" for p in points)


def test_dict_axes_set_fields_together_and_duplicates_drop():
    points = expand_grid({"pattern": [{"pruner": "block", "block": "32x32"}, {"pruner": "l1norm", "block": None}],
                          "sparsity": [0.5, 0.5], "model": "digits-mlp"})
    assert [(p.pruner, p.block, p.sparsity) for p in points] == [("block", (32, 32), 0.5), ("l1norm", None, 0.5)]
    listed = expand_grid([{"sparsity": 0.5}, TrialParams(sparsity=0.5), {"sparsity": 0.7}])
    assert [p.sparsity for p in listed] == [0.5, 0.7]


@pytest.mark.parametrize("grid, match", [
    ({"sparsity": []}, "has no values"),
    ({"pattern": [{"pruner": "block"}, "l1norm"]}, "mixes dicts"),
    ({"spasity": [0.5]}, "unknown trial parameter 'spasity'"),
    ("sparsity", "dict of axes or a list"),
])
def test_bad_grids(grid, match):
    with pytest.raises(ConfigError, match=match):
        expand_grid(grid)


def test_sweep_writes_rows_csv_and_returns_grid_order(tmp_path, fake_trial):
    df = sweep(GRID, tmp_path / "s", trial_fn=fake_trial, progress=False)
    points = expand_grid(GRID)
    assert len(df) == len(points) == 18 and len(fake_trial.calls) == 18
    assert df["key"].tolist() == [p.key for p in points]
    assert list(df.columns[:len(ROW_COLUMNS)]) == list(ROW_COLUMNS)
    assert len(list((tmp_path / "s" / "rows").glob("*.json"))) == 18
    csv = pd.read_csv(tmp_path / "s" / "results.csv")
    assert sorted(csv["key"]) == sorted(df["key"]) and csv["block"].isin(["32x32", "1x32", "1x1"]).all()
    # the row echoes the params it ran, and its score follows its objective
    first = df.iloc[0]
    assert TrialParams.from_dict(json.loads(first["params_json"])) == points[0]
    assert first["score"] == pytest.approx(synthetic_result(points[0]).score)


def test_failed_trial_keeps_finished_rows_and_resume_runs_only_the_rest(tmp_path, fake_trial):
    out = tmp_path / "s"

    def dies_on_fifth(params):
        if len(fake_trial.calls) == 4:
            raise RuntimeError("injected failure")
        return fake_trial(params)
    with pytest.raises(RuntimeError, match="injected"):
        sweep(GRID, out, trial_fn=dies_on_fifth, progress=False)
    assert len(load_results(out)) == 4 and len(pd.read_csv(out / "results.csv")) == 4
    fake_trial.calls.clear()
    df = sweep(GRID, out, trial_fn=fake_trial, progress=False)
    assert len(fake_trial.calls) == 14  # 18 points, 4 done before the failure
    assert df["key"].is_unique and len(df) == 18
    assert len(pd.read_csv(out / "results.csv")) == 18
    fake_trial.calls.clear()
    assert sweep(GRID, out, trial_fn=fake_trial, progress=False)["key"].tolist() == df["key"].tolist()
    assert fake_trial.calls == []  # a finished sweep runs nothing


KILLED_SWEEP = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from explore.conftest import GRID, synthetic_result
    from sparta_explore.explore.sweep import sweep
    calls = []
    def trial(params):
        calls.append(params)
        if len(calls) == 7:  # mid-sweep, mid-trial: no chance to clean up
            os.kill(os.getpid(), signal.SIGKILL)
        return synthetic_result(params)
    sweep(GRID, {out!r}, trial_fn=trial, progress=False)
""")


def test_killed_sweep_loses_nothing_and_resumes(tmp_path, fake_trial):
    out = tmp_path / "s"
    tests = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", KILLED_SWEEP.format(tests=tests, out=str(out))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert len(load_results(out)) == 6 and len(pd.read_csv(out / "results.csv")) == 6
    assert not [p for p in (out / "rows").iterdir() if not p.name.endswith(".json")]  # no torn files
    df = sweep(GRID, out, trial_fn=fake_trial, progress=False)
    assert len(fake_trial.calls) == 12 and len(df) == 18 and df["key"].is_unique
    assert sorted(pd.read_csv(out / "results.csv")["key"]) == sorted(df["key"])


def test_extending_a_grid_runs_only_new_points_and_csv_keeps_all(tmp_path, fake_trial):
    out = tmp_path / "s"
    sweep({"model": "digits-mlp", "sparsity": [0.5]}, out, trial_fn=fake_trial, progress=False)
    df = sweep({"model": "digits-mlp", "sparsity": [0.5, 0.75]}, out, trial_fn=fake_trial, progress=False)
    assert [p.sparsity for p in fake_trial.calls] == [0.5, 0.75] and len(df) == 2
    only_new = sweep({"model": "digits-mlp", "sparsity": [0.75]}, out, trial_fn=fake_trial, progress=False)
    assert len(only_new) == 1 and len(load_results(out)) == 2
    pd.testing.assert_frame_equal(load_results(out / "results.csv")[["key", "accuracy"]],
                                  load_results(out)[["key", "accuracy"]])


def test_trial_kwargs_only_with_the_default_trial(tmp_path, fake_trial):
    with pytest.raises(ConfigError, match="trial_kwargs"):
        sweep({"model": "digits-mlp"}, tmp_path, trial_fn=fake_trial, trial_kwargs={"runs": 3})


def test_load_results_of_nothing_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results"):
        load_results(tmp_path)


@pytest.mark.parametrize("damage", [
    lambda p: p.write_bytes(p.read_bytes()[:30]),   # truncated
    lambda p: p.write_text("{}"),                    # no key, no row
    lambda p: p.write_bytes(b""),                    # empty
    lambda p: p.write_bytes(b"\xff\xfe\x00\x01"),    # not UTF-8
    lambda p: p.write_text("[1, 2]"),                # JSON, not a record
    lambda p: p.write_text(json.dumps({"key": "someone-else", "row": {}})),  # not its own key
])
def test_a_corrupt_row_is_set_aside_and_its_trial_reruns(tmp_path, fake_trial, damage):
    out = tmp_path / "s"
    sweep(GRID, out, trial_fn=fake_trial, progress=False)
    rows = sorted((out / "rows").glob("*.json"))
    victim, others = rows[3], {p.name: p.read_bytes() for p in rows if p != rows[3]}
    damage(victim)
    with pytest.warns(CorruptRowWarning, match=victim.name):
        df = load_results(out)  # what plot and report read
    assert len(df) == len(rows) - 1
    assert (out / "rows" / f"{victim.name}.bad").exists() and not victim.exists()
    fake_trial.calls.clear()
    df = sweep(GRID, out, trial_fn=fake_trial, progress=False)
    assert len(fake_trial.calls) == 1 and fake_trial.calls[0].key == victim.stem  # only the lost trial reruns
    assert len(df) == len(rows) and df["key"].is_unique
    assert all((out / "rows" / name).read_bytes() == blob for name, blob in others.items())  # nothing else touched


def test_a_second_bad_copy_does_not_overwrite_the_first(tmp_path):
    path = tmp_path / "k.json"
    path.write_text("{")
    first = set_aside(path)
    path.write_text("[")
    second = set_aside(path)
    assert (first.name, second.name) == ("k.json.bad", "k.json.bad1")
    assert first.read_text() == "{" and second.read_text() == "["


@pytest.mark.parametrize("content, match", [
    (b"\xff\xfe", "not UTF-8"),
    (b"{", "not a JSON grid"),
    (b"[]", "expected a non-empty"),
    (b'{"spasity": [0.5]}', "unknown trial parameter 'spasity'"),
])
def test_grid_files_are_checked_before_any_trial(tmp_path, content, match):
    path = tmp_path / "grid.json"
    path.write_bytes(content)
    with pytest.raises((ConfigError, FileFormatError), match=match) as info:
        read_grid(path)
    assert "grid.json" in str(info.value)


@pytest.mark.parametrize("content, match", [
    (b"\xff\xfe\x00x", "not a results CSV"),
    (b"a,b\n1,2\n", "no column"),
    (b"", "not a results CSV"),
])
def test_a_csv_that_is_not_a_results_table_is_one_error(tmp_path, content, match):
    path = tmp_path / "r.csv"
    path.write_bytes(content)
    with pytest.raises(FileFormatError, match=match):
        load_results(path)
