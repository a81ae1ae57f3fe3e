"""Scattered one-row entries walked from header words (kernels/entry_stream.py): the array holds what the tables
said, and the kernels compute what the table-driven kernels computed, bit for bit."""

from dataclasses import replace

import numpy as np
import pytest
import torch

import sparta_explore.kernels.bsr_codegen as bsr_codegen
from sparta_explore.kernels import SparseLinear
from sparta_explore.kernels.bsr_codegen import TileConfig, _chunks
from sparta_explore.kernels.entry_stream import FIRST, LAST, Headed, headed
from sparta_explore.kernels.groups import pack_weights
from sparta_explore.kernels.scattered import scattered_groups, scattered_panels
from sparta_explore.kernels.word_pairs import Interleaved, pair_offsets

TILE = 48


def unstructured(seed: int, n: int, k: int, density: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    kept = rng.random((n, k)) < density
    kept[rng.integers(0, n)] = False  # a row no weight reaches
    return kept


def stream_layout(kept: np.ndarray, rows: int):
    """The scattered path's panels and words as `generate_source` makes them, before and after `headed`."""
    groups = scattered_groups(kept, 8.0)
    chunk_g0 = _chunks(groups, kept.shape[0], np.flatnonzero(~kept.any(axis=1)))[0]
    panels, order = scattered_panels(groups, kept.shape[1], rows, chunk_g0)
    p_x = (panels.p_k0 * TILE).astype(np.int32)
    paired, _, words = pair_offsets(panels, groups.rows, p_x, order)
    return groups, paired, words, headed(paired, groups.row0, words)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rows", [7, 64, 10_000])
def test_headers_say_what_the_tables_said(seed, rows):
    # walking the array from each (panel, chunk)'s first header reaches every entry in order, and each header
    # gives the entry's row, piece count and flags; the words after it are the entry's words
    rng = np.random.default_rng(seed)
    kept = unstructured(seed, int(rng.integers(1, 80)), int(rng.integers(1, 400)), rng.choice([0.01, 0.1, 0.3]))
    if not kept.any():
        kept[0, 0] = True
    groups, paired, words, stream = stream_layout(kept, rows)
    assert stream is not None
    new, heads = stream
    weight = np.random.default_rng(seed + 1).standard_normal(kept.shape).astype(np.float32)
    packed = pack_weights(weight, kept, groups)
    plain, w = words.apply(packed), heads.apply(packed)
    assert w.size == plain.size + 2 * len(new.e_group)
    bits = w.view(np.int32)
    at = int(new.e_woff[0]) - 2
    for e in range(len(new.e_group)):
        assert at == int(new.e_woff[e]) - 2  # entries follow each other: one walk covers a range of E_PTR
        row, high = int(bits[at]), int(bits[at + 1].view(np.uint32))
        count = int(new.e_piece1[e] - new.e_piece0[e])
        assert row == int(groups.row0[new.e_group[e]])
        assert high & (FIRST - 1) == count
        assert bool(high & FIRST) == bool(new.e_flags[e] & 1) and bool(high & LAST) == bool(new.e_flags[e] & 2)
        start = int(paired.e_woff[e])
        got, want = w[at + 2:at + 2 + 2 * count], plain[start:start + 2 * count]
        assert np.array_equal(got.view(np.int32), want.view(np.int32))
        at += 2 + 2 * count
    assert at == w.size


def test_only_interleaved_words_in_entry_order_get_headers():
    kept = unstructured(3, 40, 120, 0.1)
    groups, paired, words, stream = stream_layout(kept, 32)
    assert isinstance(words, Interleaved) and stream is not None
    assert headed(paired, groups.row0, None) is None  # no pairs: the table kernel
    shuffled = replace(paired, e_woff=paired.e_woff[::-1].copy())
    assert headed(shuffled, groups.row0, words) is None  # entries out of their words' order
    empty = replace(paired, e_group=paired.e_group[:0])
    assert headed(empty, groups.row0, words) is None


def test_headed_map_of_no_pieces_and_flags():
    heads = Headed(Interleaved(np.zeros(0, np.int32)), np.array([4]), np.array([0]), np.array([3]))
    bits = heads.apply(np.zeros(0, np.float32)).view(np.int32)
    assert bits[0] == 4 and int(bits[1].view(np.uint32)) == FIRST | LAST


def table_twin(monkeypatch, tmp_path, *args, **kwargs) -> SparseLinear:
    """The same op built with its entries' tables (no headers), as before entry streams."""
    with monkeypatch.context() as m:
        m.setattr(bsr_codegen, "headed", lambda *a: None)
        return SparseLinear(*args, **kwargs, cache_dir=tmp_path / "tables")


@pytest.mark.parametrize("tile", [TileConfig(rows=4, vectors=3, single_vectors=3, panel=True),
                                  TileConfig(rows=4, vectors=2, single_vectors=3, panel=True),  # two walks a tile
                                  TileConfig(rows=2, vectors=2, single_vectors=4, panel=True),
                                  TileConfig(rows=4, vectors=1, single_vectors=1)])
@pytest.mark.parametrize("activation", ["none", "gelu", "relu"])
def test_stream_kernels_match_reference_and_the_table_kernels(monkeypatch, tmp_path, tile, activation):
    # unstructured rows with an empty row, kept zero weights and a row of every kept k; M ragged against the tile
    g = torch.Generator().manual_seed(17)
    n, k = 77, 300
    kept = torch.rand(n, k, generator=g) < 0.1
    kept[5] = False
    kept[9, 100:110] = False
    w = torch.randn(n, k, generator=g)
    w[kept & (torch.rand(n, k, generator=g) < 0.2)] = 0.0
    bias = torch.randn(n, generator=g)
    lin = SparseLinear(w, bias, kept, tile=tile, activation=activation, cache_dir=tmp_path)
    assert lin.fallback_reason is None
    src = lin.built.source_path.read_text()
    assert "stream1(" in src and "E_FLAGS" not in src and "G_ROW0" not in src  # the headers say it, not tables
    twin = table_twin(monkeypatch, tmp_path, w, bias, kept, tile=tile, activation=activation)
    assert "stream1(" not in twin.built.source_path.read_text()
    for m in (1, 17, 48, 130):
        x = torch.randn(m, k, generator=g)
        got, want = lin(x), lin.reference(x)
        assert torch.allclose(got, want, atol=1e-4 * (1 + float(want.abs().max())), rtol=1e-5)
        assert torch.equal(got, twin(x))  # the same sums in the same order


def test_stream_kernel_with_all_zero_weights_and_one_kept_weight(tmp_path):
    kept = torch.zeros(33, 70, dtype=torch.bool)
    kept[7, 3] = True
    for w in (torch.zeros(33, 70), torch.randn(33, 70)):
        lin = SparseLinear(w, torch.randn(33), kept, tile=TileConfig(panel=True), cache_dir=tmp_path)
        assert "stream1(" in lin.built.source_path.read_text()
        x = torch.randn(19, 70)
        assert torch.allclose(lin(x), lin.reference(x), atol=1e-5)


def test_block_patterns_keep_their_tables(tmp_path):
    kept = torch.zeros(64, 64, dtype=torch.bool)
    kept[:32, :32] = True
    lin = SparseLinear(torch.randn(64, 64), None, kept, block_rows=32, tile=TileConfig(panel=True), cache_dir=tmp_path)
    assert "stream1(" not in lin.built.source_path.read_text()
    x = torch.randn(10, 64)
    assert torch.allclose(lin(x), lin.reference(x), atol=1e-4)



def test_an_implicit_gemm_convolution_streams_its_entries_too(tmp_path):
    # the im2col tile's k rows sit at other offsets (the I/O's), read from the same (offset, weight) words
    from torch import nn
    from torch.nn import functional as F

    from sparta_explore.kernels.conv_geometry import ConvGeometry
    from sparta_explore.kernels.sparse_conv import ImplicitConvLinear, SparseConv2d

    torch.manual_seed(3)
    conv = nn.Conv2d(16, 40, 3, padding=1)
    w2d = conv.weight.detach().reshape(40, -1)
    kept = torch.rand(w2d.shape) < 0.1
    linear = ImplicitConvLinear(w2d * kept, conv.bias.detach(), kept, ConvGeometry.of(conv, (7, 9)),
                                cache_dir=tmp_path, tile=TileConfig(4, 3, 6, panel=True))
    assert linear.fallback_reason is None and "stream1(" in linear.built.source_path.read_text()
    x = torch.randn(2, 16, 7, 9)
    with torch.no_grad():
        got = SparseConv2d(conv, linear)(x)
    want = F.conv2d(x, conv.weight.detach() * kept.reshape(conv.weight.shape), conv.bias, padding=1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
