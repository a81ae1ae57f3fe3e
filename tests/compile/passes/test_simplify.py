"""simplify: eval dropout, identities and no-op reshapes go, constants are computed once, the output stays."""

import torch
import torch.nn.functional as F
from torch import nn

import sparta_explore as se
from sparta_explore.compile.passes.base import PassOptions
from sparta_explore.compile.passes.simplify import simplify

from .cases import assert_same_outputs, masked_graph


class Chatty(nn.Module):
    """Dropouts, an identity, a reshape to the same shape, x * 1, a reshape that is not a no-op."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 4)
        self.drop, self.ident = nn.Dropout(0.3), nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        y = self.ident(self.drop(self.fc1(x)))
        y = F.dropout(y, p=0.5, training=False) * 1
        y = y.view(y.size(0), y.size(1), -1)  # a no-op for every input
        y = y.view(b, s, h)  # same shape here, but read off another tensor: not provably a no-op, kept
        return self.fc2(y.reshape(-1, h))


def test_simplify_drops_what_computes_nothing_and_keeps_the_output():
    model, x = Chatty().eval(), (torch.randn(2, 3, 16),)
    graph, table = masked_graph(model, {}, x, propagate=False)
    result = simplify(graph, table, PassOptions())
    assert result.changes["dropouts removed"] == 2
    assert result.changes["identities removed"] == 2  # nn.Identity and x * 1
    assert result.changes["no-op reshapes removed"] == 1  # reshape(-1, h) flattens: kept
    kinds = [n.target for n in result.graph.module.graph.nodes]
    assert "reshape" in kinds and kinds.count("view") == 1
    assert_same_outputs(graph, result.graph, x)
    assert_same_outputs(graph, result.graph, (torch.randn(5, 7, 16),), draws=1)  # other sizes: nothing was baked


def test_a_dropped_node_hands_its_tesa_to_its_input():
    # the quantizer's bits sit on the dropout's output, which the linear reads: they must survive the removal
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1), nn.Linear(8, 4)).eval()
    x = (torch.randn(3, 8),)
    graph, _ = masked_graph(model, {}, x, propagate=False)
    table = {"_1": se.TeSA.dense((1, 8), bits=8)}
    result = simplify(graph, table, PassOptions())
    assert result.changes["dropouts removed"] == 1
    assert result.table["_0"].kept_bits() == [8]


def test_training_dropout_and_literal_batch_reshapes_stay():
    class Kept(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.dropout(x.view(4, 6), p=0.2, training=True) + self.drop(x).view(4, 6)

    model, x = Kept().train(), (torch.randn(4, 6),)
    graph = se.capture(model, x)
    result = simplify(graph, {}, PassOptions())
    assert result.changes["dropouts removed"] == 0  # a training dropout draws random numbers: not ours to drop
    assert result.changes["no-op reshapes removed"] == 0  # view(4, 6) names its batch: other batches must still fail


def test_constant_subexpressions_become_one_buffer():
    # a graph that computes from a buffer alone on every call (fx's own tracer would have folded it already)
    holder = nn.Module()
    holder.register_buffer("offset", torch.arange(6.0))
    g = torch.fx.Graph()
    x = g.placeholder("x")
    scaled = g.call_function(torch.mul, (g.get_attr("offset"), 2.0))
    shifted = g.call_function(torch.add, (scaled, 1.0))
    g.output(g.call_function(torch.add, (x, shifted)))
    gm = torch.fx.GraphModule(holder, g)
    graph = se.capture(gm, (torch.randn(3, 6),), method="graph_module")
    result = simplify(graph, {}, PassOptions())
    assert result.changes["constants folded"] == 1
    targets = [n.target for n in result.graph.module.graph.nodes if n.op == "call_function"]
    assert targets == [torch.add]  # x + the folded constant: mul and the first add ran once
    assert_same_outputs(graph, result.graph, (torch.randn(3, 6),))
