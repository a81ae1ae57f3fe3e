"""A black-box op with no rule is handled by tensor scrambling, soundly, and reported."""

import torch
from torch import nn

from sparta_explore import capture
from sparta_explore.propagation import run_propagation

from .helpers import newly_pruned, propagate_checked, prune_rows


class OddGate(nn.Module):
    """No rule knows this module: it keeps even features (doubled) and zeroes odd ones."""

    def forward(self, x):
        out = x * 2
        out[..., 1::2] = 0
        return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.gate = OddGate()
        self.out = nn.Linear(6, 2)

    def forward(self, x):
        return self.out(self.gate(self.fc(x)))


def test_scrambling_finds_zeros_and_irrelevance_of_a_black_box():
    _, result = propagate_checked(Net(), torch.randn(3, 4), {}, leaf_modules=[OddGate], scramble_trials=8)
    assert "gate" in result.report.scrambled
    assert newly_pruned(result, "out.weight")[:, 1::2].all()  # the gate's odd outputs are always zero
    assert newly_pruned(result, "fc.weight")[1::2].all()       # and it never reads its odd inputs
    assert not result.table["fc.weight"].pruned[0::2].any()


def test_scrambling_respects_pruned_inputs():
    entries = {"fc.weight": prune_rows((6, 4), [0]), "fc.bias": prune_rows((6,), [0])}
    _, result = propagate_checked(Net(), torch.randn(3, 4), entries, leaf_modules=[OddGate])
    assert result.table["gate"].pruned[:, 0].all()


def test_scrambling_skips_integer_inputs_soundly():
    class Lookup(nn.Module):
        def forward(self, idx):
            return torch.ones(10)[idx] * 3

    model = nn.Sequential(Lookup())
    graph = capture(model, torch.tensor([1, 2]), leaf_modules=[Lookup])
    result = run_propagation(graph, {})
    assert "float" in result.report.unsupported["_0"]
    assert not result.table["input_1"].pruned.any()  # left as it was: nothing claimed
