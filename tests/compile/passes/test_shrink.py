"""shrink: what is pruned across a whole dependency group is cut out; every rewrite keeps the output."""

import torch
import torch.nn.functional as F
from torch import nn

import sparta_explore as se
from sparta_explore.compile.passes.base import PassOptions
from sparta_explore.compile.passes.pipeline import run_passes
from sparta_explore.compile.passes.shrink import shrink
from sparta_explore.compile.passes.shrink_ops import AlignedAdd, ExpandChannels
from sparta_explore.zoo.bert import BertConfig, BertEncoder
from sparta_explore.zoo.convnets import InvertedResidual, MobileNetV2Mini, ResNetMini

from .cases import assert_same_outputs, every_other, masked_graph, randomize_norms, rows_pruned

THROUGH_SHRINK = ("simplify", "fold_batchnorm", "constant_channels", "shrink")


def _uses(graph, cls) -> int:
    return sum(1 for n in graph.module.graph.nodes if n.op == "call_module"
               and isinstance(graph.module.get_submodule(n.target), cls))


def _weights(graph) -> int:
    return sum(m.weight.numel() for m in graph.module.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))


def test_an_inverted_residual_block_shrinks_through_depthwise_and_keeps_its_residual():
    block = randomize_norms(InvertedResidual(6, 6, stride=1, expand=3))  # ragged: 18 hidden channels, 7 cut
    x = (torch.randn(2, 6, 9, 9),)
    table = rows_pruned(block, {"body.0": [0, 2, 3, 8, 11, 15, 17], "body.6": [1, 4]})
    graph, usable = masked_graph(block, table, x)
    after, _, reports = run_passes(graph, usable, THROUGH_SHRINK)
    shrunk = reports[-1]
    assert shrunk.changes["ops shrunk"] >= 3  # expand rows, depthwise groups, project columns
    hidden = after.module.get_submodule("body.3")
    assert hidden.groups == hidden.in_channels == 11  # the depthwise conv kept its 11 live groups
    assert after.module.get_submodule("body.6").in_channels == 11
    assert_same_outputs(graph, after, x)
    assert _weights(after) < _weights(graph)


def test_residual_adds_meet_different_channel_sets_in_their_union():
    model = randomize_norms(ResNetMini(widths=(8, 12), blocks=1, in_channels=3))
    x = (torch.randn(2, 3, 8, 8),)
    table = rows_pruned(model, {"stem.0": every_other(8), "stages.0.conv1": [1, 2, 5],
                                "stages.0.conv2": every_other(8, 1), "stages.1.conv1": every_other(12),
                                "stages.1.shortcut.0": [0, 5, 7], "stages.1.conv2": [1, 5, 9]})
    graph, usable = masked_graph(model, table, x)
    after, _, reports = run_passes(graph, usable, THROUGH_SHRINK)
    assert reports[-1].changes["ops shrunk"] > 0
    assert_same_outputs(graph, after, x)


def test_a_mobilenet_v2_shrinks_exactly_through_every_pass():
    model = randomize_norms(MobileNetV2Mini(stages=((1, 8, 1, 1), (3, 12, 2, 2)), stem=8, last=16, in_channels=3))
    x = (torch.randn(2, 3, 12, 12),)
    convs = {n: every_other(m.out_channels, i % 2) for i, (n, m) in enumerate(model.named_modules())
             if isinstance(m, nn.Conv2d) and m.groups == 1}
    graph, usable = masked_graph(model, rows_pruned(model, convs), x)
    after, _, reports = run_passes(graph, usable, THROUGH_SHRINK)
    assert reports[-1].changes["channels removed"] > 0
    assert_same_outputs(graph, after, x)
    assert _weights(after) < 0.75 * _weights(graph)


def test_heads_pruned_whole_shrink_the_attention_and_its_reshapes():
    cfg = BertConfig.tiny(layers=1)
    model = BertEncoder(cfg).eval()
    x = model.example_inputs()
    dead = torch.zeros(cfg.hidden, dtype=torch.bool)
    d = cfg.hidden // cfg.heads
    dead[d:2 * d] = dead[3 * d:] = True  # heads 1 and 3 of 4
    table = se.TeSATable({f"layers.0.attn.{p}.weight": se.TeSA.from_mask(~dead[:, None].expand(-1, cfg.hidden))
                          for p in ("query", "key", "value")})
    table["layers.0.attn.out.weight"] = se.TeSA.from_mask(~dead[None, :].expand(cfg.hidden, -1))
    for p in ("query", "key", "value"):
        table[f"layers.0.attn.{p}.bias"] = se.TeSA.from_mask(~dead)
    graph, usable = masked_graph(model, table, x)
    result = shrink(graph, usable, PassOptions())
    assert result.changes["channels removed"] == 3 * cfg.hidden // 2  # Q, K, V rows of two heads
    assert result.graph.module.get_submodule("layers.0.attn.out").in_features == cfg.hidden // 2
    views = [n for n in result.graph.module.graph.nodes if n.target == "view"]
    assert all(cfg.heads // 2 in n.args for n in views)  # the head count written into the reshapes
    assert _uses(result.graph, ExpandChannels) == 0
    assert_same_outputs(graph, result.graph, x)
    assert_same_outputs(graph, result.graph, (torch.randn(3, 5, cfg.hidden),), draws=1)  # other batch and length


def test_sdpa_with_inferred_head_counts_shrinks_too():
    class Attention(nn.Module):  # the shape Hugging Face exports: reshape(b, t, -1, d), SDPA, reshape(b, t, -1)
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(16, 16) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (m(x).reshape(b, t, -1, 4).transpose(1, 2) for m in (self.q, self.k, self.v))
            return self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, -1))

    model, x = Attention().eval(), (torch.randn(2, 6, 16),)
    dead = torch.zeros(16, dtype=torch.bool)
    dead[4:8] = True  # head 1 of 4
    table = {f"{p}.weight": se.TeSA.from_mask(~dead[:, None].expand(-1, 16)) for p in "qkv"}
    table["o.weight"] = se.TeSA.from_mask(~dead[None, :].expand(16, -1))
    graph, usable = masked_graph(model, table, x)
    result = shrink(graph, usable, PassOptions())
    assert result.graph.module.get_submodule("o").in_features == 12
    assert_same_outputs(graph, result.graph, x)


def test_where_a_rule_cannot_hold_channels_the_value_comes_back_at_full_width():
    class Normed(nn.Module):  # LayerNorm over the cut channels: they must read as zeros there
        def __init__(self) -> None:
            super().__init__()
            self.a, self.norm, self.b = nn.Linear(8, 10), nn.LayerNorm(10), nn.Linear(10, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.norm(torch.relu(self.a(x))))

    model, x = Normed().eval(), (torch.randn(4, 8),)
    graph, usable = masked_graph(model, rows_pruned(model, {"a": [0, 4, 9]}), x)
    result = shrink(graph, usable, PassOptions())
    assert result.changes["ops shrunk"] == 1 and result.changes["expansions"] == 1
    assert _uses(result.graph, ExpandChannels) == 1
    assert_same_outputs(graph, result.graph, x)


def test_rows_only_reshaped_before_full_width_are_not_cut():
    # Q and K lose different features: attention needs them whole again, so cutting would only add expansions
    cfg = BertConfig.tiny(layers=1)
    model = BertEncoder(cfg).eval()
    x = model.example_inputs()
    table = rows_pruned(model, {"layers.0.attn.query": [0, 5], "layers.0.attn.key": [3, 9]})
    graph, usable = masked_graph(model, table, x)
    result = shrink(graph, usable, PassOptions())
    assert _uses(result.graph, ExpandChannels) == 0
    assert result.graph.module.get_submodule("layers.0.attn.query").out_features == cfg.hidden
    assert_same_outputs(graph, result.graph, x)


def test_a_walk_again_reuses_the_slices_of_the_one_before(monkeypatch):
    # Q and K rows force a second walk; fc1's rows (and fc2's columns) are cut the same way in both walks
    from sparta_explore.compile.passes import shrink_rules

    made = []
    original = shrink_rules._sliced
    monkeypatch.setattr(shrink_rules, "_sliced", lambda m, rows, cols: made.append(m) or original(m, rows, cols))
    model = BertEncoder(BertConfig.tiny(layers=1)).eval()
    x = model.example_inputs()
    table = rows_pruned(model, {"layers.0.attn.query": [0, 5], "layers.0.attn.key": [3, 9],
                                "layers.0.ffn.fc1": [1, 2, 7]})
    graph, usable = masked_graph(model, table, x)
    result = shrink(graph, usable, PassOptions())
    fc1 = graph.module.get_submodule("layers.0.ffn.fc1")
    assert result.graph.module.get_submodule("layers.0.ffn.fc1").out_features == fc1.out_features - 3
    assert result.graph.module.get_submodule("layers.0.attn.query").out_features == fc1.in_features
    # first walk: query, key, fc1, fc2; the second cuts neither query nor key and reuses fc1's and fc2's slices
    assert len(made) == 4
    assert_same_outputs(graph, result.graph, x)


def test_concat_and_flatten_carry_channel_offsets():
    class Branches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 5, 1), nn.Conv2d(3, 4, 1)
            self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(9, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.cat([torch.relu(self.a(x)), self.b(x)], dim=1)
            return self.fc(torch.flatten(self.pool(y), 1))

    model, x = Branches().eval(), (torch.randn(2, 3, 5, 5),)
    graph, usable = masked_graph(model, rows_pruned(model, {"a": [1, 3], "b": [0]}), x)
    result = shrink(graph, usable, PassOptions())
    assert result.graph.module.get_submodule("fc").in_features == 6
    assert _uses(result.graph, ExpandChannels) == 0
    assert_same_outputs(graph, result.graph, x)


def test_aligned_add_matches_a_plain_add_of_the_full_tensors():
    a_idx, b_idx = torch.tensor([0, 2, 3]), torch.tensor([1, 2])
    a, b = torch.randn(2, 3, 4), torch.randn(2, 2, 4)
    full_a, full_b = torch.zeros(2, 5, 4), torch.zeros(2, 5, 4)
    full_a[:, a_idx], full_b[:, b_idx] = a, b
    union = torch.tensor([0, 1, 2, 3])
    add = AlignedAdd(1, 4, torch.tensor([0, 2, 3]), torch.tensor([1, 2]), alpha=-1.0)
    assert torch.allclose(add(a, b), (full_a - full_b)[:, union])


def test_scales_keep_cut_channels_and_a_cut_divisor_stops_shrinking():
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = 2.0 * self.a(x) / 4.0
            return self.c(self.b(y) + x.sum(-1, keepdim=True) / (self.a(x).abs() + 1))

    model, x = Scaled().eval(), (torch.randn(3, 6),)
    graph, usable = masked_graph(model, rows_pruned(model, {"b": [1, 6]}), x, propagate=True)
    result = shrink(graph, usable, PassOptions())
    assert_same_outputs(graph, result.graph, x)


def test_grouped_convs_shrink_when_their_groups_stay_even():
    model = randomize_norms(nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=2),
                                          nn.ReLU(), nn.Conv2d(8, 4, 1)))
    x = (torch.randn(2, 3, 6, 6),)
    even = rows_pruned(model, {"0": [1, 5]})  # one input channel of each group: 3 and 3 remain
    graph, usable = masked_graph(model, even, x)
    result = shrink(graph, usable, PassOptions())
    grouped = result.graph.module.get_submodule("2")
    assert grouped.groups == 2 and grouped.in_channels == 6 and grouped.weight.shape[1] == 3
    assert_same_outputs(graph, result.graph, x)
    uneven = rows_pruned(model, {"0": [1, 2, 5]})  # 2 and 3: the groups would differ, the input comes back whole
    graph, usable = masked_graph(model, uneven, x)
    result = shrink(graph, usable, PassOptions())
    assert result.graph.module.get_submodule("2").in_channels == 8
    assert_same_outputs(graph, result.graph, x)


def test_hugging_face_conv1d_shrinks_in_its_in_out_layout():
    from transformers.pytorch_utils import Conv1D

    class MLP(nn.Module):  # GPT-2's: weights stored (in, out)
        def __init__(self) -> None:
            super().__init__()
            self.c_fc, self.c_proj = Conv1D(16, 8), Conv1D(8, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c_proj(F.gelu(self.c_fc(x)))

    model, x = MLP().eval(), (torch.randn(2, 5, 8),)
    dead = torch.zeros(16, dtype=torch.bool)
    dead[[0, 3, 4, 9, 15]] = True
    table = {"c_fc.weight": se.TeSA.from_mask(~dead[None, :].expand(8, -1)), "c_fc.bias": se.TeSA.from_mask(~dead)}
    graph, usable = masked_graph(model, table, x, leaf_modules=(Conv1D,))  # as torch.export re-lifts them
    result = shrink(graph, usable, PassOptions())
    gm = result.graph.module
    assert gm.get_submodule("c_fc").weight.shape == (8, 11) and gm.get_submodule("c_fc").nf == 11
    assert gm.get_submodule("c_proj").weight.shape == (11, 8)
    assert_same_outputs(graph, result.graph, x)
