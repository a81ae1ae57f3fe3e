"""LLM trials and the search loop on the tiny Llama: rows that say what ran, a log that resumes."""

import copy
import json
import math

import pytest
import torch

from sparta_explore.compile.decoder import rounded_inputs
from sparta_explore.compile.package.decoder_form import packed_for_decode
from sparta_explore.errors import ConfigError
from sparta_explore.explore.llm import search as search_module
from sparta_explore.explore.llm.compress import compress_llm
from sparta_explore.explore.llm.search import llm_search
from sparta_explore.explore.llm.space import LLMPoint, search_space
from sparta_explore.explore.llm.trial import TrialBudget, TrialLog, cost_models, run_llm_trial
from sparta_explore.kernels.decode_step import why_no_kernels
from sparta_explore.zoo.llm.workloads import smollm2_tiny_workload, tiny_llama

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(why_no_kernels() is not None, reason=str(why_no_kernels()))
BUDGET = TrialBudget(new=4, repeats=1)


@pytest.fixture(scope="module")
def workload():
    return smollm2_tiny_workload()


def test_a_trial_scores_the_compressed_model_and_times_its_decode(workload):
    point = LLMPoint.from_dict({"sparsity@mlp.0": 0.5, "bits@mlp.0": 4, "group@mlp.0": 32, "bits@attn.0": 8,
                                "act_bits": 8}, layers=2, bands=1)
    row = run_llm_trial(point, workload, BUDGET)
    model = copy.deepcopy(workload.dense_model())
    compress_llm(model, point, workload.calibration_inputs[0])  # deterministic: the trial's model again
    packed_for_decode(model)  # its weights as the step reads them
    with rounded_inputs(model):
        assert row["perplexity"] == pytest.approx(workload.evaluate(model), rel=1e-6)
    assert row["dense_accuracy"] == pytest.approx(workload.evaluate(workload.dense_model()))
    assert row["quality"] == pytest.approx(row["dense_accuracy"] / row["perplexity"])
    assert row["decode_tok_s"] > 0 and row["prefill_ms"] > 0 and row["dense_decode_ms"] > 0
    assert row["latency_ratio"] == pytest.approx(row["decode_ms"] / row["dense_decode_ms"])
    assert row["mb_token"] * 1e6 < row["bytes_token"] * 1.5  # packed: 4 / 8-bit codes and their grids
    assert 0.5 < row["flops_ratio"] < 1 and row["bytes_ratio"] < 0.5
    assert json.loads(row["key"])["bits@mlp.0"] == 4 and row["bits@mlp.0"] == 4


def test_cost_models_count_kept_weights_at_their_bits():
    model = tiny_llama(layers=1)
    head = 256 * 64  # the tied head: vocabulary x hidden
    dense = cost_models(model, None)
    assert dense["flops_token"] == 2 * (sum(m.weight.numel() for n, m in model.named_modules()
                                            if n.startswith("model.layers") and hasattr(m, "weight")
                                            and m.weight.dim() == 2) + head)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[:, ::2] = 0
    point = LLMPoint.from_dict({"sparsity@mlp.0": 0.5, "bits@mlp.0": 4, "head_bits": 8}, layers=1, bands=1)
    costs = cost_models(model, point)
    up = model.model.layers[0].mlp.up_proj.weight
    assert dense["flops_token"] - costs["flops_token"] == up.numel()  # half of up's products
    assert costs["bytes_token"] < dense["bytes_token"] / 2


def test_the_search_logs_every_trial_and_resumes_without_running_again(workload, tmp_path, monkeypatch):
    space = search_space(1, sparsities=(0.0, 0.5), bits=(32, 4), groups=(32, 128), compressors=("wanda",),
                         head_bits=(32,), act_bits=(8,))
    log = tmp_path / "trials.jsonl"
    lines = []
    first = llm_search(workload, trials=3, log=log, bands=1, space=space, startup=2, budget=BUDGET, echo=lines.append)
    assert len(first) == 3 and len(TrialLog(log).rows) == first["key"].nunique() == 3
    assert all("(ran)" in line for line in lines)
    assert first["search"].eq("latency").all() and first["quality"].gt(0).all()
    assert first["anchor"].tolist() == [True, False, False]  # the model as given comes first
    assert first.loc[0, "bits@mlp.0"] == 32 and first.loc[0, "sparsity@attn.0"] == 0.0
    assert first.loc[0, "quality"] == pytest.approx(1.0, rel=0.05)  # int8 inputs alone: near the dense

    def no_trials(*args, **kwargs):
        raise AssertionError("a logged point ran again")

    monkeypatch.setattr(search_module, "run_llm_trial", no_trials)
    again = llm_search(workload, trials=3, log=log, bands=1, space=space, startup=2, budget=BUDGET)
    assert again["key"].tolist() == first["key"].tolist()  # same seed, same rows: the same proposals
    assert again["decode_tok_s"].tolist() == first["decode_tok_s"].tolist()


def test_a_failing_trial_is_logged_with_its_error(workload, tmp_path, monkeypatch):
    def fails(point, *args, **kwargs):
        raise ConfigError("GPTQ cannot make this point")

    monkeypatch.setattr(search_module, "run_llm_trial", fails)
    space = search_space(1, sparsities=(0.0,), bits=(4,), groups=(32, 64), compressors=("wanda",), head_bits=(32,),
                         act_bits=(32,))
    rows = llm_search(workload, trials=2, log=tmp_path / "t.jsonl", bands=1, space=space, startup=1, budget=BUDGET)
    assert rows["error"].str.contains("GPTQ cannot make this point").all() and rows["quality"].isna().all()
    logged = TrialLog(tmp_path / "t.jsonl").rows
    assert len(logged) == 2 and all(math.isnan(r["quality"]) for r in logged.values())


def test_bad_search_arguments_and_logs_are_one_error(workload, tmp_path):
    with pytest.raises(ConfigError, match="guide must be one of latency, flops, bytes"):
        llm_search(workload, trials=1, log=tmp_path / "x.jsonl", guide="params")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"key": LLMPoint(bands=1).key()}) + '\nnot json\n{"key": "a"}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:2 is not a trial row"):
        TrialLog(bad)
    bad.write_text('{"key": "a"}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:1 is not a trial row"):
        TrialLog(bad)


def test_a_log_finds_rows_by_the_key_they_were_written_under_then_by_the_model(tmp_path):
    asked = LLMPoint.from_dict({"group@mlp.0": 32, "act_bits": 8}, layers=2, bands=1)  # group without bits: no-op
    same_model = LLMPoint.from_dict({"group@mlp.0": 64, "act_bits": 8}, layers=2, bands=1)
    log = TrialLog(tmp_path / "t.jsonl")
    log.add({"key": asked.asked_key(), "quality": 0.9})  # a row written under the point as asked
    log.add({"key": same_model.asked_key(), "quality": 0.8})  # the same model, measured again
    reread = TrialLog(tmp_path / "t.jsonl")
    assert reread.get(asked)["quality"] == 0.9 and reread.get(same_model)["quality"] == 0.8  # exact replays
    third = LLMPoint.from_dict({"group@mlp.0": 128, "act_bits": 8, "compressor": "sparsegpt"}, layers=2, bands=1)
    assert reread.get(third)["quality"] == 0.9  # asked afresh: the model's first row
    assert reread.get(LLMPoint.from_dict({"act_bits": 32}, layers=2, bands=1)) is None


def test_a_log_reads_back_only_the_rows_timed_on_the_machine_asked_for(tmp_path):
    point = LLMPoint.from_dict({"bits@mlp.0": 4, "act_bits": 8}, layers=2, bands=1)
    log = TrialLog(tmp_path / "t.jsonl", machine="avx2-2t")
    log.add({"key": point.key(), "machine": "avx2-2t", "latency_ratio": 0.7})
    log.add({"key": point.key(), "machine": "vnni-2t", "latency_ratio": 0.5})  # the same point on another CPU
    assert TrialLog(tmp_path / "t.jsonl", machine="vnni-2t").get(point)["latency_ratio"] == 0.5
    assert TrialLog(tmp_path / "t.jsonl", machine="avx2-2t").get(point)["latency_ratio"] == 0.7
    assert TrialLog(tmp_path / "t.jsonl", machine="avx2-1t").get(point) is None  # measured again there
    assert TrialLog(tmp_path / "t.jsonl").get(point)["latency_ratio"] == 0.7  # any machine: the first row
    assert len(TrialLog(tmp_path / "t.jsonl", machine="avx2-1t").rows) == 1  # rows by key: the last written
    broken = LLMPoint.from_dict({"bits@attn.0": 3}, layers=2, bands=1)
    log.add({"key": broken.key(), "error": "ValueError: no grid"})  # fails wherever it runs: read back anywhere
    elsewhere = TrialLog(tmp_path / "t.jsonl", machine="avx2-1t")
    assert elsewhere.get(broken)["error"] and [r["key"] for r in elsewhere.measured()] == [broken.key()]
    assert [r.get("latency_ratio") for r in TrialLog(tmp_path / "t.jsonl", machine="vnni-2t").measured()] == [0.5, None]


def test_a_search_times_again_what_another_machine_logged(workload, tmp_path):
    log = tmp_path / "t.jsonl"
    first = llm_search(workload, trials=1, log=log, bands=1, budget=BUDGET)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({**r, "machine": "elsewhere"}) + "\n" for r in rows))
    again = llm_search(workload, trials=1, log=log, bands=1, budget=BUDGET)
    assert len(log.read_text().splitlines()) == 2 and again["machine"][0] == first["machine"][0] != "elsewhere"
