"""constant_channels: input-independent channels fold into their readers' biases; propagation then prunes them."""

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.compile.passes.base import PassOptions
from sparta_explore.compile.passes.constant_channels import SIZE_SPECIALIZED, constant_channels
from sparta_explore.compile.passes.fold_batchnorm import fold_batchnorm

from .cases import assert_same_outputs, masked_graph, randomize_norms, rows_pruned


def _folded(model: nn.Module, rows: dict, x: tuple):
    graph, table = masked_graph(model, rows_pruned(model, rows), x)
    folded = fold_batchnorm(graph, table, PassOptions())
    return folded.graph, constant_channels(folded.graph, folded.table, PassOptions())


def test_a_pruned_filter_carries_bn_shift_into_the_next_1x1_conv_bias():
    model = randomize_norms(nn.Sequential(nn.Conv2d(3, 7, 3, padding=1, bias=False), nn.BatchNorm2d(7), nn.ReLU6(),
                                          nn.Conv2d(7, 5, 1)))
    x = (torch.randn(2, 3, 6, 6),)
    before, result = _folded(model, {"0": [0, 3, 6]}, x)
    assert result.changes == {"channels folded": 3, "readers rewritten": 1, "bias maps": 0}  # 1x1: one bias each
    assert_same_outputs(before, result.graph, x)
    assert_same_outputs(before, result.graph, (torch.randn(3, 3, 11, 5),), draws=1)  # no size baked in
    # the reader's columns are pruned, and propagation took the constant channels back to their conv
    assert bool(result.table["3.weight"].pruned[:, [0, 3, 6]].all())
    assert not bool(result.table["_0"].channels_kept(1)[[0, 3, 6]].any())


def test_a_padded_reader_gets_a_map_for_the_example_size():
    # the depthwise weights decide whether a folded channel stays nonzero after BN and ReLU (and so needs its
    # map): fixed here, not left to whatever the global generator holds after the tests before
    torch.manual_seed(0)
    model = randomize_norms(nn.Sequential(nn.Conv2d(3, 6, 1, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                                          nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False), nn.BatchNorm2d(6),
                                          nn.ReLU(), nn.Conv2d(6, 4, 1)))  # expand -> depthwise (padded) -> project
    x = (torch.randn(2, 3, 7, 5),)
    before, result = _folded(model, {"0": [1, 2, 5]}, x)
    assert result.changes["bias maps"] == 1 and result.changes["channels folded"] == 3
    assert any(name.startswith(SIZE_SPECIALIZED) for name, _ in result.graph.module.named_buffers())
    assert "compiled for this input size" in result.notes[0]
    assert_same_outputs(before, result.graph, x)


def test_linear_rows_with_a_bias_fold_through_gelu():
    model = nn.Sequential(nn.Linear(8, 12), nn.GELU(), nn.Linear(12, 3)).eval()
    x = (torch.randn(4, 5, 8),)
    with torch.no_grad():
        model[0].bias[[2, 7, 11]] = 0.7  # the table prunes the rows' weights, not their bias: a constant remains
    weights_only = {"0.weight": rows_pruned(model, {"0": [2, 7, 11]})["0.weight"]}
    graph, table = masked_graph(model, weights_only, x)
    result = constant_channels(graph, table, PassOptions())
    assert result.changes["channels folded"] == 3 and result.changes["bias maps"] == 0
    assert_same_outputs(graph, result.graph, x)
    assert_same_outputs(graph, result.graph, (torch.randn(2, 9, 8),), draws=1)


def test_a_channel_is_never_folded_for_looking_constant():
    # relu of a strongly negative channel is 0 on every example, but its weights read the input: not independent
    class DeadRelu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)
            with torch.no_grad():
                self.a.bias[1] = -1e4

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(F.relu(self.a(x)))

    model, x = DeadRelu().eval(), (torch.randn(8, 4),)
    graph, table = masked_graph(model, {}, x)
    result = constant_channels(graph, table, PassOptions())
    assert result.changes["channels folded"] == 0


def test_batch_statistics_make_a_channel_depend_on_the_batch():
    # a BatchNorm without running statistics normalizes each batch by itself: its constant input is not constant out
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, track_running_stats=False), nn.Conv2d(4, 2, 1)).eval()
    x = (torch.randn(2, 3, 5, 5),)
    graph, table = masked_graph(model, rows_pruned(model, {"0": [1]}), x)
    result = constant_channels(graph, table, PassOptions())
    assert result.changes["channels folded"] == 0


class _TwoReaders(nn.Module):
    """gelu(fc1(x)) read by fc2 and fc3: a folded channel is dead only once both readers' columns are pruned."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 12), nn.Linear(12, 5), nn.Linear(12, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        return self.head(self.fc2(h) * self.fc3(h))


def test_propagating_again_from_the_rewritten_readers_reaches_the_full_fixpoint():
    from sparta_explore.propagation import run_propagation

    torch.manual_seed(3)
    model = _TwoReaders().eval()
    x = (torch.randn(4, 6, 8),)
    weights_only = {"fc1.weight": rows_pruned(model, {"fc1": [1, 4, 9]})["fc1.weight"]}  # biases stay: constants
    graph, table = masked_graph(model, weights_only, x)
    result = constant_channels(graph, table, PassOptions())
    assert result.changes["readers rewritten"] == 2
    assert bool(result.table["fc1.weight"].pruned[[1, 4, 9]].all())  # read by nobody now: back to fc1
    assert bool(result.table["fc1.bias"].pruned[[1, 4, 9]].all())
    full = run_propagation(result.graph, result.table, check=False).table  # nothing left for a full run to prune
    assert all(full[name].equals(result.table[name]) for name in full)
    assert_same_outputs(graph, result.graph, x)
