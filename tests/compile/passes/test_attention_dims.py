"""attention_dims: each SDPA head keeps the features that can change its output; dead heads go; output unchanged."""

import torch
import torch.nn.functional as F
from torch import nn

import sparta_explore as se
from sparta_explore.compile.passes.attention import attention
from sparta_explore.compile.passes.attention_dims import attention_dims
from sparta_explore.compile.passes.base import PassOptions
from sparta_explore.zoo.bert import BertConfig, BertEncoder

from .cases import assert_same_outputs, masked_graph


class HFStyle(nn.Module):
    """What torch.export leaves of a Hugging Face attention: reshape(b, t, -1, d), SDPA with a mask, reshape back."""

    def __init__(self, hidden: int = 24, heads: int = 3) -> None:
        super().__init__()
        self.d = hidden // heads
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (m(x).reshape(b, t, -1, self.d).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        return self.o(a.reshape(b, -1, t, self.d).transpose(1, 2).reshape(b, t, -1))


def _rows(n: int, dead: list[int]) -> torch.Tensor:
    keep = torch.ones(n, dtype=torch.bool)
    keep[dead] = False
    return keep


def test_per_head_features_narrow_and_dead_heads_go():
    model = HFStyle().eval()
    x = (torch.randn(2, 5, 24), torch.randn(2, 1, 5, 5))
    q, k = _rows(24, [0, 1, 2, 9, 10]), _rows(24, [3, 9, 11, 12])  # heads 0 and 1: 4 features both keep
    v, o = _rows(24, list(range(16, 24))), _rows(24, [0, 5])  # head 2's values are all pruned: a dead head
    table = {"q.weight": se.TeSA.from_mask(q[:, None].expand(-1, 24)), "q.bias": se.TeSA.from_mask(q),
             "k.weight": se.TeSA.from_mask(k[:, None].expand(-1, 24)), "k.bias": se.TeSA.from_mask(k),
             "v.weight": se.TeSA.from_mask(v[:, None].expand(-1, 24)), "v.bias": se.TeSA.from_mask(v),
             "o.weight": se.TeSA.from_mask(o[None, :].expand(24, -1))}
    graph, usable = masked_graph(model, table, x)
    result = attention_dims(graph, usable, PassOptions())
    assert result.changes["attentions narrowed"] == 1 and result.changes["heads removed"] == 1
    gm = result.graph.module
    assert gm.get_submodule("q").out_features == gm.get_submodule("k").out_features == 2 * 4  # 2 heads x 4
    assert gm.get_submodule("v").out_features == 2 * 8 and gm.get_submodule("o").in_features == 16  # 6 and 8: 8
    assert_same_outputs(graph, result.graph, x)


def test_the_encoder_attention_made_sdpa_narrows_too():
    cfg = BertConfig.tiny(layers=1)
    model = BertEncoder(cfg).eval()
    x = model.example_inputs()
    dead = torch.zeros(cfg.hidden, dtype=torch.bool)
    dead[::3] = True  # a third of every head's query features
    table = {"layers.0.attn.query.weight": se.TeSA.from_mask(~dead[:, None].expand(-1, cfg.hidden)),
             "layers.0.attn.query.bias": se.TeSA.from_mask(~dead)}
    graph, usable = masked_graph(model, table, x)
    fused = attention(graph, usable, PassOptions(runs=3))
    if not fused.changes["attentions fused"]:
        return  # SDPA measured slower here: nothing for this pass to narrow
    result = attention_dims(fused.graph, fused.table, PassOptions())
    assert result.changes["attentions narrowed"] == 1
    assert result.graph.module.get_submodule("layers.0.attn.query").out_features < cfg.hidden
    assert_same_outputs(graph, result.graph, x)
