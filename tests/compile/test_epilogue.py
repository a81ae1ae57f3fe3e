"""fuse_epilogue: adds, scales and the activation after an op run inside it, in place; the result is unchanged."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sparta_explore as se
from sparta_explore.compile.epilogue import RELU, Epilogue, fuse_epilogues
from sparta_explore.compile.passes.graph_edit import editable


class Block(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.conv, self.act = nn.Conv2d(4, 4, 3, padding=1), act
        self.register_buffer("shift", torch.randn(1, 4, 6, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act((self.conv(x) + self.shift) * 0.5 + x)


@pytest.mark.parametrize("act", [nn.ReLU(), nn.ReLU6(), nn.GELU(), nn.SiLU(), nn.Hardswish(), nn.Hardtanh(-2, 3)])
def test_a_chain_after_a_conv_becomes_one_epilogue(act):
    model, x = Block(act).eval(), (torch.randn(2, 4, 6, 6),)
    graph = se.capture(model, x)
    gm = editable(graph)
    counts = fuse_epilogues(graph, gm, {})
    gm.recompile()
    assert counts == {"ops fused": 1, "steps fused": 4}  # + map, * 0.5, + residual, activation
    fused = gm.get_submodule("conv")
    assert isinstance(fused, Epilogue) and [k for k, _ in fused.steps] == ["add", "scale", "add", "act"]
    with torch.no_grad():
        assert torch.allclose(gm(*x), model(*x), atol=1e-6)


def test_epilogue_runs_out_of_place_when_gradients_flow():
    ep = Epilogue(nn.Linear(3, 3), (("add", 0), ("act", RELU)))
    x, r = torch.randn(2, 3, requires_grad=True), torch.randn(2, 3)
    y = ep(x, r)
    y.sum().backward()
    assert x.grad is not None
    assert torch.allclose(y, F.relu(ep.op(x) + r))
    assert torch.allclose(ep.reference(x, r), y)
