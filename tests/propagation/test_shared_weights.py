"""Shared weights: a weight read twice is irrelevant only where both reads ignore it."""

import torch
from torch import nn

from .helpers import propagate_checked, prune_rows


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(6, 6)
        self.dec = nn.Linear(6, 6)
        self.dec.weight = self.enc.weight
        self.out_a = nn.Linear(6, 2)
        self.out_b = nn.Linear(6, 2)

    def forward(self, x):
        return self.out_a(self.enc(x)) + self.out_b(self.dec(x))


def test_tied_weight_pruned_only_where_both_uses_ignore_it():
    entries = {"out_a.weight": prune_rows((2, 6), [0, 1], dim=1), "out_b.weight": prune_rows((2, 6), [1, 2], dim=1)}
    graph, result = propagate_checked(Tied(), torch.randn(3, 6), entries)
    w = result.table["enc.weight"]
    assert w.pruned[1].all()                               # both readers ignore row 1
    assert not w.pruned[[0, 2]].any()                      # each of rows 0, 2 is needed by one reader
    assert w.equals(result.table["dec.weight"])            # the alias carries the same attribute
    assert graph.canonical("dec.weight") == "enc.weight"


def test_activation_read_twice_keeps_what_either_reader_needs():
    model = nn.Sequential(nn.Linear(4, 4))

    class Fan(nn.Module):
        def __init__(self):
            super().__init__()
            self.src = nn.Linear(4, 4)
            self.a = nn.Linear(4, 1)
            self.b = nn.Linear(4, 1)

        def forward(self, x):
            h = self.src(x)
            return self.a(h) + self.b(h)

    del model
    entries = {"a.weight": prune_rows((1, 4), [0, 1], dim=1), "b.weight": prune_rows((1, 4), [1], dim=1)}
    _, result = propagate_checked(Fan(), torch.randn(2, 4), entries)
    assert result.table["src.weight"].pruned[1].all() and not result.table["src.weight"].pruned[0].any()
