"""Compiled models to save: small, with every kernel family a package must carry (fp32 sparse, conv, int8 pair)."""

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.config import CompileConfig
from sparta_explore.kernels.fused_ffn import FusedPair


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 32, 3, padding=1)
        self.bn = nn.BatchNorm2d(32)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.head(y.mean(dim=(2, 3)))


def mask(shape, density, seed):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < density


def quad_mask(shape, density, seed):
    """Runs of 4 kept k: full quads, so int8 ops take the quad kernels, not the permute one (scattered rows)."""
    rows, cols = shape
    return mask((rows, -(-cols // 4)), density, seed).repeat_interleave(4, dim=1)[:, :cols]


def _kernels_win(op, fns, x, runs):  # what the clock says is not under test here: the kernel is chosen
    return {name: 2.0 if name == "dense" else 1.0 for name in fns}


def _config(cache_dir, device):
    return CompileConfig(tune=False, runs=2, device=device, cache_dir=cache_dir, guard=False,
                         kernels={"sparse", "int8"})


@pytest.fixture(scope="session")
def fp32_model(cache_dir, device):
    """(CompiledModel, input): an MLP whose two linears run fp32 sparse kernels (GELU fused in the first) as one
    fused pair (the timing says fused)."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(96, 192), nn.GELU(), nn.Linear(192, 64)).eval()
    table = se.TeSATable({f"{i}.weight": se.TeSA.from_mask(mask(mlp[i].weight.shape, 0.2, i)) for i in (0, 2)})
    x = torch.randn(48, 96)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sparta_explore.compile.choose._timed", _kernels_win)
        patch.setattr(FusedPair, "whole_tiles", 0)  # runs fused at 48 rows (and keeps that when saved)
        cm = se.compile(mlp, table, (x,), config=_config(cache_dir, device))
    assert set(cm.report["choice"]) == {"sparse"}, cm.report
    assert [type(m).__name__ for m in cm.module.modules()].count("FusedFp32Pair") == 1
    return cm, x


@pytest.fixture(scope="session")
def conv_model(cache_dir, device):
    """(CompiledModel, input): a conv (BatchNorm folded into it) run as an implicit-GEMM sparse kernel."""
    torch.manual_seed(0)
    net = ConvNet().eval()
    table = se.TeSATable({"conv.weight": se.TeSA.from_mask(mask((32, 8, 3, 3), 0.15, 3))})
    x = torch.randn(2, 8, 10, 10)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sparta_explore.compile.choose._timed", _kernels_win)
        cm = se.compile(net, table, (x,), config=_config(cache_dir, device))
    assert any(type(m).__name__ == "SparseConv2d" for m in cm.module.modules())
    return cm, x


@pytest.fixture
def int8_pair_model(cache_dir, device, monkeypatch):
    """(CompiledModel, input): an int8 FFN whose two linears run as one fused pair (the timing says fused)."""
    if 8 not in device.bits or not device.blocks:
        pytest.skip("no int8 kernels on this machine (needs AVX2 and a compiler)")
    monkeypatch.setattr("sparta_explore.compile.kernel_pairs.fastest_ms",
                        lambda fns, x, rounds, settle=False: {name: 1.0 if name == "fused" else 2.0 for name in fns})
    monkeypatch.setattr(FusedPair, "whole_tiles", 0)  # runs fused at 100 rows (and keeps that when saved)
    torch.manual_seed(0)
    ffn = nn.Sequential(nn.Linear(64, 192), nn.GELU(), nn.Linear(192, 48)).eval()
    x = torch.randn(100, 64)
    graph = se.capture(ffn, (x,))
    table = se.TeSATable({"0.weight": se.TeSA.from_mask(quad_mask((192, 64), 0.2, 0), bits=8),
                          "2.weight": se.TeSA.from_mask(quad_mask((48, 192), 0.2, 1), bits=8),
                          graph.inputs[0]: se.TeSA.dense((1, 64), bits=8), "_1": se.TeSA.dense((1, 192), bits=8)})
    monkeypatch.setattr("sparta_explore.compile.choose._timed", _kernels_win)
    cm = se.compile(ffn, table, (x,), config=_config(cache_dir, device))
    assert [type(m).__name__ for m in cm.module.modules()].count("FusedInt8Pair") == 1
    return cm, x
