"""same_references: two tables whose references compute the same outputs on the example, read from the tables."""

import copy

import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.same_references import read_elements, same_references


class Positions(nn.Module):
    """Reads the first T of its 16 position ids, T the input's length (BERT's `position_ids[:, :T]`)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ids", torch.arange(16).unsqueeze(0))
        self.register_buffer("scale", torch.ones(4))
        self.emb = nn.Embedding(16, 4)

    def forward(self, x):
        return self.emb(self.ids[:, : x.shape[1]]) * self.scale.expand(4) + x.unsqueeze(-1)


def test_read_elements_are_the_constant_slices_the_example_reads():
    graph = se.capture(Positions(), (torch.randn(2, 5),))
    a, b = copy.deepcopy(graph.module), copy.deepcopy(graph.module)
    read = read_elements(a, "ids", a.ids.shape, graph.constants)
    assert read.tolist() == [[True] * 5 + [False] * 11]
    b.ids[0, 9:] = 0  # what masking a propagated table does to positions the example never reaches
    assert torch.equal(graph.run(a), graph.run(b))
    assert read_elements(a, "scale", a.scale.shape, graph.constants) is None  # read whole (expand): unknown
    assert read_elements(a, "emb.weight", a.emb.weight.shape, graph.constants) is None  # read by its module


class PositionsHead(Positions):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(super().forward(x))


def test_same_references_reads_the_tables_alone():
    graph = se.capture(PositionsHead(), (torch.randn(2, 5),))
    w = (3, 4)
    base = {"head.weight": se.TeSA.from_mask(torch.rand(w, generator=torch.Generator().manual_seed(1)) < 0.5)}
    unread = torch.zeros(1, 16, dtype=torch.bool)
    unread[0, 9:] = True
    assert same_references(graph, base, dict(base))
    assert same_references(graph, base, base | {"ids": se.TeSA.from_mask(~unread)})  # prunes only what is never read
    read = torch.zeros(1, 16, dtype=torch.bool)
    read[0, 2] = True
    assert not same_references(graph, base, base | {"ids": se.TeSA.from_mask(~read)})
    assert not same_references(graph, base, {"head.weight": se.TeSA.dense(w)})  # another mask
    on_grid = {"head.weight": se.TeSA(base["head.weight"].bits.clamp(max=8))}
    assert not same_references(graph, base, on_grid)  # a weight put on an 8-bit grid
    head_input = next(n.args[0].name for n in graph.module.graph.nodes if n.op == "call_module" and n.target == "head")
    shape = graph.tensors[head_input].shape
    assert not same_references(graph, on_grid, on_grid | {head_input: se.TeSA.dense(shape, bits=8)})  # int8 input
