"""Fused pairs: two int8 or two fp32 kernels tile by tile give what the two ops give one after the other."""

import pickle

import pytest
import torch
from torch import nn

from sparta_explore.kernels import Int8SparseLinear, SparseLinear
from sparta_explore.kernels.bsr_codegen import TileConfig
from sparta_explore.kernels.build import cpu_flags
from sparta_explore.kernels.fused_ffn import (
    WHOLE_TILES,
    FusedFp32Pair,
    FusedInt8Pair,
    FusedPair,
    FusedPermutePair,
    fused_pair,
    why_not_fusable,
)
from sparta_explore.kernels.permute_int8 import PermutedInt8Linear, has_permute

from .test_sparse_linear import block_mask, same_after_copies

pytestmark = pytest.mark.skipif("avx2" not in cpu_flags(), reason="int8 kernels need AVX2")


@pytest.fixture(autouse=True)
def fused_at_every_m(monkeypatch):
    """Pairs run their fused driver at any M here (at few tiles they run apart: see the test of that below)."""
    monkeypatch.setattr(FusedPair, "whole_tiles", 0)

VARIANTS = {"auto": {}, "int16": {"dot": None}, "u8": {"dot": None, "weight_bits": 4},
            "vnni-emulated": {"dot": "avx512_vnni", "emulate_dot": True}}


def _pair(tmp_path, k, n, activation, options, density=0.2, block=(1, 1), expected_m=64):
    g = torch.Generator().manual_seed(k + n)
    first = Int8SparseLinear(torch.randn(n, k, generator=g), torch.randn(n, generator=g),
                             block_mask(n, k, block, density), activation=activation, cache_dir=tmp_path,
                             expected_m=expected_m, **options)
    second = Int8SparseLinear(torch.randn(k, n, generator=g), torch.randn(k, generator=g),
                              block_mask(k, n, block, density), cache_dir=tmp_path, expected_m=expected_m, **options)
    return first, second


CASES = ([(variant, "gelu", 64, 256) for variant in VARIANTS]
         + [("auto", act, 30, 50) for act in ("gelu", "relu", "none")])  # 30, 50: k not whole words, ragged


@pytest.mark.parametrize("variant,activation,k,n", CASES)
def test_fused_pair_matches_the_two_ops_in_turn(tmp_path, variant, activation, k, n):
    first, second = _pair(tmp_path, k, n, activation, VARIANTS[variant])
    fused = FusedInt8Pair(first, second, cache_dir=tmp_path)
    for m in (1, 47, 200):  # within one tile, ragged, several tiles
        x = torch.randn(m, k) * 3
        with torch.no_grad():
            want = second(first(x))
            got = fused(x)
        _same_but_ties(got, want)
        torch.testing.assert_close(fused.reference(x), second.reference(first.reference(x)))


def _same_but_ties(got, want):
    # fc1's fp32 outputs may differ in the last bit between the two builds (FMA contraction depends on
    # inlining), and a value exactly halfway between fc2's grid levels then rounds the other way: rare
    # rows move by about one grid step, the rest agree to float rounding
    scale = 1 + float(want.abs().max())
    rows_ok = torch.isclose(got, want, rtol=1e-5, atol=1e-4 * scale).all(dim=-1)
    assert float(rows_ok.float().mean()) >= 0.95
    assert float((got - want).abs().max()) < 2e-2 * scale


@pytest.mark.parametrize("block,density", [((32, 32), 0.3), ((1, 1), 0.0), ((1, 1), 1.0)])
def test_fused_pair_on_blocks_empty_and_full_weights(tmp_path, block, density):
    first, second = _pair(tmp_path, 64, 96, "gelu", {}, density, block)
    fused = FusedInt8Pair(first, second, cache_dir=tmp_path)
    x = torch.randn(3, 5, 64)  # leading dimensions kept
    with torch.no_grad():
        got = fused(x)
        _same_but_ties(got.reshape(15, -1), second(first(x)).reshape(15, -1))
    assert got.shape == (3, 5, 64)


def test_what_cannot_fuse_is_refused_with_the_reason(tmp_path):
    first, second = _pair(tmp_path, 64, 96, "none", {})
    assert why_not_fusable(first, second) is None
    dense = SparseLinear(torch.randn(64, 96), None, torch.ones(64, 96, dtype=torch.bool))
    assert "a Int8SparseLinear feeds a SparseLinear" in why_not_fusable(first, dense)
    assert "feed" in why_not_fusable(first, first)
    wide = Int8SparseLinear(torch.randn(64, 96), None, torch.rand(64, 96) > 0.9, expected_m=4096, cache_dir=tmp_path)
    if wide._tile != first._tile:  # wide one-row VNNI tiles only exist with VNNI
        assert "tiles of" in why_not_fusable(first, wide)
    with pytest.raises(ValueError, match="cannot fuse"):
        FusedInt8Pair(first, nn.Linear(96, 64))


def test_fused_pair_copies_and_pickles(tmp_path):
    fused = FusedInt8Pair(*_pair(tmp_path, 64, 96, "gelu", {}), cache_dir=tmp_path)
    same_after_copies(fused, torch.randn(20, 64))


# fp32: the first op's output tile is the second's packed input tile as it is
FP32_TILES = {"rows": TileConfig(rows=4, vectors=2, single_vectors=2),
              "rows-panel": TileConfig(rows=4, vectors=2, single_vectors=2, panel=True),
              "segments": TileConfig(rows=4, vectors=2, single_vectors=2, layout="segments", panel=True)}


def _fp32_pair(tmp_path, k, n, activation, tile, density=0.2, block=(1, 1)):
    g = torch.Generator().manual_seed(k * n)
    first = SparseLinear(torch.randn(n, k, generator=g), torch.randn(n, generator=g), block_mask(n, k, block, density),
                         block_rows=block[0], activation=activation, cache_dir=tmp_path, tile=tile)
    second = SparseLinear(torch.randn(k, n, generator=g), torch.randn(k, generator=g),
                          block_mask(k, n, block, density, seed=1), block_rows=block[0], cache_dir=tmp_path, tile=tile)
    return first, second


def _close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * (1 + float(want.abs().max())))


FP32_CASES = ([(layout, "gelu", 64, 256, (1, 1), 0.1) for layout in FP32_TILES]
              + [("rows", act, 30, 50, (1, 1), 0.3) for act in ("relu", "none")]  # k, n not whole vectors
              + [(layout, "gelu", 96, 200, (32, 32), 0.4) for layout in FP32_TILES]
              + [("rows", "gelu", 64, 96, (1, 1), 0.0), ("segments", "none", 64, 96, (1, 1), 1.0),
                 ("rows", "gelu", 300, 40, (1, 1), 0.1)])  # empty, full, a narrow middle (n < k)


@pytest.mark.parametrize("layout,activation,k,n,block,density", FP32_CASES)
def test_fp32_pair_matches_the_two_ops_in_turn(tmp_path, monkeypatch, layout, activation, k, n, block, density):
    monkeypatch.setattr(FusedPair, "whole_tiles", WHOLE_TILES)  # few tiles: the chunks of a tile split over threads
    first, second = _fp32_pair(tmp_path, k, n, activation, FP32_TILES[layout], density, block)
    fused = fused_pair(first, second, cache_dir=tmp_path)
    assert type(fused) is FusedFp32Pair
    whole = [fused.whole_tiles_at(m) for m in (1, 31, 200, 64 * 32 + 5)]
    assert whole[0] is False and whole[-1] is True  # both drivers: chunks split over threads, and whole tiles
    for m in (1, 31, 200, 64 * 32 + 5):  # within one tile, ragged, several tiles, many (ragged) tiles
        x = torch.randn(m, k) * 3
        with torch.no_grad():
            got, want = fused(x), second(first(x))
        _close(got, want)
        _close(got, second.reference(first.reference(x)))
    x = torch.randn(2, 7, k)  # leading dimensions kept
    with torch.no_grad():
        assert fused(x).shape == (2, 7, k)


def test_fp32_pair_gradients_are_the_references(tmp_path):
    first, second = _fp32_pair(tmp_path, 64, 96, "gelu", FP32_TILES["rows"])
    fused = fused_pair(first, second, cache_dir=tmp_path)
    x = torch.randn(5, 64, requires_grad=True)
    fused(x).sum().backward()
    want = x.detach().clone().requires_grad_()
    second.reference(first.reference(want)).sum().backward()
    _close(x.grad, want.grad)


def test_fp32_pairs_refuse_mixed_kinds_and_tiles(tmp_path):
    first, second = _fp32_pair(tmp_path, 64, 96, "none", FP32_TILES["rows"])
    other = SparseLinear(torch.randn(64, 96), None, torch.rand(64, 96) > 0.8, cache_dir=tmp_path,
                         tile=TileConfig(rows=4, vectors=3, single_vectors=3))
    assert "tiles of" in why_not_fusable(first, other)
    with pytest.raises(ValueError, match="FusedInt8Pair chains Int8SparseLinears, not SparseLinears"):
        FusedInt8Pair(first, second)
    same_after_copies(FusedFp32Pair(first, second, cache_dir=tmp_path), torch.randn(20, 64))


def test_few_tiles_split_a_tiles_chunks_over_threads_and_many_run_whole_tiles(tmp_path, monkeypatch):
    # below whole_tiles tiles of M per thread each op's driver splits a tile's chunks over threads: the fp32 pair's
    # split driver does the same with both ops, and its whole-tile driver runs only above
    monkeypatch.setattr(FusedPair, "whole_tiles", 4)
    first, second = _fp32_pair(tmp_path, 64, 96, "gelu", FP32_TILES["rows"])
    fused = fused_pair(first, second, cache_dir=tmp_path)
    assert fused.whole_tiles == 4
    calls = []
    driver = fused._fn
    fused._fn = lambda *args: (calls.append(args[2]), driver(*args))
    many = first._tile * 4 * torch.get_num_threads()
    few = many - first._tile  # one tile fewer
    assert not fused.whole_tiles_at(few) and fused.whole_tiles_at(many)
    assert fused.runs_fused(few)  # fused at any M (compile fuses it at M = 128 too)
    for m in (few, many):
        x = torch.randn(m, 64)
        with torch.no_grad():
            _close(fused(x), second(first(x)))
    assert calls == [many]
    saved = pickle.loads(pickle.dumps(fused))
    assert saved.whole_tiles == 4 and saved.whole_tiles_at(many) and not saved.whole_tiles_at(few)


def test_an_int8_pair_at_few_tiles_runs_its_two_ops_in_turn(tmp_path, monkeypatch):
    monkeypatch.setattr(FusedPair, "whole_tiles", 4)
    first, second = _pair(tmp_path, 64, 96, "gelu", {})
    fused = fused_pair(first, second, cache_dir=tmp_path)
    calls = []
    driver = fused._fn
    fused._fn = lambda *args: (calls.append(args[2]), driver(*args))
    few = first._tile * (4 * torch.get_num_threads() - 1)  # one tile fewer than whole tiles need
    assert not fused.runs_fused(few)
    x = torch.randn(few, 64)
    with torch.no_grad():
        assert torch.equal(fused(x), second(first(x))) and not calls


# the permute int8 pair: a tile's rows of the first op stay in L2 and are quantized there for the second
PERMUTE_MODES = [pytest.param(True, id="emulated"),
                 pytest.param(False, id="native", marks=pytest.mark.skipif(
                     not has_permute(), reason="the permute kernel needs AVX-512 VBMI and VNNI"))]


@pytest.mark.parametrize("emulate", PERMUTE_MODES)
@pytest.mark.parametrize("k,n,density", [(64, 256, 0.1), (70, 45, 0.3), (100, 130, 0.0), (48, 40, 1.0)])
def test_permute_pair_matches_the_two_ops_in_turn(tmp_path, emulate, k, n, density):
    g = torch.Generator().manual_seed(k + n)
    first = PermutedInt8Linear(torch.randn(n, k, generator=g), torch.randn(n, generator=g),
                               block_mask(n, k, (1, 1), density), activation="gelu", emulate_dot=emulate,
                               cache_dir=tmp_path)
    second = PermutedInt8Linear(torch.randn(k, n, generator=g), torch.randn(k, generator=g),
                                block_mask(k, n, (1, 1), density, seed=1), emulate_dot=emulate, cache_dir=tmp_path)
    fused = fused_pair(first, second, cache_dir=tmp_path)
    assert type(fused) is FusedPermutePair and fused.less_work
    for m in (1, 17, 100):  # within a tile of 16, ragged, several tiles
        x = torch.randn(m, k) * 3
        with torch.no_grad():
            torch.testing.assert_close(fused(x), second(first(x)), rtol=0, atol=0)  # the same arithmetic
        ref = second.reference(first.reference(x))
        _same_but_ties(fused(x), ref)
    same_after_copies(fused, x)


@pytest.mark.parametrize("emulate", PERMUTE_MODES)
@pytest.mark.parametrize("bits_first,bits_second", [(8, 6), (5, 8)])
def test_permute_pair_quantizes_each_input_at_its_own_bits(tmp_path, emulate, bits_first, bits_second):
    # the second op's input is quantized by the second op's library: its levels, not the first's
    g = torch.Generator().manual_seed(bits_first * 10 + bits_second)
    first = PermutedInt8Linear(torch.randn(96, 64, generator=g), None, block_mask(96, 64, (1, 1), 0.2),
                               activation="gelu", act_bits=bits_first, emulate_dot=emulate, cache_dir=tmp_path)
    second = PermutedInt8Linear(torch.randn(64, 96, generator=g), torch.randn(64, generator=g),
                                block_mask(64, 96, (1, 1), 0.2, seed=1), act_bits=bits_second, emulate_dot=emulate,
                                cache_dir=tmp_path)
    fused = fused_pair(first, second, cache_dir=tmp_path)
    x = torch.randn(40, 64, generator=g) * 3
    with torch.no_grad():
        torch.testing.assert_close(fused(x), second(first(x)), rtol=0, atol=0)
