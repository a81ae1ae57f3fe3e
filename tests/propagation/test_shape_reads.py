"""Shape reads by slicing (`x.size()[:-1]`, as Hugging Face's Conv1D does) are shape-only ops, not a crash."""

import torch
from torch import nn

import sparta_explore as se


class SliceShape(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_shape = x.size()[:-1] + (4,)  # a getitem of a slice on a shape
        return torch.addmm(torch.zeros(4), x.reshape(-1, 8), self.weight).reshape(out_shape)


def test_propagation_reads_sliced_shapes():
    model, x = SliceShape(), torch.randn(2, 3, 8)
    graph = se.capture(model, x)
    kept = torch.ones(8, 4, dtype=torch.bool)
    kept[:, 1] = False
    result = se.run_propagation(graph, {"weight": se.TeSA.from_mask(kept)})
    assert result.check.passed
