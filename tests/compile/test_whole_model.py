"""compile with graph passes: a channel-pruned CNN comes out smaller and exact, reports every pass, guards its speed."""

import warnings

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile import CompileConfig, CompileWarning, compile
from sparta_explore.errors import ConfigError
from sparta_explore.zoo.convnets import MobileNetV2Mini

from .passes.cases import every_other, randomize_norms, rows_pruned

DENSE_ONLY = frozenset({"dense", "shrink"})  # no C builds: these tests are about the graph


def _tiny_mobilenet() -> nn.Module:
    return randomize_norms(MobileNetV2Mini(stages=((1, 8, 1, 1), (3, 12, 2, 2)), stem=8, last=16, in_channels=3))


def _weights(module: nn.Module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))


def test_an_nni_channel_pruned_cnn_compiles_smaller_and_exact(device, cache_dir):
    from sparta_explore.pruners import prune
    from sparta_explore.pruners.nni_pruners import NNIPruneConfig

    model, x = _tiny_mobilenet(), (torch.randn(2, 3, 12, 12),)
    graph = se.capture(model, x)
    convs = tuple(n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.groups == 1)
    table = prune(model, NNIPruneConfig(0.5, op_types=("Conv2d",), op_names=convs), pruner="l1norm", graph=graph)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompileWarning)
        cm = compile(graph, se.run_propagation(graph, table), config=CompileConfig(
            device=device, cache_dir=cache_dir, tune=False, kernels=DENSE_ONLY, runs=3))
    with torch.no_grad():
        want = se.masked_copy(model, table)(*x)  # what the user gave: the model masked with the pruner's table
        assert float((cm(*x) - want).abs().max() / (1 + want.abs().max())) < 1e-4
    assert list(cm.passes["pass"]) == ["simplify", "fold_batchnorm", "constant_channels", "shrink", "attention",
                                       "attention_dims",
                                       "memory_format", "fuse_epilogue"]
    changed = dict(zip(cm.passes["pass"], cm.passes["changed"]))
    assert changed["fold_batchnorm"].startswith("batchnorms folded") and "channels removed" in changed["shrink"]
    assert cm.guard is not None and cm.guard["runs"] in ("compiled", "graph passes only", "model as given, masked")
    assert cm.checks.passed.all()
    if cm.guard["runs"] != "model as given, masked":
        assert _weights(cm.module) < 0.7 * _weights(model)


@pytest.mark.parametrize("on_item", [False, True])
def test_a_size_baked_in_by_a_pass_sends_other_sizes_to_the_masked_model(on_item, device, cache_dir, monkeypatch):
    if on_item:  # checked as a large model is: the references and the fallback on the example's last item
        monkeypatch.setattr("sparta_explore.compile.pipeline.ITEM_CHECK_SECONDS", 0.0)
    model = randomize_norms(nn.Sequential(nn.Conv2d(3, 6, 1, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                                          nn.Conv2d(6, 4, 3, padding=1)))
    x = (torch.randn(2, 3, 8, 8),)
    table = rows_pruned(model, {"0": every_other(6)})
    graph = se.capture(model, x)
    cm = compile(graph, se.run_propagation(graph, table), config=CompileConfig(
        device=device, cache_dir=cache_dir, tune=False, kernels=DENSE_ONLY, runs=3, guard=False))
    assert "bias maps 1" in dict(zip(cm.passes["pass"], cm.passes["changed"]))["constant_channels"]
    tables = cm.checks[cm.checks["check"].str.contains("table")]
    assert set(tables["on"]) == {"item 2 of 2" if on_item else "whole example"}
    other = torch.randn(3, 3, 5, 7)
    with pytest.warns(CompileWarning, match="specialized to its example inputs' sizes"):
        got = cm(other)
    masked = se.masked_copy(model, table)
    with torch.no_grad():
        assert torch.allclose(got, masked(other), atol=1e-5)
        batch = torch.randn(5, 3, 8, 8)  # another batch of the compiled size runs compiled, no warning
        assert cm.size_guard.fits((batch,))
        with warnings.catch_warnings():
            warnings.simplefilter("error", CompileWarning)
            assert torch.allclose(cm(batch), masked(batch), atol=1e-5)


def test_passes_are_named_in_the_config():
    assert CompileConfig(passes=()).graph_passes() == ()
    assert CompileConfig(passes=("shrink", "fuse_epilogue")).runs_pass("fuse_epilogue")
    with pytest.raises(ConfigError, match="CompileConfig.passes: unknown pass 'fold'"):
        CompileConfig(passes=("fold",))


def test_without_passes_the_graph_is_compiled_as_captured(device, cache_dir):
    model, x = _tiny_mobilenet(), (torch.randn(2, 3, 12, 12),)
    graph = se.capture(model, x)
    table = rows_pruned(model, {"stem.0": [0, 1]})
    cm = compile(graph, table, config=CompileConfig(device=device, cache_dir=cache_dir, tune=False,
                                                    kernels=DENSE_ONLY, runs=3, passes=()))
    assert list(cm.passes["pass"]) == []
    with torch.no_grad():
        assert torch.allclose(cm(*x), se.masked_copy(model, table)(*x), atol=1e-5)


def test_hooks_on_the_compiled_model_still_run(device, cache_dir):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    x = torch.randn(4, 8)
    graph = se.capture(model, x)
    cm = compile(graph, rows_pruned(model, {"0": [1, 5]}), config=CompileConfig(
        device=device, cache_dir=cache_dir, tune=False, kernels=DENSE_ONLY, runs=3))
    seen = []
    handle = cm.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with torch.no_grad():
        y = cm(x)
    handle.remove()
    assert seen == [y.shape]  # with a hook the wrapper takes nn.Module's call; without, the fast one
    with torch.no_grad():
        assert torch.allclose(cm(x), y) and len(seen) == 1
