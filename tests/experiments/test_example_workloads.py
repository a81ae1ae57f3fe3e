"""The example workloads in experiments/workloads load by file reference and run a trial end to end (tiny variants)."""

from pathlib import Path

import pytest

from sparta_explore.explore.sweep import sweep
from sparta_explore.workload import load_workload

pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parents[2] / "experiments" / "workloads"


@pytest.fixture
def private_cache(cache_dir, monkeypatch):
    # the examples train into the sparta-explore cache: keep it inside the test session's
    monkeypatch.setenv("SPARTA_EXPLORE_CACHE", str(cache_dir))
    return cache_dir


# the two Hugging Face examples take ~35 s together: `slow`, since tests/test_compile_real_models.py already
# runs HF BERT and GPT-2's Conv1D through capture, pruning, propagation and compile in `make test`
@pytest.mark.parametrize("example, weights", [
    pytest.param("bert_digits", "bert.encoder.layer.0.intermediate.dense.weight", marks=pytest.mark.slow),
    pytest.param("gpt2_digits", "transformer.h.0.mlp.c_fc.weight",  # GPT-2's Conv1D: weight stored (in, out)
                 marks=pytest.mark.slow),
    ("resnet_cnn", "blocks.0.conv1.weight"),
])
def test_an_example_workload_runs_a_trial(example, weights, private_cache, tmp_path, device):
    ref = f"{EXAMPLES / example}.py:tiny"
    w = load_workload(ref)
    model = w.dense_model()
    assert weights in dict(model.named_parameters())
    assert w.evaluate(model) > 0.3  # trained: well above chance (0.1) on the held-out digits
    grid = {"workload": ref, "pattern": [{"pruner": "level", "block": None}], "sparsity": [0.5], "bits": [32],
            "finetune_epochs": 0, "batch": 8}
    df = sweep(grid, tmp_path / "sweep", progress=False,
               trial_kwargs={"cache_dir": private_cache, "runs": 2,
                             "compile_kwargs": {"device": device, "tune": False}})
    row = df.iloc[0]
    assert row["workload"] == ref and row["metric_name"] == w.metric_name
    assert row["max_error"] <= 1e-3 and row["latency_ms"] > 0
    assert 0.1 < row["sparsity_pruned"] <= 0.5 and row["flops_ratio"] < 1  # the head and embeddings stay dense
