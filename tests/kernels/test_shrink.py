"""ShrunkLinear: the dense op on kept rows and columns equals the masked dense op."""

import pytest
import torch
import torch.nn.functional as F

from sparta_explore.kernels import ShrunkLinear


@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_shrunk_matches_masked_dense(activation, with_bias):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(12, 10, generator=g), torch.randn(12, generator=g) if with_bias else None
    kept = torch.rand(12, 10, generator=g) > 0.3
    kept[[1, 5, 6]] = False       # pruned output rows
    kept[:, [0, 9]] = False       # pruned input columns
    layer = ShrunkLinear(w, b, kept, activation)
    assert layer.weight_small.shape == (9, 8)
    x = torch.randn(3, 4, 10, generator=g)
    want = {"none": lambda y: y, "relu": F.relu, "gelu": F.gelu}[activation](F.linear(x, w * kept, b))
    assert torch.allclose(layer(x), want, atol=1e-5)


def test_all_pruned_and_fully_dense():
    w, b = torch.randn(4, 3), torch.randn(4)
    none = ShrunkLinear(w, b, torch.zeros(4, 3, dtype=torch.bool), "relu")
    assert torch.allclose(none(torch.randn(2, 3)), F.relu(b).expand(2, 4))
    full = ShrunkLinear(w, b, torch.ones(4, 3, dtype=torch.bool))
    assert full.density == 1.0 and torch.allclose(full(x := torch.randn(2, 3)), F.linear(x, w, b), atol=1e-6)
