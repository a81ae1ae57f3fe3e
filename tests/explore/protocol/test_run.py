"""The latency-vs-FLOPs protocol: same start and budget for every search, resumable, failures kept, real trials."""

import json

import pandas as pd
import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.protocol.report import write_protocol_report
from sparta_explore.explore.protocol.run import (
    VISITS_CSV,
    ProtocolConfig,
    default_out,
    load_protocol,
    run_protocol,
    start_points,
)
from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.explore.trial.result import METRIC_FIELDS, TrialResult
from sparta_explore.machine import this_machine

GAIN = {"level": 0.2, "l1norm": 0.9, "block": 0.8, "nm": 0.0}  # what a kernel makes of the pruned share


def family_result(params: TrialParams) -> TrialResult:
    """Plausible rows: FLOPs follow the sparsity; latency follows the family and the bits, as kernels do."""
    s = sum(dict(params.layer_sparsity).values()) / max(len(params.layer_sparsity), 1) or params.sparsity
    latency = 10.0 * (1.0 - GAIN[params.pruner] * s) * (0.4 if params.bits <= 8 and params.act_bits != 32 else 1.0)
    accuracy = 0.97 - 0.3 * s ** 4 - (0.01 if params.bits == 4 else 0.0)
    accuracy -= 0.05 * s if params.pruner == "l1norm" else 0.0
    m = dict.fromkeys(METRIC_FIELDS, 1.0)
    m.update(accuracy=accuracy, dense_accuracy=0.97, latency_ms=latency, dense_latency_ms=10.0, dense_flops=1e9,
             effective_flops=1e9 * (1.0 - s), wall_s=0.01)
    return TrialResult(params, **m, machine=this_machine().columns())


def counting(fn):
    def trial(params):
        trial.calls += 1
        return fn(params)
    trial.calls = 0
    return trial


CFG = ProtocolConfig("digits-mlp", budget=7, seeds=(0, 1), startup=3, target=0.3)


def test_every_search_gets_the_budget_and_the_same_random_start(tmp_path):
    fn = counting(family_result)
    visits = run_protocol(CFG, tmp_path, trial_fn=fn, echo=lambda _: None)
    assert visits.groupby(["seed", "search"]).size().tolist() == [7] * 8
    for seed, rows in visits.groupby("seed"):
        starts = {search: tuple(r["key"][:3]) for search, r in rows.groupby("search")}
        assert len(set(starts.values())) == 1, f"seed {seed}: searches started from different points"
    # a point two searches (or a search and the start) share is measured once
    assert fn.calls == visits.drop_duplicates(["seed", "key"]).shape[0] == len(list((tmp_path / "rows").glob("*")))
    assert (tmp_path / VISITS_CSV).exists()


def test_a_rerun_replays_from_disk_without_running_a_trial(tmp_path):
    first = run_protocol(CFG, tmp_path, trial_fn=family_result, echo=lambda _: None)
    never = counting(lambda p: pytest.fail(f"trial {p} ran again"))
    again = run_protocol(CFG, tmp_path, trial_fn=never, echo=lambda _: None)
    pd.testing.assert_frame_equal(first, again)
    assert never.calls == 0


def test_a_killed_run_resumes_where_it_stopped(tmp_path):
    whole = run_protocol(CFG, tmp_path / "whole", trial_fn=family_result, echo=lambda _: None)
    limit = {"left": 9}

    def dies(params):
        if limit["left"] == 0:
            raise KeyboardInterrupt  # what a kill looks like from inside: not a trial failure
        limit["left"] -= 1
        return family_result(params)
    with pytest.raises(KeyboardInterrupt):
        run_protocol(CFG, tmp_path / "cut", trial_fn=dies, echo=lambda _: None)
    resumed = run_protocol(CFG, tmp_path / "cut", trial_fn=family_result, echo=lambda _: None)
    pd.testing.assert_frame_equal(whole, resumed)


def test_a_failing_trial_is_stored_with_its_error_and_not_retried(tmp_path):
    def flaky(params):
        if params.pruner == "nm":
            raise RuntimeError("no kernel for this")
        return family_result(params)
    run_protocol(CFG, tmp_path, trial_fn=flaky, echo=lambda _: None)
    df = load_protocol(tmp_path)
    failed = df[df["pruner"] == "nm"]
    assert len(failed) > 0 and failed["accuracy"].isna().all()
    assert (failed["error"] == "RuntimeError: no kernel for this").all()
    again = counting(family_result)
    run_protocol(CFG, tmp_path, trial_fn=again, echo=lambda _: None)
    assert again.calls == 0


def test_a_folder_of_another_protocol_is_refused(tmp_path):
    run_protocol(CFG, tmp_path, trial_fn=family_result, echo=lambda _: None)
    other = ProtocolConfig("digits-mlp", budget=8, seeds=(0, 1), startup=3, target=0.3)
    with pytest.raises(ConfigError, match="holds a run of another protocol"):
        run_protocol(other, tmp_path, trial_fn=family_result, echo=lambda _: None)


@pytest.mark.parametrize("kwargs,match", [({"budget": 3, "startup": 3}, "startup"),
                                          ({"seeds": ()}, "seeds"),
                                          ({"searches": ("latency", "nsga")}, "unknown search 'nsga'"),
                                          ({"fixed": {"seed": 3}}, "set by the protocol"),
                                          ({"fixed": {"batchsize": 3}}, "unknown trial parameter 'batchsize'")])
def test_bad_configs_fail_before_any_trial(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ProtocolConfig("digits-mlp", **kwargs)


def test_start_points_are_distinct_and_depend_on_the_seed():
    space = {"a": {"_type": "choice", "_value": list(range(20))}}
    a, b = start_points(space, 0, 8), start_points(space, 1, 8)
    assert len({p["a"] for p in a}) == 8 and a != b and a == start_points(space, 0, 8)


def test_results_live_in_one_folder_per_machine():
    assert default_out("digits-ffn").name == this_machine().key


def test_real_trials_end_to_end_with_the_report(tmp_path):
    cfg = ProtocolConfig("digits-mlp", budget=3, seeds=(0,), startup=2, target=0.5, searches=("latency", "flops"),
                         fixed={"finetune_epochs": 0}, runs=3)
    visits = run_protocol(cfg, tmp_path, echo=lambda _: None)
    df = load_protocol(tmp_path)
    assert len(visits) == 6 and df["accuracy"].notna().all() and (df["latency_ms"] > 0).all()
    assert (df["machine"] == this_machine(int(df["threads"].iloc[0])).key).all()
    assert df["params_json"].map(lambda j: json.loads(j)["seed"]).eq(0).all()
    text = write_protocol_report(tmp_path)
    assert "## Mean +- standard deviation" in text and (tmp_path / "fronts.png").stat().st_size > 10_000
    assert "| latency |" in text and "| flops |" in text
