"""`run_propagation(..., start=...)`: after an edit of a propagated table, only what the edit reaches runs, and the
table equals a full run's (the edit's consequences reach through tensors with several readers too)."""

import pytest
import torch
from torch import nn

from sparta_explore import TeSA, TeSATable, capture
from sparta_explore.propagation import run_propagation
from sparta_explore.propagation.verify import max_output_change

from .helpers import prune_rows


class TwoReaders(nn.Module):
    """h = relu(fc1(x)) is read by fc2 and fc3: a column of h is dead only when both stop reading it."""

    def __init__(self, width: int = 12):
        super().__init__()
        self.fc1 = nn.Linear(8, width)
        self.fc2 = nn.Linear(width, 6)
        self.fc3 = nn.Linear(width, 6)
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.head(torch.relu(self.fc2(h) + self.fc3(h)))


class Deep(nn.Module):
    """A chain of linears with a shortcut: edits far from the output reach a few ops only."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(6))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x)) + (x if i % 2 else 0)
        return x


def _with_columns_pruned(table, name: str, columns) -> dict:
    entries = dict(table)
    shape = entries[name].shape
    entries[name] = entries[name].merge(prune_rows(shape, columns, dim=1))
    return entries


def _same(a, b) -> bool:
    return all(a[name].equals(b[name]) for name in a)


def test_a_two_reader_tensor_shrinks_only_when_both_readers_were_asked():
    torch.manual_seed(0)
    model = TwoReaders().eval()
    graph = capture(model, torch.randn(5, 8))
    first = run_propagation(graph, TeSATable({"fc2.weight": prune_rows((6, 12), [0])}, shapes=graph.shapes()))
    edited = _with_columns_pruned(_with_columns_pruned(first.table, "fc2.weight", [3, 7]), "fc3.weight", [3, 7])
    full = run_propagation(graph, edited, check=False)
    started = run_propagation(graph, edited, check=False, start=["fc2"])   # fc3 is reached through h
    assert _same(started.table, full.table)
    assert started.table["fc1.weight"].pruned[[3, 7]].all()   # h's columns 3 and 7 are read by nobody now
    assert started.report.visits < full.report.visits
    assert max_output_change(graph, edited, started.table) < 1e-5


def test_a_column_one_reader_still_reads_keeps_its_producer():
    torch.manual_seed(1)
    model = TwoReaders().eval()
    graph = capture(model, torch.randn(5, 8))
    first = run_propagation(graph, TeSATable({}, shapes=graph.shapes()))
    edited = _with_columns_pruned(first.table, "fc2.weight", [2])   # fc3 still reads h[:, 2]
    started = run_propagation(graph, edited, check=False, start=["fc2"])
    assert not started.table["fc1.weight"].pruned[2].any()
    assert _same(started.table, run_propagation(graph, edited, check=False).table)


@pytest.mark.parametrize("seed", range(4))
def test_started_run_equals_the_full_run_on_random_edits(seed):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = Deep().eval()
    graph = capture(model, torch.randn(4, 16))
    entries = {f"layers.{i}.weight": TeSA.from_mask(torch.rand(16, 16, generator=g) > 0.5) for i in range(6)}
    first = run_propagation(graph, TeSATable(entries, shapes=graph.shapes()), check=False)
    edited = dict(first.table)
    touched = []
    for i in torch.randperm(6, generator=g)[:2].tolist():
        cols = torch.randperm(16, generator=g)[:5].tolist()
        edited = _with_columns_pruned(edited, f"layers.{i}.weight", cols)
        touched.append(graph.module_nodes(f"layers.{i}")[0].name)
    full = run_propagation(graph, edited, check=False)
    started = run_propagation(graph, edited, check=False, start=touched)
    assert _same(started.table, full.table)
    assert started.report.visits <= full.report.visits
    assert max_output_change(graph, edited, started.table) < 1e-5


def test_an_unpropagated_table_keeps_its_entries_where_no_change_reaches():
    torch.manual_seed(2)
    model = TwoReaders().eval()
    graph = capture(model, torch.randn(5, 8))
    raw = {"head.weight": prune_rows((4, 6), [1], dim=1)}   # a full run would prune fc2's and fc3's row 1
    started = run_propagation(graph, raw, check=False, start=["fc1"])
    assert not started.table["fc2.weight"].pruned.any()
    assert run_propagation(graph, raw, check=False).table["fc2.weight"].pruned[1].all()
