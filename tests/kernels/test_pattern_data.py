"""Kernels that read their pattern as data compute what the pattern-baked ones do, and share one library.

Every kernel family (fp32 rows and segments layouts, int8 pairs / u8 / VNNI, the sparse conv's
im2col linear) is built both ways on ragged shapes, empty blocks, empty rows and all-zero
weights; the outputs must agree to float rounding (the same sums; gcc may contract a multiply
and an add differently around constant tables) and match the reference. In data mode, masks
of one shape class load one library.
"""

import copy
import pickle

import numpy as np
import pytest
import torch

from sparta_explore.kernels import Int8SparseLinear, SparseLinear, cpu_flags
from sparta_explore.kernels import sparse_linear as sparse_linear_module
from sparta_explore.kernels.bsr_codegen import TileConfig
from sparta_explore.kernels.pattern_data import PatternTables, pattern_struct

from .grids import pairwise
from .test_sparse_linear import block_mask, check

needs_avx2 = pytest.mark.skipif("avx2" not in cpu_flags(), reason="int8 kernels need AVX2")
PATTERNS = [((1, 1), 0.1), ((32, 32), 0.3), ((1, 32), 0.3), ((4, 4), 0.0)]  # the last: all-zero weights
SHAPES = [(70, 45), (96, 128)]  # ragged edges, whole blocks
TILES = [TileConfig(), TileConfig(6, 2, 6, layout="segments"), TileConfig(4, 3, 6, panel=True)]


def _tile_id(value) -> str:
    return f"{value.layout}{'-panel' if value.panel else ''}" if isinstance(value, TileConfig) else str(value)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=0, atol=1e-5 * (1 + float(b.abs().max())))


def _both(monkeypatch, make):
    out = {}
    for as_data in (False, True):
        monkeypatch.setattr(sparse_linear_module, "PATTERN_AS_DATA", as_data)
        out[as_data] = make()
        assert out[as_data].fallback_reason is None, out[as_data].fallback_reason
        assert (out[as_data].pattern_address is not None) == as_data
    return out[False], out[True]


def _weights(shape, pattern, density):
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(*shape, generator=g), torch.randn(shape[0], generator=g)
    kept = block_mask(*shape, pattern, density)
    if shape[0] > 4:
        kept[3] = False  # a row no kept weight reaches: bias (and activation) only
    return w, b, kept


@pytest.mark.parametrize("pattern, density, shape, tile", pairwise(PATTERNS, SHAPES, TILES, spread=(0,), ids=_tile_id))
def test_fp32_data_kernels_equal_baked_ones(monkeypatch, tmp_path, pattern, density, shape, tile):
    w, b, kept = _weights(shape, pattern, density)
    baked, data = _both(monkeypatch, lambda: SparseLinear(w, b, kept, block_rows=pattern[0], activation="gelu",
                                                          tile=tile, cache_dir=tmp_path))
    for m in (1, 37, 300):  # small M splits chunks over threads, large M packs per tile
        x = torch.randn(m, shape[1], generator=torch.Generator().manual_seed(m))
        assert _same(baked(x), data(x))
    check(data, 133, shape[1])


@needs_avx2
@pytest.mark.parametrize("pattern, density, shape, dot, weight_bits",
                         pairwise(PATTERNS, SHAPES, [(None, 8), (None, 4), ("auto", 8)], spread=(0, 2)))
def test_int8_data_kernels_equal_baked_ones(monkeypatch, tmp_path, pattern, density, shape, dot, weight_bits):
    w, b, kept = _weights(shape, pattern, density)
    baked, data = _both(monkeypatch, lambda: Int8SparseLinear(w, b, kept, block_rows=pattern[0], activation="relu",
                                                              weight_bits=weight_bits, dot=dot, cache_dir=tmp_path))
    assert baked.variant == data.variant
    for m in (1, 37, 300):
        x = torch.randn(m, shape[1], generator=torch.Generator().manual_seed(m))
        assert _same(baked(x), data(x))
        ref = data.reference(x)
        assert torch.allclose(data(x), ref, atol=1e-4 * (1 + float(ref.abs().max())))


def test_masks_of_one_shape_class_share_a_library_and_copies_repoint_their_tables(tmp_path):
    w = torch.randn(64, 96)
    layers = [SparseLinear(w, None, torch.rand(64, 96, generator=torch.Generator().manual_seed(s)) < 0.2,
                           cache_dir=tmp_path) for s in (1, 2)]
    assert layers[0].built.key == layers[1].built.key and layers[1].built.cached  # no second build
    x = torch.randn(9, 96)
    for layer in layers:
        for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
            assert other.pattern_address != layer.pattern_address  # its own tables, pointed at anew
            assert torch.equal(other(x), layer(x))
        check(layer, 9, 96)


@pytest.mark.parametrize("tile", TILES, ids=lambda t: f"{t.layout}{'-panel' if t.panel else ''}")
def test_linears_of_every_shape_share_one_library_per_tiling(tmp_path, tile):
    """K_IN and N_OUT are pattern fields and panel loops run a bucket of panels (empty ones padded): a shrunk layer
    (3072 -> 2749 rows or columns) builds nothing new."""
    layers = []
    # ragged; all K > N (the segment layout has a loop order per side of K = N); 2 to 10 panels of K
    for seed, (n, k) in enumerate([(64, 96), (61, 150), (64, 77), (40, 300)]):
        g = torch.Generator().manual_seed(seed)
        w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        layers.append(SparseLinear(w, b, torch.rand(n, k, generator=g) < 0.3, tile=tile, cache_dir=tmp_path))
    assert len({layer.built.key for layer in layers}) == 1 and all(layer.built.cached for layer in layers[1:])
    for layer in layers:
        check(layer, 37, layer.in_features)


def test_pattern_tables_layout_and_limits():
    tables = PatternTables().scalar("N", 5).array("A", np.arange(3)).array("B", np.array([], dtype=np.int64)) \
        .array("C", np.array([7, 8]), "int32_t")
    t64, t32, layout = tables.blobs()
    struct = pattern_struct(t64, t32, layout)
    assert int(struct[0]) == 5 and int(struct[1]) == t64.data_ptr() and int(struct[3]) == t32.data_ptr()
    assert t32.tolist() == [7, 8] and "const int32_t *C;" in tables.c(as_data=True)
    with pytest.raises(ValueError, match="beyond 32 bits"):
        PatternTables().array("P", np.array([2 ** 40]), "int32_t").blobs()
    with pytest.raises(ValueError, match="C type"):
        PatternTables().array("P", np.arange(2), "short")
