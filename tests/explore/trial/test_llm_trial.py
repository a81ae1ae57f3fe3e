"""A whole trial on the tiny Llama: compressed by a calibrating compressor, compiled in place, scored by perplexity.

Perplexity is lower-is-better: the row carries the direction and the quality (dense / trial
perplexity) that fronts, objectives and picks rank by; the compiled model's perplexity is
the compressed (masked) model's; the picked trial exports and loads as a package.
"""

import math

import pandas as pd
import pytest
import torch

import sparta_explore as se
from sparta_explore.explore.export import export_trial, pick_trial
from sparta_explore.explore.report.pareto import pareto_front
from sparta_explore.explore.trial.objectives import score
from sparta_explore.explore.trial.run import run_trial

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llm_row(cache_dir, device):
    result = run_trial({"workload": "smollm2-tiny", "pruner": "wanda", "sparsity": 0.5, "block": None,
                        "finetune_epochs": 0, "objective": "latency", "target": 0.9},
                       cache_dir=cache_dir, runs=3, warmup=1, compile_kwargs={"device": device})
    return result.as_row()


def test_an_llm_trial_runs_compiled_in_place_and_scores_as_the_compressed_model(llm_row):
    row = llm_row
    assert row["metric_name"] == "perplexity" and row["higher_is_better"] is False
    assert math.isfinite(row["accuracy"]) and row["accuracy"] > 1.0
    # compiled in place: the kernels compute what the masked model did, on the 64-token windows
    assert row["accuracy"] == pytest.approx(row["finetuned_accuracy"], rel=1e-3)
    assert row["max_error"] < 1e-3
    assert 0.3 < row["sparsity_pruned"] < 0.5  # half of each decoder linear; the embedding stays dense
    assert row["quality"] == pytest.approx(row["dense_accuracy"] / row["accuracy"])
    assert row["score"] == score(row, "latency", 0.9)


def test_fronts_and_picks_prefer_the_lower_perplexity(llm_row):
    worse = {**llm_row, "key": "worse", "accuracy": llm_row["accuracy"] * 2, "quality": None}
    faster_worse = {**worse, "key": "faster", "latency_ms": llm_row["latency_ms"] / 2}
    df = pd.DataFrame([llm_row, worse, faster_worse])
    assert pareto_front(df)["key"].tolist() == ["faster", llm_row["key"]]  # "worse" is dominated
    assert pick_trial(df, best=True, max_latency_ms=llm_row["latency_ms"])["key"] == llm_row["key"]
    # a ceiling on perplexity: the fastest trial at or under it
    assert pick_trial(df, best=True, min_accuracy=llm_row["accuracy"] * 1.01)["key"] == llm_row["key"]
    assert pick_trial(df, best=True, min_accuracy=llm_row["accuracy"] * 3)["key"] == "faster"


def test_the_llm_trial_exports_and_loads_as_a_package(llm_row, cache_dir, tmp_path):
    exported = export_trial(llm_row, tmp_path / "tiny.sparta", cache_dir=cache_dir, runs=3)
    assert exported.metric == pytest.approx(llm_row["accuracy"], rel=1e-3)
    model = se.load(exported.path)
    ids = torch.tensor([[72, 101, 108, 108, 111, 32]])
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 10)
