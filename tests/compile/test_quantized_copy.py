"""`quantized_copy`: the model a table with bits describes, in the model's own tree, equals what compile runs."""

import copy
import pickle

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.config import CompileConfig
from sparta_explore.compile.quantized_copy import RoundInput, quantized_copy
from sparta_explore.fake_quant import fake_quantize_rows
from sparta_explore.kernels import cpu_flags
from sparta_explore.quantizers import bits_to_table
from sparta_explore.tesa import NumberFormat, TeSA

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def test_weights_go_on_row_grids_and_inputs_on_token_grids_where_the_table_says():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
    x = torch.randn(4, 8)
    graph = se.capture(model, (x,))
    table = bits_to_table(graph, {"0": {"weight": (4, NumberFormat.INT), "_input_0": (8, NumberFormat.INT)},
                                  "2": {"weight": (8, NumberFormat.INT)}})
    mask = torch.ones(6, 8)
    mask[:, :3] = 0  # pruned columns stay exactly zero on the grid
    table["0.weight"] = table["0.weight"].merge(TeSA.from_mask(mask))
    ref = quantized_copy(model, table, graph=graph)
    assert torch.equal(ref[0].weight, fake_quantize_rows(model[0].weight.detach() * mask, 4))
    assert torch.equal(ref[2].weight, fake_quantize_rows(model[2].weight.detach(), 8))
    assert [type(h) for h in ref[0]._forward_pre_hooks.values()] == [RoundInput] and not ref[2]._forward_pre_hooks
    assert torch.equal(model[0].weight, graph.root[0].weight)  # the user's model is untouched
    # a different batch than captured runs, and a pickled / deep-copied copy computes the same
    y = torch.randn(7, 8)
    again = pickle.loads(pickle.dumps(ref))
    assert torch.equal(again(y), ref(y)) and torch.equal(copy.deepcopy(ref)(y), ref(y))
    assert not torch.equal(ref(y), se.masked_copy(model, table)(y))  # the bits change the numbers


def test_a_w8a8_llama_compiled_in_place_computes_its_quantized_copy(tiny_llama, device):
    if "avx2" not in cpu_flags():
        pytest.skip("the int8 kernels need AVX2")
    model = tiny_llama()
    prompt = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(3))
    graph = se.capture(model, (prompt,))
    table = bits_to_table(graph, {f"model.layers.{i}.{name}": {"weight": (8, NumberFormat.INT),
                                                               "_input_0": (8, NumberFormat.INT)}
                                  for i in range(2) for name in LINEARS})
    reference = quantized_copy(model, table, (prompt,))
    compiled = se.compile(copy.deepcopy(model), table, (prompt,), config=CompileConfig(inplace=True, device=device,
                                                                                     guard=False))
    assert compiled.sparta_compiled.swapped  # kernels hold the linears
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(4))  # not the captured shape
    with torch.no_grad():
        want, got = reference(ids).logits, compiled(ids).logits
        fp32 = se.masked_copy(model, table)(ids).logits
    error = float((got - want).norm() / want.norm())
    assert error < 1e-3, error
    assert float((fp32 - want).norm() / want.norm()) > 10 * error  # the copy holds the bits, not fp32
