"""Compile says where its seconds went: stages sum to its wall time, ops to their steps, builds split from checks."""

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile import compile
from sparta_explore.compile.choose import STEPS
from sparta_explore.compile.compile_times import STAGES, stage_frame, times_text
from sparta_explore.kernels import compiler_available


def _two_sparse_linears():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32)).eval()
    table = se.TeSATable({f"{i}.weight": se.TeSA.from_mask(torch.rand(*model[i].weight.shape) > 0.9)
                          for i in (0, 2)})
    return model, table


@pytest.mark.skipif(not compiler_available(), reason="kernels need gcc")
def test_breakdown_sums_to_the_compile_and_names_the_kernel_steps(device, tmp_path):
    model, table = _two_sparse_linears()
    cm = compile(model, table, (torch.randn(64, 64),), device=device, cache_dir=tmp_path, tune=True, runs=2)
    stages = cm.compile_times
    assert set(stages["stage"]) <= set(STAGES) | {"other"}
    assert stages["seconds"].sum() == pytest.approx(cm.seconds, rel=1e-6)
    assert stages["share"].sum() == pytest.approx(1.0)
    for step in ("codegen", "gcc + load", "reference check", "timing"):
        assert step in set(stages["stage"]), step  # a cold cache: kernels were generated, built, checked, timed
    ops = cm.op_compile_times
    assert list(ops["op"]) == list(cm.plan.ops) and list(ops.columns) == ["op", *STEPS, "total"]
    assert (ops["total"] > 0).all()
    assert ops[list(STEPS)].sum().sum() == pytest.approx(sum(stages.set_index("stage")["seconds"].get(s, 0.0)
                                                              for s in STEPS))
    assert "compile time: total" in cm.summary()


def test_stage_frame_keeps_order_and_names_the_rest_other():
    frame = stage_frame({"guard": 1.0, "capture": 0.5}, [], total=2.0)
    assert frame["stage"].tolist() == ["capture", "guard", "other"]
    assert times_text(frame).startswith("total 2.0 s: guard 1.0 s (50%)")


@pytest.mark.skipif(not compiler_available(), reason="kernels need gcc")
def test_a_compile_past_its_cap_takes_the_profiles_favourites_untimed_and_says_so(device, tmp_path):
    model, table = _two_sparse_linears()
    x = torch.randn(64, 64)
    cm = compile(model, table, (x,), device=device, cache_dir=tmp_path, runs=2, max_seconds=0)
    assert cm.capped == len(cm.plan.ops) == 2
    for op in cm.plan.ops.values():
        assert op.capped and any("compile time cap (0 s)" in n for n in op.notes)
        assert set(op.measured_ms) <= {op.chosen}  # the favourite alone: nothing else built or timed
        assert "timing" not in op.seconds or set(op.measured_ms) == {op.chosen}
    assert bool(cm.checks["passed"].all())  # the checks still run
    with torch.no_grad():
        assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-4)
    uncapped = compile(model, table, (x,), device=device, cache_dir=tmp_path, runs=2)
    assert uncapped.capped == 0


def test_the_cap_is_checked():
    from sparta_explore.compile.config import CompileConfig
    from sparta_explore.errors import ConfigError

    assert CompileConfig(max_seconds=3).max_seconds == 3.0
    for bad in (-1, "5", True, float("nan")):
        with pytest.raises(ConfigError, match="CompileConfig.max_seconds"):
            CompileConfig(max_seconds=bad)
