"""plan(): which ops get planned, their candidates, bits and fused activations."""

import torch
import torch.nn.functional as F
from torch import nn

import sparta_explore as se
from sparta_explore.plan import plan


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 96)
        self.fc2 = nn.Linear(96, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc3(F.gelu(self.fc2(h)) + 1)


def table_for(model, _inputs, **tesas):
    t = se.TeSATable()
    for name, tesa in tesas.items():
        t[name.replace("__", ".")] = tesa
    return t


def rows_pruned(shape, rows):
    mask = torch.ones(shape, dtype=torch.bool)
    mask[rows] = False
    return se.TeSA.from_mask(mask)


def test_only_pruned_or_quantized_ops_are_planned_with_dense_first(device):
    model, x = Net(), torch.randn(7, 64)
    g = se.capture(model, (x,))
    p = plan(g, table_for(model, None, fc1__weight=rows_pruned((96, 64), slice(0, 48))), device)
    assert list(p.ops) == ["fc1"]
    op = p.ops["fc1"]
    names = [c.name for c in op.candidates]
    assert names[0] == "dense" and "shrink" in names and "sparse" in names
    assert op.m == 7 and op.density == 0.5 and op.activation == "relu" and op.activation_node == "relu"
    assert op.candidate("shrink").predicted_ms < op.candidate("dense").predicted_ms
    assert set(p.table().columns) >= {"op", "choice", "parts", "bits", "pred_ms", "meas_ms", "dense_ms"}


def test_gelu_fuses_but_a_shared_output_does_not(device):
    model, x = Net(), torch.randn(3, 64)
    g = se.capture(model, (x,))
    t = table_for(model, None, fc2__weight=rows_pruned((64, 96), [0]), fc3__weight=rows_pruned((10, 64), [1]))
    p = plan(g, t, device)
    assert p.ops["fc2"].activation == "gelu"
    assert p.ops["fc3"].activation == "none"  # fc3's output is the model output, nothing after it


def test_int8_candidates_need_low_bits_on_weight_and_input(device):
    if 8 not in device.bits:
        return
    model, x = Net(), torch.randn(5, 64)
    g = se.capture(model, (x,))
    w8 = se.TeSA.dense((96, 64), bits=8)
    only_weight = plan(g, table_for(model, None, fc1__weight=w8), device).ops["fc1"]
    assert all(p.kernel != "int8" for c in only_weight.candidates for p in c.parts)
    assert only_weight.candidate("dense").parts[0].weight_bits == 8  # fp32 run on the 8-bit grid
    both = plan(g, table_for(model, None, fc1__weight=w8, x=se.TeSA.dense((1, 64), bits=8)), device).ops["fc1"]
    kernels = {p.kernel for c in both.candidates for p in c.parts}
    assert "int8" in kernels
    int8 = next(c for c in both.candidates if c.parts[0].kernel == "int8")
    assert int8.parts[0].weight_bits == 8 and int8.parts[0].act_bits == 8


def test_mixed_bits_offer_a_split(device):
    if 8 not in device.bits:
        return
    model, x = Net(), torch.randn(5, 64)
    bits = torch.full((96, 64), 32, dtype=torch.uint8)
    bits[:32] = 4
    t = table_for(model, None, fc1__weight=se.TeSA(bits), x=se.TeSA.dense((1, 64), bits=8))
    op = plan(se.capture(model, (x,)), t, device).ops["fc1"]
    split = op.candidate("split-sparse")
    assert sorted(p.weight_bits for p in split.parts) == [4, 32]
    assert {p.kernel for p in split.parts} == {"int8", "sparse"}


def test_convs_get_dense_shrink_and_sparse(device):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    x = torch.randn(2, 3, 10, 10)
    mask = torch.ones(8, 3, 3, 3, dtype=torch.bool)
    mask[:4] = False
    p = plan(se.capture(model, (x,)), {"0.weight": se.TeSA.from_mask(mask)}, device)
    op = p.ops["_0"]
    names = [c.name for c in op.candidates]
    assert op.kind == "conv" and names[:2] == ["dense", "shrink"]
    assert names[2:] == (["sparse"] if device.blocks else [])  # kxk: implicit GEMM, one block shape
    assert op.m == 2 * 8 * 8
