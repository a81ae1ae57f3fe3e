"""Attention heads: a head whose values are pruned prunes its slice of the output projection."""

import torch

from sparta_explore.zoo import BertConfig, BertEncoder

from .helpers import newly_pruned, propagate_checked, prune_rows


def test_pruned_value_head_prunes_its_output_projection_columns():
    cfg = BertConfig(hidden=16, heads=4, ffn=32, layers=1, batch=1, seq=5)
    model = BertEncoder(cfg)
    head = range(4, 8)  # head 1 of 4, head_dim 4
    entries = {"layers.0.attn.value.weight": prune_rows((16, 16), head),
               "layers.0.attn.value.bias": prune_rows((16,), head)}
    _, result = propagate_checked(model, model.example_inputs(), entries)
    out = newly_pruned(result, "layers.0.attn.out.weight")
    assert out[:, 4:8].all() and not out[:, :4].any() and not out[:, 8:].any()


def test_pruned_ffn_rows_prune_second_linear_columns():
    cfg = BertConfig(hidden=16, heads=4, ffn=32, layers=2, batch=1, seq=5)
    model = BertEncoder(cfg)
    rows = [0, 5, 31]
    entries = {"layers.1.ffn.fc1.weight": prune_rows((32, 16), rows), "layers.1.ffn.fc1.bias": prune_rows((32,), rows)}
    _, result = propagate_checked(model, model.example_inputs(), entries)
    assert newly_pruned(result, "layers.1.ffn.fc2.weight")[:, rows].all()


def test_pruned_query_and_key_columns_meet_in_scores():
    cfg = BertConfig(hidden=8, heads=2, ffn=16, layers=1, batch=1, seq=3)
    model = BertEncoder(cfg)
    entries = {"layers.0.attn.query.weight": prune_rows((8, 8), [0, 1]),
               "layers.0.attn.query.bias": prune_rows((8,), [0, 1])}
    _, result = propagate_checked(model, model.example_inputs(), entries)
    # q[:, 0:2] is zero, so k[:, 0:2] never meets a kept factor in q k^T: those key rows are irrelevant
    assert newly_pruned(result, "layers.0.attn.key.weight")[[0, 1]].all()
    assert torch.equal(result.table["layers.0.attn.key.weight"].pruned[2:], torch.zeros(6, 8, dtype=torch.bool))
