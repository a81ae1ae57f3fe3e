"""graph_edit: values of a graph's nodes from the example run, and from one item of it."""

import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.passes.graph_edit import example_values, first_item_values


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)) * scale)


class _LiteralBatch(nn.Module):
    """Folds pairs of items into one row: the traced reshape keeps the example's sizes."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows, self.fc = rows, nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.reshape(self.rows, 12))


class _Rows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.reshape(-1, 3))


def _relu_node(graph) -> str:
    return next(n.name for n in graph.nodes() if n.target in (torch.relu, "relu"))


def test_one_items_values_are_the_examples_first_item():
    torch.manual_seed(0)
    graph = se.capture(_Net().eval(), (torch.randn(4, 7, 6), torch.randn(4, 7, 5)))
    name = _relu_node(graph)
    one, full = first_item_values(graph, [name]), example_values(graph, [name])
    assert one[name].shape == (1, 7, 5)
    torch.testing.assert_close(one[name], full[name][:1])


def test_no_one_item_run_where_it_is_not_the_examples():
    torch.manual_seed(0)
    net = _Net().eval()
    name = _relu_node(se.capture(net, (torch.randn(4, 7, 6), torch.randn(4, 7, 5))))
    # inputs with other batch sizes, or one item already: nothing to cut
    assert first_item_values(se.capture(net, (torch.randn(4, 7, 6), torch.randn(1, 7, 5))), [name]) is None
    assert first_item_values(se.capture(net, (torch.randn(1, 7, 6), torch.randn(1, 7, 5))), [name]) is None
    # a reshape to literal sizes: one item fails (4 rows of 6 cannot be 2 of 12) ...
    graph = se.capture(_LiteralBatch(2).eval(), (torch.randn(4, 6),))
    fc_input = next(n.args[0].name for n in graph.nodes() if n.op == "call_module")
    assert first_item_values(graph, [fc_input]) is None
    # ... or runs, but its rows are not items (4 items of 6 are 8 rows of 3; one item, 2 rows): the shape tells
    graph = se.capture(_Rows().eval(), (torch.randn(4, 6),))
    fc_input = next(n.args[0].name for n in graph.nodes() if n.op == "call_module")
    assert example_values(graph, [fc_input])[fc_input].shape == (8, 3)
    assert first_item_values(graph, [fc_input]) is None
