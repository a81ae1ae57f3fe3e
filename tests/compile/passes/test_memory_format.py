"""memory_format: a conv net may go channels-last; either way the output is the same, and the choice is recorded."""

import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.passes.base import PassOptions
from sparta_explore.compile.passes.memory_format import memory_format

from .cases import assert_same_outputs, masked_graph


def test_the_choice_is_measured_and_either_result_computes_the_same():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 1), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(16, 4)).eval()
    x = (torch.randn(4, 3, 10, 10),)
    graph, table = masked_graph(model, {}, x, propagate=False)
    result = memory_format(graph, table, PassOptions(runs=3))
    assert "NCHW" in result.notes[0] and "NHWC" in result.notes[0]  # both timed
    converted = result.changes["models in channels-last"] == 1
    convs = [m for m in result.graph.module.modules() if isinstance(m, nn.Conv2d)]
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) == converted for c in convs)
    assert any(n.target == "contiguous" for n in result.graph.module.graph.nodes) == converted
    assert_same_outputs(graph, result.graph, x)


def test_a_model_without_convs_or_image_inputs_is_left_alone():
    model = nn.Sequential(nn.Linear(8, 8)).eval()
    graph, table = masked_graph(model, {}, (torch.randn(2, 8),), propagate=False)
    result = memory_format(graph, table, PassOptions(runs=3))
    assert result.graph is graph and not result.changed


def test_convs_still_sparse_inside_stay_nchw_for_the_sparse_kernels():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)).eval()
    x = (torch.randn(2, 3, 8, 8),)
    kept = torch.rand(8, 8, 3, 3, generator=torch.Generator().manual_seed(0)) > 0.9  # unstructured 90%
    graph, table = masked_graph(model, {"2.weight": se.TeSA.from_mask(kept)}, x, propagate=False)
    result = memory_format(graph, table, PassOptions(runs=3))
    assert result.graph is graph and "kept NCHW" in result.notes[0]
