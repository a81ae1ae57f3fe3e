"""Values and tensors as data: everything a module or graph holds comes back equal (tensors bit for bit)."""

import json
from pathlib import Path

import pytest
import torch

from sparta_explore.compile.epilogue import RELU, act_named
from sparta_explore.compile.package import codecs  # noqa: F401  (the codec of epilogue activations)
from sparta_explore.compile.package.tensors import TensorStore, TensorTable
from sparta_explore.compile.package.values import Decoder, Encoder
from sparta_explore.errors import PackageError
from sparta_explore.kernels.bsr_codegen import TileConfig


def _round_trip(value):
    store = TensorStore()
    data = json.loads(json.dumps(Encoder(store).encode(value, "v"), allow_nan=False))
    arrays, meta = store.arrays()
    return Decoder(TensorTable(arrays, meta, "m.sparta")).decode(data, "v")


def test_plain_values_come_back_equal_and_of_their_type():
    value = {"t": (1, 2.5, float("inf"), float("-inf"), None, True, "s"), 3: [slice(1, None, 2), Ellipsis],
             (1, 2): frozenset({1, 2}), "dt": torch.float16, "dev": torch.device("cpu"),
             "fmt": torch.channels_last, "size": torch.Size([2, 3]), "path": Path("/x/y"),
             "tile": TileConfig(4, 2, 4, panel=True), "act": act_named("hardtanh(0.0,6.0)")}
    back = _round_trip(value)
    assert back["t"] == value["t"] and back[3] == value[3] and back[(1, 2)] == frozenset({1, 2})
    assert back["dt"] is torch.float16 and back["fmt"] is torch.channels_last and back["size"] == torch.Size([2, 3])
    assert back["path"] == Path("/x/y") and back["tile"] == TileConfig(4, 2, 4, panel=True)
    assert back["act"].name == "hardtanh(0.0,6.0)" and _round_trip(RELU) is RELU
    assert str(_round_trip(float("nan"))) == "nan"


def test_tensors_come_back_bit_for_bit_sparse_or_not_shared_or_not():
    weight = torch.zeros(64, 128)
    weight[::7, ::3] = torch.randn(10, 43)
    weight[0, 0], weight[1, 1], weight[2, 2] = -0.0, float("nan"), float("-inf")  # patterns a mask must keep
    nhwc = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last)
    value = {"w": weight, "again": weight, "nhwc": nhwc, "empty": torch.zeros(0, 3), "bools": torch.rand(9) > 0.5,
             "int8": torch.randint(-128, 127, (5,), dtype=torch.int8), "view": weight[:, :4],
             "param": torch.nn.Parameter(torch.ones(2))}
    back = _round_trip(value)
    assert torch.equal(back["w"].view(torch.int32), weight.view(torch.int32))  # -0.0 and the NaN's bits included
    assert back["again"] is back["w"]
    assert back["nhwc"].is_contiguous(memory_format=torch.channels_last) and torch.equal(back["nhwc"], nhwc)
    assert back["empty"].shape == (0, 3) and torch.equal(back["bools"], value["bools"])
    assert torch.equal(back["int8"], value["int8"])
    assert torch.equal(back["view"].view(torch.int32), weight[:, :4].contiguous().view(torch.int32))
    assert isinstance(back["param"], torch.nn.Parameter) and back["param"].requires_grad


def test_a_mostly_zero_tensor_is_stored_as_its_values():
    weight = torch.zeros(256, 256)
    weight[::10] = 1.0
    arrays, meta = (store := TensorStore()).add(weight) and store.arrays()
    assert meta["t0"]["sparse"] and sum(a.numel() * a.element_size() for a in arrays.values()) < weight.numel()


def test_what_has_no_name_cannot_be_saved():
    with pytest.raises(PackageError, match="lambda"):
        Encoder(TensorStore()).encode(lambda x: x, "hook")
    with pytest.raises(PackageError, match="cannot be saved"):
        Encoder(TensorStore()).encode(object(), "attribute 'x'")


def test_a_reference_to_a_tensor_the_package_lacks_is_named():
    with pytest.raises(PackageError, match="tensor 't9' is referenced but not stored"):
        Decoder(TensorTable({}, {}, "m.sparta")).decode({"$tensor": "t9"}, "v")
