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


def test_unmasked_attention_closed_form_equals_the_product_rule():
    # the closed form sdpa uses without a causal mask must agree with the generic multilinear
    # product rule on every kept element, for broadcast batch dims and any density
    from sparta_explore.propagation.algebra import multilinear_masks
    from sparta_explore.propagation.rules_linear import attention_masks_unmasked

    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        bq, bk = [((2, 3), (2, 3)), ((1, 3), (2, 3)), ((2, 1), (1, 3))][trial % 3]
        p = (0.2, 0.6, 0.95)[(trial // 3) % 3]
        q, k, v = (torch.rand(*b, n, d, generator=g) < p for b, n, d in ((bq, 4, 3), (bk, 5, 3), (bk, 5, 2)))
        batch = torch.broadcast_shapes(bq, bk)
        allowed = torch.rand(*batch, 4, 2, generator=g) < 0.8
        kq, kk, kv, out = attention_masks_unmasked(q, k, v, allowed)
        scores = batch + (4, 5)
        out_ref, (kp, kv_ref) = multilinear_masks(torch.matmul, [torch.ones(scores, dtype=torch.bool), v], allowed)
        rows = kp.any(-1, keepdim=True).expand(scores)
        _, (kq_ref, kk_ref) = multilinear_masks(lambda a, b: a @ b.transpose(-1, -2), [q, k], rows)
        assert torch.equal(out, out_ref)
        for got, ref, kept in ((kq, kq_ref, q), (kk, kk_ref, k), (kv, kv_ref, v)):
            assert got.shape == kept.shape and torch.equal(got & kept, ref & kept)


def test_batch_invariant_activation_attributes_stay_one_row():
    # propagation cost must not grow with batch x tokens when attributes are the same for every
    # token: the keys of a transformer's activations are broadcasts of one row (and still right)
    from sparta_explore.compact import core

    cfg = BertConfig(hidden=16, heads=4, ffn=32, layers=2, batch=3, seq=7)
    model = BertEncoder(cfg)
    rows = [0, 5, 31]
    entries = {"layers.1.ffn.fc1.weight": prune_rows((32, 16), rows), "layers.1.ffn.fc1.bias": prune_rows((32,), rows)}
    graph, result = propagate_checked(model, model.example_inputs(), entries)
    activations = [n for n, info in graph.tensors.items() if info.kind == "activation" and len(info.shape) == 3]
    assert activations
    for name in activations:
        key = result.table[name]._key
        assert core(key).shape[:2] == (1, 1), name
    fc1_out = [n for n in activations if result.table[n].shape[-1] == 32 and result.table[n].sparsity > 0]
    assert fc1_out and all(result.table[n].pruned[..., rows].all() for n in fc1_out)
