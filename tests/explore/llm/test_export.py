"""An LLM search trial exported as a decoder package: picked from the log, loaded in a fresh process, decoding."""

import copy
import dataclasses
import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

import sparta_explore as se
from sparta_explore.cli import main as cli_main
from sparta_explore.compile.package.decoder_form import packed_for_decode
from sparta_explore.errors import ConfigError
from sparta_explore.explore.export import load_trials, pick_trial
from sparta_explore.explore.llm.compress import compress_llm
from sparta_explore.explore.llm.export import export_llm_trial, point_of_row, trial_id
from sparta_explore.explore.llm.search import failed_row
from sparta_explore.explore.llm.space import LLMPoint
from sparta_explore.explore.llm.trial import TrialBudget, TrialLog, run_llm_trial
from sparta_explore.kernels.decode_step import why_no_kernels
from sparta_explore.zoo.llm.workloads import smollm2_tiny_workload

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(why_no_kernels() is not None, reason=str(why_no_kernels()))
BUDGET = TrialBudget(new=4, repeats=1)
PICK = {"sparsity@attn.0": 0.5, "bits@mlp.0": 4, "group@mlp.0": 32, "head_bits": 8, "act_bits": 8}


@pytest.fixture(scope="module")
def workload():
    return smollm2_tiny_workload()


@pytest.fixture(scope="module")
def log(workload, tmp_path_factory):
    """A log of two trials (the pick: sparse attention, 4-bit MLPs, 8-bit head, int8 acts; and the model as given)
    and one that failed."""
    path = tmp_path_factory.mktemp("llm") / "trials.jsonl"
    trials = TrialLog(path)
    for params in (PICK, {"act_bits": 32}):
        trials.add(run_llm_trial(LLMPoint.from_dict(params, layers=2, bands=1), workload, BUDGET))
    broken = LLMPoint.from_dict({"bits@attn.0": 3}, layers=2, bands=1)
    trials.add(failed_row(broken, workload, ValueError("no grid")))
    return path


def test_the_cli_exports_a_logged_trial_and_a_fresh_process_reproduces_it(log, workload, tmp_path, capsys):
    key = LLMPoint.from_dict(PICK, layers=2, bands=1).key()
    out = tmp_path / "pick.sparta"
    args = ["export", str(log), "--trial", trial_id(key), "--out", str(out), "--calibration-windows", "4"]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "perplexity" in printed
    row = TrialLog(log).rows[key]
    script = f"""
import json, torch, sparta_explore as se
from sparta_explore.compile.decoder import rounded_inputs
from sparta_explore.zoo.llm.workloads import smollm2_tiny_workload
model = se.load({str(out)!r})
settings = model.sparta_decode
w = smollm2_tiny_workload()
with rounded_inputs(model):
    ppl = w.evaluate(model)
ids = w.timing_inputs(1)[0][:1, :24]
step, modules = se.generate(model, ids, 16), se.generate(model, ids, 16, compiled=False)
print(json.dumps({{"ppl": ppl, "act_bits": settings.act_bits, "same": bool(torch.equal(step, modules)),
                  "meta": settings.loaded["manifest"]["metadata"], "tokens": step.tolist(),
                  "tiles": all(p.tiles for p in settings.packed.values() if p.can_tile)}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["act_bits"] == 8 and got["same"]  # the step's tokens are the rounded model's
    assert got["tiles"]  # an int8 package holds its codes in the tiles the int8 step reads
    meta = got["meta"]
    assert meta["trial"]["point_key"] == key and meta["trial"]["point"]["bits@mlp.0"] == 4
    assert got["ppl"] == pytest.approx(meta["export"]["perplexity"], rel=1e-6)  # what was measured is what loads
    assert got["ppl"] == pytest.approx(row["perplexity"], rel=1e-3)  # and it is the row's perplexity
    # the package holds what the trial compressed: the same model, its weights as the step reads them
    model = copy.deepcopy(workload.dense_model())
    compress_llm(model, point_of_row(row, layers=2), workload.calibration_inputs[0])
    packed = packed_for_decode(model)
    assert {p.fmt for n, p in packed.items() if "mlp" in n} == {"u4"} and packed["lm_head"].fmt == "u8"
    assert {p.fmt for n, p in packed.items() if "layers.0.self_attn" in n} == {"s32"}  # pruned: kept values, mask
    ids = torch.tensor(got["tokens"])[:, :24]
    assert torch.equal(se.generate(model, ids, 16, act_bits=8), torch.tensor(got["tokens"]))


def test_the_package_is_smaller_than_the_float_model_and_loads_into_a_given_model(workload, tmp_path):
    model = copy.deepcopy(workload.dense_model())
    point = LLMPoint.from_dict({"bits@mlp.0": 4, "bits@attn.0": 8, "head_bits": 8}, layers=2, bands=1)
    compress_llm(model, point, workload.calibration_inputs[0])
    path = se.save(model, tmp_path / "q.sparta", act_bits=32)
    float_path = se.save(copy.deepcopy(workload.dense_model()), tmp_path / "f.sparta")
    assert path.stat().st_size < 0.5 * float_path.stat().st_size
    fresh = smollm2_tiny_workload().dense_model().__class__(model.config)
    loaded = se.load(path, model=fresh)
    assert loaded is fresh and loaded.sparta_decode.act_bits == 32
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()  # still tied
    ids = workload.timing_inputs(1)[0][:1, :16]
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)


def test_a_packed_weight_of_the_wrong_size_is_named_at_load(workload, tmp_path, monkeypatch):
    from sparta_explore.compile.package import decoder_form
    from sparta_explore.errors import PackageError

    model = copy.deepcopy(workload.dense_model())
    compress_llm(model, LLMPoint.from_dict({"bits@mlp.0": 4}, layers=2, bands=1), workload.calibration_inputs[0])
    record = decoder_form._packed_record

    def short(store, packed):  # a package whose tiles lost their last bytes
        return record(store, dataclasses.replace(packed, data=packed.data[:-1])) if packed.tiles else \
            record(store, packed)

    monkeypatch.setattr(decoder_form, "_packed_record", short)
    path = se.save(model, tmp_path / "short.sparta", act_bits=8)
    named = r"weight 'model\.layers\.0\.\S+' holds \d+ values, its layout \(u[48], \d+ x \d+, tiles\) takes"
    with pytest.raises(PackageError, match=named):
        se.load(path)


def test_a_pruned_weights_mask_and_row_starts_are_checked_at_load(workload, tmp_path, monkeypatch):
    from sparta_explore.compile.package import decoder_form
    from sparta_explore.errors import PackageError

    model = copy.deepcopy(workload.dense_model())
    compress_llm(model, LLMPoint.from_dict({"sparsity@attn.0": 0.5}, layers=2, bands=1), workload.calibration_inputs[0])
    path = se.save(model, tmp_path / "pruned.sparta", act_bits=32)
    loaded = se.load(path)
    assert {p.fmt for n, p in loaded.sparta_decode.packed.items() if "layers.0.self_attn" in n} == {"s32"}
    ids = workload.timing_inputs(1)[0][:1, :16]
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(se.generate(loaded, ids, 8), se.generate(model, ids, 8))
    record = decoder_form._packed_record

    def shifted(store, packed):  # a package whose row starts no longer match its mask
        if packed.fmt != "s32":
            return record(store, packed)
        return record(store, dataclasses.replace(packed, starts=packed.starts + 1))

    monkeypatch.setattr(decoder_form, "_packed_record", shifted)
    path = se.save(model, tmp_path / "shifted.sparta", act_bits=32)
    with pytest.raises(PackageError, match=r"weight 'model\.layers\.0\.self_attn\.\w+' \(\d+ x \d+\): its row starts"):
        se.load(path)


def test_a_package_refuses_another_architecture_and_save_refuses_what_it_cannot_hold(workload, tmp_path):
    from sparta_explore.errors import PackageError
    from sparta_explore.zoo.llm.workloads import tiny_llama

    path = se.save(workload.dense_model(), tmp_path / "m.sparta")
    with pytest.raises(PackageError, match="decoder"):
        se.load(path, model=tiny_llama(layers=3))
    with pytest.raises(PackageError, match="act_bits"):
        se.save(workload.dense_model(), tmp_path / "x.sparta", act_bits=4)
    with pytest.raises(PackageError, match="Llama-pattern"):
        se.save(torch.nn.Linear(2, 2), tmp_path / "y.sparta")


def test_pick_reads_a_trial_log_and_a_failed_trial_is_not_exported(log, workload, tmp_path):
    trials = load_trials(log)
    assert len(trials) == 3
    fastest_under = pick_trial(trials, best=True, min_accuracy=1e9)  # a perplexity ceiling: every finished trial
    assert fastest_under["latency_ms"] == pd.to_numeric(trials["latency_ms"]).min()
    failed = trials[trials["error"].notna()].iloc[0]
    with pytest.raises(ConfigError, match="did not finish"):
        export_llm_trial(failed.to_dict(), tmp_path / "f.sparta", workload)
    with pytest.raises(ConfigError, match="not an LLM search row"):
        point_of_row({"key": "k", "bits@mlp.0": 4}, layers=2)
    with pytest.raises(ConfigError, match="no such LLM trial log"):
        load_trials(tmp_path / "missing.jsonl")


def test_a_log_of_several_machines_is_picked_from_this_machines_rows(tmp_path):
    from sparta_explore.explore.llm.export import llm_trials

    fast_elsewhere = LLMPoint.from_dict({"act_bits": 8}, layers=2, bands=1)
    here = LLMPoint.from_dict({"act_bits": 32}, layers=2, bands=1)
    log = TrialLog(tmp_path / "t.jsonl")
    log.add({"key": fast_elsewhere.key(), "machine": "vnni", "decode_ms": 1.0, "accuracy": 15.0})
    log.add({"key": here.key(), "machine": "avx2", "decode_ms": 5.0, "accuracy": 15.0})
    assert llm_trials(tmp_path / "t.jsonl", machine="avx2")["point_key"].tolist() == [here.key()]
    log.add({"key": LLMPoint.from_dict({"head_bits": 8}, layers=2, bands=1).key(), "machine": "avx2",
             "decode_ms": 4.0, "accuracy": 15.5})
    with pytest.warns(UserWarning, match="no row was timed on this machine; picking among the 2 rows timed on avx2"):
        elsewhere = llm_trials(tmp_path / "t.jsonl", machine="other")  # none timed there: the most-timed machine's
    assert set(elsewhere["machine"]) == {"avx2"}
    single = TrialLog(tmp_path / "one.jsonl")
    single.add({"key": here.key(), "machine": "avx2", "decode_ms": 5.0, "accuracy": 15.0})
    assert len(llm_trials(tmp_path / "one.jsonl", machine="other")) == 1  # one machine's rows: those, no warning
