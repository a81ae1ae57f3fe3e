"""Modules the graph keeps whole read their children's parameters: nothing inside them is pruned as unread.

Regression for the silent wrong model: with `nn.MultiheadAttention` (or a
TransformerEncoderLayer, or a user leaf with children) kept whole, propagation used to
prune every parameter inside as "read by nobody" (output change ~28850) and compile
verified against that wrong table.
"""

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.propagation.verify import max_output_change


class _Attention(nn.Module):
    def __init__(self, need_weights: bool):
        super().__init__()
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)
        self.fc = nn.Linear(32, 8)
        self.need_weights = need_weights

    def forward(self, x):
        return self.fc(self.mha(x, x, x, need_weights=self.need_weights)[0])


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
        self.fc = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc(self.enc(x))


class _Block(nn.Module):
    """A user module with children, kept whole with leaf_modules."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(32, 32), nn.Tanh())
        self.scale = nn.Parameter(torch.ones(32))

    def forward(self, x):
        return self.inner(x) * self.scale


class _WithBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _Block()
        self.fc = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc(self.block(x))


CASES = {
    "mha-need-weights-false": (lambda: _Attention(False), {"method": "fx"}),
    "mha-need-weights-true": (lambda: _Attention(True), {"method": "fx"}),
    "encoder-layer-fx-leaf": (_Encoder, {"method": "fx"}),
    "user-leaf-with-children": (_WithBlock, {"leaf_modules": [_Block]}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_inside_a_kept_whole_module_are_never_pruned_as_unread(name, device, cache_dir):
    build, options = CASES[name]
    torch.manual_seed(0)
    model = build().eval()
    x = torch.randn(2, 6, 32)
    graph = se.capture(model, x, **options)
    kept = torch.rand(8, 32, generator=torch.Generator().manual_seed(1)) > 0.5
    table = se.TeSATable({"fc.weight": se.TeSA.from_mask(kept)})
    result = se.run_propagation(graph, table, check=False)  # the propagation itself, not its safety net
    inside = [n for n in result.table if "." in n and not n.startswith("fc.")]
    assert inside and all(result.table[n].sparsity == 0.0 for n in inside), \
        {n: result.table[n].sparsity for n in inside if result.table[n].sparsity}
    assert max_output_change(graph, table, result.table) < 1e-4
    cm = se.compile(graph, result, device=device, cache_dir=cache_dir, tune=False)
    assert cm.checks["passed"].all(), cm.checks
    with torch.no_grad():
        assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-4)


def test_a_leaf_with_no_rule_is_scrambled_over_all_its_parameters():
    model = _WithBlock().eval()
    graph = se.capture(model, torch.randn(2, 6, 32), leaf_modules=[_Block])
    node = next(n for n in graph.nodes() if n.target == "block")
    assert set(graph.params_of(node)) == {"scale", "inner.0.weight", "inner.0.bias"}
    # pruning the leaf's inner weight rows zeroes those outputs of the leaf (tanh(0) * scale = 0)
    kept = torch.ones(32, 32, dtype=torch.bool)
    kept[:4] = False
    table = se.TeSATable({"block.inner.0.weight": se.TeSA.from_mask(kept),
                          "block.inner.0.bias": se.TeSA.from_mask(torch.arange(32) >= 4)})
    result = se.run_propagation(graph, table)
    assert "block" in result.report.scrambled
    assert bool(result.table["block"].pruned[..., :4].all())  # found by scrambling the leaf's parameters
    assert result.table["fc.weight"].pruned[:, :4].all()  # and carried on to the next layer's columns
    assert result.check.passed
