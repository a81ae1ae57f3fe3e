"""NNI experiments: the YAML configs, exporting trials from NNI's database, and real experiments.

The real experiments run the real trial entry on a small setting (digits MLP, no
fine-tuning, a few timed runs) so that two trials take well under a minute.
"""

import json
import sqlite3
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from sparta_explore.cli import main as cli_main
from sparta_explore.errors import ConfigError, FileFormatError
from sparta_explore.explore.nni.experiment import (
    NNI_COLUMNS,
    ExperimentRun,
    export_trials,
    load_config,
    run_experiment,
    trial_counts,
)
from sparta_explore.explore.search.dimensions import Space
from sparta_explore.explore.sweep import load_results
from sparta_explore.explore.trial.result import ROW_COLUMNS

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENTS = ROOT / "experiments"
RUNNABLE = ["latency_guided.yml", "flops_guided.yml", "tpe_latency_guided.yml"]


@pytest.mark.parametrize("name", RUNNABLE)
def test_configs_work_from_the_project_root_with_no_edits(name):
    config = load_config(ExperimentRun(EXPERIMENTS / name)).canonical_copy()  # validates, as nnictl does
    assert Path(config.experiment_working_directory) == ROOT / "results" / "nni"
    assert Path(config.trial_code_directory) == ROOT
    assert Path(config.search_space_file) == EXPERIMENTS / "search_space.json"
    assert config.trial_concurrency == 2 and config.max_trial_number >= 8
    # one thread per trial: two trials on two cores measure latency without oversubscription
    assert config.trial_command.startswith("OMP_NUM_THREADS=1 .venv/bin/python -m sparta_explore.explore.nni.trial ")
    assert config.training_service.platform == "local"


def test_latency_and_flops_guided_runs_differ_only_in_the_guide():
    lat = yaml.safe_load((EXPERIMENTS / "latency_guided.yml").read_text())
    flo = yaml.safe_load((EXPERIMENTS / "flops_guided.yml").read_text())
    assert "--objective latency" in lat["trialCommand"] and "--objective flops" in flo["trialCommand"]
    assert lat["tuner"]["classArgs"].pop("cost") == "latency_ratio"
    assert flo["tuner"]["classArgs"].pop("cost") == "flops_ratio"
    for key in ("searchSpaceFile", "trialConcurrency", "maxTrialNumber", "experimentWorkingDirectory", "tuner"):
        assert lat[key] == flo[key], key


def test_the_custom_tuner_loads_the_way_nni_loads_it():
    from nni.tools.package_utils.tuner_factory import create_customized_class_instance

    tuner_cfg = yaml.safe_load((EXPERIMENTS / "latency_guided.yml").read_text())["tuner"]
    tuner = create_customized_class_instance({"codeDirectory": str(EXPERIMENTS / tuner_cfg["codeDirectory"]),
                                              "className": tuner_cfg["className"],
                                              "classArgs": tuner_cfg["classArgs"]})
    tuner.update_search_space(json.loads((EXPERIMENTS / "search_space.json").read_text()))
    assert tuner.search.space.contains(tuner.generate_parameters(0))


def test_remote_example_is_a_remote_config():
    from nni.experiment.config import ExperimentConfig

    config = ExperimentConfig.load(str(EXPERIMENTS / "remote_example.yml"))
    assert config.training_service.platform == "remote"
    assert len(config.training_service.machine_list) >= 2
    assert "python -m sparta_explore.explore.nni.trial" in config.trial_command
    assert ".venv" in (ROOT / ".nniignore").read_text().split()


# NNI's own schema (nni_node/core/sqlDatabase.js), for a database written by hand
SCHEMA = """
CREATE TABLE TrialJobEvent (timestamp integer, trialJobId text, event text, data text, logPath text,
                            sequenceId integer, message text, environmentId text);
CREATE TABLE MetricData (timestamp integer, trialJobId text, parameterId text, type text, sequence integer,
                         data text);
"""


def _fake_experiment(folder: Path) -> None:
    """Two trials whose parameters NNI swapped (issue 5726), and one that failed."""
    (folder / "db").mkdir(parents=True)
    params = [{"sparsity": 0.5, "block": "32x32"}, {"sparsity": 0.9, "block": "1x32"}, {"sparsity": 0.7,
                                                                                        "block": "1x32"}]
    db = sqlite3.connect(folder / "db" / "nni.sqlite")
    db.executescript(SCHEMA)
    t = 1000
    for seq, trial in enumerate(["AAAAA", "BBBBB", "CCCCC"]):
        form = json.dumps({"parameter_id": seq, "parameter_source": "algorithm", "parameters": params[seq]})
        db.execute("INSERT INTO TrialJobEvent VALUES (?, ?, 'WAITING', ?, NULL, ?, NULL, NULL)", (t, trial, form, seq))
        db.execute("INSERT INTO TrialJobEvent VALUES (?, ?, 'RUNNING', ?, NULL, ?, NULL, NULL)",
                   (t + 1, trial, form, seq))
        t += 10
    ran = {"AAAAA": 1, "BBBBB": 0}  # each trial ran the other's parameters
    for trial, pid in ran.items():
        p = params[pid]
        final = {"default": 0.8, "sparsity": p["sparsity"], "block": p["block"], "accuracy": 0.9 - pid / 10,
                 "latency_ms": 2.0 + pid, "score": 0.8, "nni_params": p, "params": {**p, "bits": 32}}
        db.execute("INSERT INTO MetricData VALUES (?, ?, ?, 'PERIODICAL', 0, ?)",
                   (t, trial, str(pid), json.dumps(json.dumps({"default": 1.0, "stage": "pruned"}))))
        db.execute("INSERT INTO MetricData VALUES (?, ?, ?, 'FINAL', 0, ?)",
                   (t + 1, trial, str(pid), json.dumps(json.dumps(final))))
        db.execute("INSERT INTO TrialJobEvent VALUES (?, ?, 'SUCCEEDED', NULL, NULL, NULL, NULL, NULL)", (t + 2, trial))
        t += 10
    db.execute("INSERT INTO TrialJobEvent VALUES (?, 'CCCCC', 'FAILED', NULL, NULL, NULL, NULL, NULL)", (t,))
    db.commit()
    db.close()


def test_export_takes_params_from_the_echo_and_flags_nni_swaps(tmp_path):
    folder = tmp_path / "k3j5x9qz"
    _fake_experiment(folder)
    df = export_trials(folder)
    assert list(df.columns) == list(ROW_COLUMNS) + list(NNI_COLUMNS)
    assert df["nni_trial"].tolist() == ["AAAAA", "BBBBB"]
    # trial AAAAA was recorded by NNI with sparsity 0.5, but ran (and measured) 0.9
    assert df["sparsity"].tolist() == [0.9, 0.5] and df["block"].tolist() == ["1x32", "32x32"]
    assert df["accuracy"].tolist() == [0.8, 0.9] and df["nni_parameter_id"].tolist() == [1, 0]
    assert df["nni_params_matched"].tolist() == [False, False]
    assert json.loads(df["nni_params"][0]) == {"block": "1x32", "sparsity": 0.9}
    assert trial_counts(folder) == {"SUCCEEDED": 2, "FAILED": 1}
    with pytest.raises(FileNotFoundError, match="no NNI database"):
        export_trials(tmp_path)


def test_cli_exports_an_experiment_folder(tmp_path, capsys):
    folder = tmp_path / "k3j5x9qz"
    _fake_experiment(folder)
    assert cli_main(["nni", str(folder)]) == 0
    assert "trials {'SUCCEEDED': 2, 'FAILED': 1}, 2 rows" in capsys.readouterr().out
    assert load_results(folder / "results.csv")["nni_trial"].tolist() == ["AAAAA", "BBBBB"]


def test_a_busy_port_is_refused_before_nni_starts(tmp_path, monkeypatch):
    import socket

    started = []
    monkeypatch.setattr("nni.experiment.Experiment.start", lambda self, *a, **k: started.append(a))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} is in use"):
            run_experiment(ExperimentRun(EXPERIMENTS / "latency_guided.yml", port=port), echo=None)
    assert not started
    with pytest.raises(ConfigError, match="port must be in 1..65535"):
        ExperimentRun(EXPERIMENTS / "latency_guided.yml", port=99999)


def test_a_corrupt_nni_database_is_one_error(tmp_path):
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "nni.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(FileFormatError, match="nni.sqlite is not a readable NNI database"):
        export_trials(tmp_path)


# ---- real experiments ---------------------------------------------------------------

QUICK_SPACE = {"sparsity": {"_type": "choice", "_value": [0.5, 0.75]},
               "block": {"_type": "choice", "_value": ["32x32", "1x32"]}}


@pytest.fixture
def quick_config(tmp_path, trained, device, cache_dir):
    """An experiment YAML whose trials take seconds: digits MLP, no fine-tuning, 3 timed runs."""
    trained("digits-mlp")  # trained once here, not by two trials at the same time
    (tmp_path / "space.json").write_text(json.dumps(QUICK_SPACE))

    def write(tuner, trials=2):
        command = (f"OMP_NUM_THREADS=1 {sys.executable} -m sparta_explore.explore.nni.trial --model digits-mlp "
                   f"--objective latency --finetune-epochs 0 --set batch=8 --runs 3 --warmup 1 --cache-dir {cache_dir} "
                   "--quick-profile --compile tune=false")
        config = {"searchSpaceFile": "space.json", "trialCommand": command, "trialCodeDirectory": str(ROOT),
                  "trialConcurrency": 2, "maxTrialNumber": trials, "experimentWorkingDirectory": "nni",
                  "tuner": tuner, "trainingService": {"platform": "local"}}
        path = tmp_path / "quick.yml"
        path.write_text(yaml.safe_dump(config))
        return path
    return write


def _nni_processes(experiment_id: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if experiment_id in cmd or proc.environ().get("NNI_EXP_ID") == experiment_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _check_outcome(outcome, trials):
    assert outcome.counts == {"SUCCEEDED": trials}, outcome.counts
    df = load_results(outcome.csv)
    assert list(df.columns[: len(ROW_COLUMNS)]) == list(ROW_COLUMNS)
    assert len(df) == trials and df["nni_trial"].is_unique
    space = Space.from_nni(QUICK_SPACE)
    for _, row in df.iterrows():
        echoed = json.loads(row["nni_params"])
        assert space.contains(echoed)
        assert (row["sparsity"], row["block"]) == (echoed["sparsity"], echoed["block"])  # the params that ran
        assert 0.0 <= row["accuracy"] <= 1.0 and row["latency_ms"] > 0 and row["dense_latency_ms"] > 0
        assert row["workload"] == "digits-mlp" and row["objective"] == "latency"
    # the in-order handshake kept NNI's own record right, even with two trials at once
    assert df["nni_params_matched"].astype(bool).all()
    assert not _nni_processes(outcome.id), "NNI manager or trials still running after stop"
    return df


@pytest.mark.first
def test_two_trial_experiment_with_the_pareto_tuner(quick_config):
    config = quick_config({"codeDirectory": str(ROOT), "className": "sparta_explore.explore.nni.tuner.ParetoTuner",
                           "classArgs": {"startup": 1, "seed": 0}})
    outcome = run_experiment(ExperimentRun(config, timeout_s=240, poll_s=1.0), echo=None)
    df = _check_outcome(outcome, 2)
    assert outcome.directory.parent == config.parent / "nni"  # relative to the YAML, as with nnictl
    assert df[["sparsity", "block"]].drop_duplicates().shape[0] == 2  # the tuner never repeats a point


@pytest.mark.slow  # 60 s: four concurrent NNI trials (make test-slow); the handshake's unit tests run in make test
def test_builtin_tpe_survives_concurrent_trials(quick_config):
    # without the in-order handshake NNI issue 5726 makes TPE raise KeyError within a few trials
    config = quick_config({"name": "TPE", "classArgs": {"optimize_mode": "maximize", "seed": 0}}, trials=4)
    outcome = run_experiment(ExperimentRun(config, timeout_s=480, poll_s=1.0), echo=None)
    _check_outcome(outcome, 4)
    assert outcome.status == "DONE"
