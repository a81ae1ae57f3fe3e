"""attention: hand-written attention becomes one SDPA call where that measures faster, with the same output."""

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.compile.passes.attention import _match, attention
from sparta_explore.compile.passes.base import PassOptions
from sparta_explore.zoo.bert import BertConfig, BertEncoder

from .cases import assert_same_outputs, masked_graph


class Masked(nn.Module):
    """q k^T * scale + an additive mask, softmax, @ v."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.matmul(F.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.3 + mask, dim=-1), v)


def _sdpa_calls(graph) -> int:
    return sum(1 for n in graph.module.graph.nodes if n.target is F.scaled_dot_product_attention)


def test_every_encoder_attention_is_matched_and_the_output_stays():
    model = BertEncoder(BertConfig.tiny(layers=2)).eval()
    x = model.example_inputs()
    graph, table = masked_graph(model, {}, x, propagate=False)
    scores = [n for n in graph.module.graph.nodes if n.target is torch.matmul and _match(graph, n) is not None]
    assert len(scores) == 2  # one match per layer
    result = attention(graph, table, PassOptions(runs=3))
    fused, apart = result.changes["attentions fused"], result.changes["kept apart (slower fused)"]
    assert fused + apart == 2 and _sdpa_calls(result.graph) == fused  # each kept the faster form
    assert len(result.notes) == 2 and all("sdpa" in note for note in result.notes)
    assert_same_outputs(graph, result.graph, x)


def test_scale_and_additive_mask_carry_into_sdpa():
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    mask = torch.randn(2, 1, 5, 5)
    graph, table = masked_graph(Masked(), {}, (q, k, v, mask), propagate=False)
    (scores,) = [n for n in graph.module.graph.nodes if n.target is torch.matmul and _match(graph, n)]
    match = _match(graph, scores)
    assert match.scale == 0.3 and match.mask is not None and match.mask.name == "mask"
    result = attention(graph, table, PassOptions(runs=3))
    assert_same_outputs(graph, result.graph, (q, k, v, mask))


def test_scores_with_another_reader_are_left_alone():
    class Peeking(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            s = torch.matmul(q, k.transpose(-1, -2)) / 2.0
            return torch.matmul(F.softmax(s, dim=-1), v).sum() + s.sum()

    x = tuple(torch.randn(1, 2, 4, 3) for _ in range(3))
    graph, table = masked_graph(Peeking(), {}, x, propagate=False)
    assert attention(graph, table, PassOptions(runs=3)).changes["attentions fused"] == 0
