"""The LLM search under nnictl: the shipped config validates from the project root; a two-trial experiment on
the tiny Llama runs the real trial entry and exports its rows."""

import json
import sys
from pathlib import Path

import pytest
import yaml

from sparta_explore.explore.llm.space import LLMPoint, search_space
from sparta_explore.explore.llm.trial import TrialLog
from sparta_explore.explore.nni.experiment import ExperimentRun, load_config, run_experiment
from sparta_explore.explore.search.dimensions import Space
from sparta_explore.explore.sweep import load_results
from sparta_explore.kernels.decode_step import why_no_kernels

ROOT = Path(__file__).resolve().parents[3]
pytest.importorskip("transformers")


def test_the_llm_config_works_from_the_project_root_with_no_edits():
    config = load_config(ExperimentRun(ROOT / "experiments" / "llm_latency_guided.yml")).canonical_copy()
    assert Path(config.search_space_file) == ROOT / "experiments" / "search_space_llm.json"
    assert Path(config.trial_code_directory) == ROOT and config.trial_concurrency == 1
    assert config.trial_command.startswith(".venv/bin/python -m sparta_explore.explore.llm.nni_trial ")
    assert config.tuner.class_args["cost"] == "latency_ratio"
    shipped = json.loads((ROOT / "experiments" / "search_space_llm.json").read_text())
    assert shipped == search_space(3)  # regenerated whenever the space changes


@pytest.mark.first
@pytest.mark.skipif(why_no_kernels() is not None, reason=str(why_no_kernels()))
def test_a_two_trial_llm_experiment_with_the_pareto_tuner(tmp_path):
    space = search_space(1, sparsities=(0.0, 0.5), bits=(32, 4), groups=(32,), compressors=("wanda",),
                         head_bits=(32,), act_bits=(8,))
    (tmp_path / "space.json").write_text(json.dumps(space))
    log = tmp_path / "trials.jsonl"
    command = (f"{sys.executable} -m sparta_explore.explore.llm.nni_trial --workload smollm2-tiny --bands 1 "
               f"--new 4 --repeats 1 --log {log}")
    config = {"searchSpaceFile": "space.json", "trialCommand": command, "trialCodeDirectory": str(ROOT),
              "trialConcurrency": 1, "maxTrialNumber": 2, "experimentWorkingDirectory": "nni",
              "tuner": {"codeDirectory": str(ROOT), "className": "sparta_explore.explore.nni.tuner.ParetoTuner",
                        "classArgs": {"cost": "latency_ratio", "startup": 1, "seed": 0}},
              "trainingService": {"platform": "local"}}
    path = tmp_path / "llm.yml"
    path.write_text(yaml.safe_dump(config))
    outcome = run_experiment(ExperimentRun(path, timeout_s=300, poll_s=1.0), echo=None)
    assert outcome.counts == {"SUCCEEDED": 2}, outcome.counts
    df = load_results(outcome.csv)
    logged = TrialLog(log).rows
    assert len(df) == 2 and len(logged) == 2
    for _, row in df.iterrows():
        echoed = json.loads(row["nni_params"])
        assert Space.from_nni(space).contains(echoed)
        assert LLMPoint.from_dict(echoed, layers=2, bands=1).key() in logged  # the row of the point that ran
        assert row["perplexity"] > 1 and row["decode_tok_s"] > 0 and row["quality"] > 0


@pytest.mark.skipif(why_no_kernels() is not None, reason=str(why_no_kernels()))
def test_trials_in_separate_processes_share_calibration_prefixes_through_files(tmp_path):
    from sparta_explore.explore.llm.nni_trial import build_parser, run

    args = build_parser().parse_args(["--workload", "smollm2-tiny", "--bands", "2", "--new", "4", "--repeats", "1",
                                      "--log", str(tmp_path / "trials.jsonl")])
    first = run(args, {"sparsity@mlp.0": 0.5, "bits@mlp.1": 4})  # each run holds its own in-memory cache
    assert first["blocks_reused"] == 0 and len(list((tmp_path / "prefix-cache").glob("*.safetensors"))) == 2
    second = run(args, {"sparsity@mlp.0": 0.5, "bits@mlp.1": 8})  # the same first band, read from its file
    assert second["blocks_reused"] == 1
    off = build_parser().parse_args(["--workload", "smollm2-tiny", "--bands", "2", "--new", "4", "--repeats", "1",
                                     "--log", str(tmp_path / "other.jsonl"), "--prefix-cache-gb", "0"])
    assert run(off, {"sparsity@mlp.0": 0.5, "bits@mlp.1": 3})["blocks_reused"] == 0  # sharing off
