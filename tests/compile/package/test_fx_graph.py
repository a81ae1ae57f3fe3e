"""fx graphs as data: structure, arguments and calling convention come back; hostile targets do not."""

import pytest
import torch
import torch.fx as fx
from torch import nn

from sparta_explore.compile.package.fx_graph import decode_graph, encode_graph
from sparta_explore.compile.package.tensors import TensorStore, TensorTable
from sparta_explore.compile.package.values import Decoder, Encoder
from sparta_explore.errors import PackageError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, x, y=None):
        h = self.fc(x).clamp(min=float("-inf"), max=3.0) * self.scale
        parts = torch.split(h, [3, 5], dim=-1)
        return {"a": parts[0].reshape(x.shape[0], -1), "b": (parts[1][..., 1:], h.size(-1))}


def _round_trip(gm):
    store = TensorStore()
    data = encode_graph(Encoder(store), gm, "m")
    root = nn.Module()
    root.fc, root.scale = gm.fc, gm.scale
    arrays, meta = store.arrays()
    return data, decode_graph(Decoder(TensorTable(arrays, meta, "m")), data, root, "m")


def test_a_traced_graph_comes_back_and_computes_the_same():
    gm = fx.symbolic_trace(Net())
    data, back = _round_trip(gm)
    x = torch.randn(4, 8)
    want, got = gm(x), back(x)
    assert torch.equal(got["a"], want["a"]) and torch.equal(got["b"][0], want["b"][0]) and got["b"][1] == 8
    assert [n.name for n in back.graph.nodes] == [n.name for n in gm.graph.nodes]


def test_an_exported_graph_keeps_its_calling_convention():
    gm = torch.export.export(nn.Linear(4, 2), (torch.randn(3, 4),)).module()
    store = TensorStore()
    data = encode_graph(Encoder(store), gm, "m")
    assert data["codegen"]["kind"] == "pytree"
    root = nn.Module()
    root._modules.update(gm._modules)
    root._parameters.update(gm._parameters)
    back = decode_graph(Decoder(TensorTable(*store.arrays(), "m")), data, root, "m")
    x = torch.randn(3, 4)  # export specialized the batch: its guard node came back too
    assert torch.equal(back(x), gm(x))


@pytest.mark.parametrize("change, match", [
    ({"op": "call_method", "target": "__reduce__"}, "not a tensor method"),
    ({"op": "call_method", "target": "system"}, "not a tensor method"),
    ({"op": "call_module", "target": "fc; import os"}, "malformed module path"),
    ({"op": "call_function", "target": {"$callable": "posix.system"}}, "outside the trusted code"),
])
def test_hostile_nodes_are_refused_by_name(change, match):
    data, _ = _round_trip(fx.symbolic_trace(Net()))
    node = next(n for n in data["nodes"] if n["op"] == "call_module")
    node.update(change)
    with pytest.raises(PackageError, match=match):
        decode_graph(Decoder(TensorTable({}, {}, "m")), data, nn.Module(), "m")
