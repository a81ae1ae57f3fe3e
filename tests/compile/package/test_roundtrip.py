"""save -> load gives the same model: outputs bit for bit on this machine, in a fresh process, from a cold cache."""

import hashlib
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.kernels.build import (
    CompilerMissingWarning,
    native_cpu_flags,
    set_target_isa,
    target_isa,
)
from sparta_explore.kernels.fused_ffn import FusedPair
from sparta_explore.kernels.permute_int8 import has_permute
from sparta_explore.kernels.sparse_linear import KernelLinear


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()


def _run(cm, x):
    with torch.no_grad():
        return cm(x)


_LOADER = """
import hashlib, sys, torch
import sparta_explore as se
for path, inp in zip(sys.argv[1::2], sys.argv[2::2]):
    cm = se.load(path)
    x = torch.load(inp)
    with torch.no_grad():
        y = cm(x)
    print(cm.record.loaded["mode"], cm.record.loaded["bit_identical"],
          hashlib.sha256(y.contiguous().numpy().tobytes()).hexdigest())
"""


def test_saved_models_load_in_a_fresh_process_with_bit_identical_outputs(fp32_model, conv_model, int8_pair_model,
                                                                         tmp_path, cache_dir):
    args, want = [], []
    for name, (cm, x) in {"fp32": fp32_model, "conv": conv_model, "int8": int8_pair_model}.items():
        args += [str(cm.save(tmp_path / f"{name}.sparta")), str(tmp_path / f"{name}.pt")]
        torch.save(x, args[-1])
        want.append(_digest(_run(cm, x)))
    env = {**os.environ, "SPARTA_EXPLORE_CACHE": str(cache_dir)}
    out = subprocess.run([sys.executable, "-c", _LOADER, *args], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stdout.strip().splitlines()]
    isa = "native" if target_isa() == "native" else "rebuild"  # a child process runs at the CPU's own ISA
    assert [line[0] for line in lines] == [isa] * 3
    if isa == "native":
        assert [line[1] for line in lines] == ["True"] * 3
        assert [line[2] for line in lines] == want


def test_a_loaded_model_keeps_its_report_and_saves_again(fp32_model, tmp_path, cache_dir):
    cm, x = fp32_model
    loaded = se.load(cm.save(tmp_path / "a.sparta"), cache_dir=cache_dir)
    assert loaded.record.loaded["bit_identical"] and loaded.record.loaded["mode"] == "native"
    assert loaded.report[["op", "choice"]].equals(cm.report[["op", "choice"]])
    assert loaded.checks["check"].tolist()[-1] == "load (saved outputs)"
    assert "loaded:" in loaded.summary() and "bit-identical" in loaded.summary()
    assert loaded.record.table.keys() == cm.record.table.keys()
    again = se.load(loaded.save(tmp_path / "b.sparta"), cache_dir=cache_dir)
    assert torch.equal(_run(again, x), _run(cm, x))
    kernels = [m for m in again.modules() if isinstance(m, KernelLinear)]
    assert len(kernels) == 2 and all(k._fn is not None for k in kernels)
    # the few-row decision travels as a count; the path is packed again on first use, the same products
    assert [k.few_rows for k in kernels] == [k.few_rows for k in cm.modules() if isinstance(k, KernelLinear)]
    assert torch.equal(_run(again, x[:1]), _run(cm, x[:1]))


def test_a_cold_kernel_cache_builds_the_saved_sources(fp32_model, tmp_path):
    cm, x = fp32_model
    path = cm.save(tmp_path / "m.sparta")
    cold = tmp_path / "cold-cache"
    loaded = se.load(path, cache_dir=cold)
    assert loaded.record.loaded["bit_identical"]
    assert len(list((cold / "kernels").glob("*.so"))) == 3  # built here, from the package's C: 2 ops, the pair's driver
    pair = next(m for m in loaded.modules() if type(m).__name__ == "FusedFp32Pair")
    assert pair._fn is not None and pair.fallback_reason is None
    assert torch.equal(_run(loaded, x), _run(cm, x))


@pytest.fixture
def int8_package(int8_pair_model, tmp_path):
    cm, x = int8_pair_model
    return cm.save(tmp_path / "int8.sparta"), cm, x


def test_without_a_compiler_a_package_runs_its_reference_ops_with_one_warning(int8_package, no_compiler, tmp_path):
    path, cm, x = int8_package
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = se.load(path, cache_dir=tmp_path / "cache")
    assert [type(w.message) for w in caught] == [CompilerMissingWarning], [str(w.message) for w in caught]
    assert loaded.record.loaded["mode"] == "reference"
    pair = next(m for m in loaded.modules() if type(m).__name__ == "FusedInt8Pair")
    assert pair._fn is None and pair.first._fn is None and "no C compiler" in pair.first.fallback_reason
    got, want = _run(loaded, x), _run(cm, x)
    assert float((got - want).abs().max()) <= 2e-2 * (1 + float(want.abs().max()))


def test_a_package_from_another_instruction_set_is_generated_again_here(fp32_model, conv_model, tmp_path,
                                                                         cache_dir):
    if "avx512f" not in native_cpu_flags():
        pytest.skip("needs an AVX-512 CPU: a package saved at one instruction set is read at the other (AVX2)")
    other = "avx2" if target_isa() == "native" else "native"
    for cm, x in (fp32_model, conv_model):
        path = cm.save(tmp_path / "m.sparta")
        saved_keys = {m.built.key for m in cm.modules() if isinstance(m, KernelLinear)}
        before = target_isa()
        set_target_isa(other)
        try:
            loaded = se.load(path, cache_dir=cache_dir)
            y = _run(loaded, x)
        finally:
            set_target_isa(before)
        assert loaded.record.loaded["mode"] == "rebuild" and "generated again" in loaded.summary()
        kernels = [m for m in loaded.modules() if isinstance(m, KernelLinear)]
        assert kernels and all(k._fn is not None for k in kernels)
        assert not {k.built.key for k in kernels} & saved_keys  # new sources, for the other vector width
        pairs = [m for m in loaded.modules() if type(m).__name__ == "FusedFp32Pair"]
        assert all(p._fn is not None for p in pairs)  # rebound to the rebuilt ops
        want = _run(cm, x)
        assert float((y - want).abs().max()) <= 1e-4 * (1 + float(want.abs().max()))


def test_hugging_face_outputs_come_back_as_their_own_type(tmp_path, cache_dir, device):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128, vocab_size=300)).eval()
    inputs = {"input_ids": torch.randint(0, 300, (2, 16)), "attention_mask": torch.ones(2, 16, dtype=torch.long)}
    graph = se.capture(model, inputs)
    weight = "bert.encoder.layer.0.intermediate.dense.weight"
    table = se.TeSATable({weight: se.TeSA.from_mask(torch.rand(128, 64) < 0.2)})
    cm = se.compile(graph, table, device=device, cache_dir=cache_dir, tune=False, runs=2)
    loaded = se.load(cm.save(tmp_path / "bert.sparta"), cache_dir=cache_dir)
    got, want = loaded(**inputs), cm(**inputs)
    assert type(got).__name__ == "SequenceClassifierOutput" and torch.equal(got.logits, want.logits)


def test_a_permute_pair_loads_bit_identical_and_as_quad_kernels_without_vbmi(cache_dir, device, tmp_path):
    if not has_permute() or 8 not in device.bits:
        pytest.skip("the permute kernel needs AVX-512 VBMI and VNNI")
    torch.manual_seed(0)
    ffn = nn.Sequential(nn.Linear(64, 192), nn.GELU(), nn.Linear(192, 48)).eval()
    x = torch.randn(100, 64)
    graph = se.capture(ffn, (x,))
    table = se.TeSATable({"0.weight": se.TeSA.from_mask(torch.rand(192, 64) < 0.1, bits=8),
                          "2.weight": se.TeSA.from_mask(torch.rand(48, 192) < 0.1, bits=8),
                          graph.inputs[0]: se.TeSA.dense((1, 64), bits=8), "_1": se.TeSA.dense((1, 192), bits=8)})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sparta_explore.compile.choose._timed",
                      lambda op, fns, x, runs: {name: 2.0 if name == "dense" else 1.0 for name in fns})
        patch.setattr(FusedPair, "whole_tiles", 0)
        cm = se.compile(ffn, table, (x,), cache_dir=cache_dir, device=device, tune=False, guard=False,
                        kernels={"int8"})
    assert [type(m).__name__ for m in cm.module.modules()].count("FusedPermutePair") == 1
    path = cm.save(tmp_path / "permute.sparta")
    loaded = se.load(path, cache_dir=cache_dir)
    assert loaded.record.loaded["bit_identical"]
    assert torch.equal(_run(loaded, x), _run(cm, x))
    before = target_isa()
    set_target_isa("avx2")
    try:
        other = se.load(path, cache_dir=cache_dir)
        y = _run(other, x)
    finally:
        set_target_isa(before)
    kinds = {type(m).__name__ for m in other.modules()}
    assert "PermutedInt8Linear" not in kinds and "Int8SparseLinear" in kinds  # the quad kernels, same result
    want = _run(cm, x)
    assert float((y - want).abs().max()) <= 2e-2 * (1 + float(want.abs().max()))
