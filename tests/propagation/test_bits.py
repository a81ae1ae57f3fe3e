"""Bits flow through passive ops, never through computing ones, and never rise."""

import torch
from torch import nn

from sparta_explore import NumberFormat, TeSA, TeSATable, capture
from sparta_explore.propagation import run_propagation


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        h = self.pool(torch.relu(self.conv(x)))
        return torch.nn.functional.gelu(self.fc(torch.flatten(h, 1)))


def test_passive_ops_carry_bits_and_format():
    model = Net().eval()
    graph = capture(model, torch.randn(1, 1, 4, 4))
    table = TeSATable({"conv": TeSA.dense((1, 4, 4, 4), bits=8, fmt="int")}, shapes=graph.shapes())
    result = run_propagation(graph, table)
    for name in ("relu", "pool", "flatten"):  # relu, max-pool and flatten only move or select values
        assert result.table[name].kept_bits() == [8], name
        assert result.table[name].formats() == {NumberFormat.INT}, name
    assert result.table["fc"].kept_bits() == [32]   # a linear computes new values: no bits flow
    assert result.table["gelu"].kept_bits() == [32]


def test_no_precision_ever_rises():
    model = Net().eval()
    graph = capture(model, torch.randn(1, 1, 4, 4))
    table = TeSATable({"conv.weight": TeSA.dense((4, 1, 3, 3), bits=4, fmt="int"),
                       "relu": TeSA.dense((1, 4, 4, 4), bits=8, fmt="uint"),
                       "flatten": TeSA.dense((1, 16), bits=16, fmt="bfloat")}, shapes=graph.shapes())
    result = run_propagation(graph, table)
    for name in result.table:
        assert torch.all(result.table[name].bits <= result.before[name].bits), name
    assert result.table["flatten"].kept_bits() == [8]  # the lower of its own 16 and relu's 8 via the pool
