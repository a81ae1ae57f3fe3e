"""SparseLinear matches the masked dense op on every pattern, shape and activation, or falls back."""

import copy
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

from sparta_explore.kernels import KernelFallbackWarning, SparseLinear, bsr_codegen, fp32_layouts
from sparta_explore.kernels import sparse_linear as sparse_linear_module
from sparta_explore.kernels.bsr_codegen import TileConfig
from sparta_explore.kernels.build import KernelBuildError

from .grids import pairwise


def block_mask(n, k, block, density, seed=0):
    g = torch.Generator().manual_seed(seed)
    br, bk = block
    grid = torch.rand(-(-n // br), -(-k // bk), generator=g) < density
    return grid.repeat_interleave(br, 0).repeat_interleave(bk, 1)[:n, :k]


def same_after_copies(module, x):
    """A deep copy and a pickled copy of a kernel module are bound again and compute what it computes."""
    with torch.no_grad():
        want = module(x)
        for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
            assert getattr(other, "_fn", None) is not None
            torch.testing.assert_close(other(x), want)


def check(layer, m, k, seed=1):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    got, want = layer(x), layer.reference(x)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4 * (1 + float(want.abs().max())), rtol=1e-5)


@pytest.mark.parametrize("block, shape, density", pairwise(
    [(32, 32), (1, 32), (16, 16), (32, 64), (64, 32), (1, 1)],
    [(96, 128), (70, 45)],  # the second leaves ragged edge blocks
    [0.0, 0.1, 0.5, 1.0]))  # all-zero weights ... fully dense
def test_block_patterns_match_reference(tmp_path, block, shape, density):
    n, k = shape
    w, b = torch.randn(n, k), torch.randn(n)
    layer = SparseLinear(w, b, block_mask(n, k, block, density), block_rows=block[0], cache_dir=tmp_path)
    assert layer.fallback_reason is None
    for m in (1, 5, 49, 130):  # batch 1, below one tile, ragged tiles, several tiles
        check(layer, m, k)


def test_empty_block_rows_and_no_bias(tmp_path):
    kept = block_mask(64, 64, (16, 16), 0.5)
    kept[16:48] = False  # two empty block rows: those outputs are exactly zero
    layer = SparseLinear(torch.randn(64, 64), None, kept, block_rows=16, cache_dir=tmp_path)
    y = layer(torch.randn(7, 64))
    assert torch.equal(y[:, 16:48], torch.zeros(7, 32))
    check(layer, 7, 64)


@pytest.mark.parametrize("activation", ["relu", "gelu", "relu6", "silu"])
def test_fused_activations(tmp_path, activation):
    layer = SparseLinear(torch.randn(40, 24), torch.randn(40), block_mask(40, 24, (4, 4), 0.4), block_rows=4,
                         activation=activation, cache_dir=tmp_path)
    check(layer, 33, 24)
    # pruned rows still see act(bias): gelu(b) or relu(b), not 0
    kept = torch.zeros(40, 24, dtype=torch.bool)
    empty = SparseLinear(torch.randn(40, 24), torch.randn(40), kept, activation=activation, cache_dir=tmp_path)
    check(empty, 3, 24)


def test_leading_dims_are_kept(tmp_path):
    layer = SparseLinear(torch.randn(8, 6), torch.randn(8), torch.rand(8, 6) > 0.5, cache_dir=tmp_path)
    x = torch.randn(2, 3, 6)
    assert layer(x).shape == (2, 3, 8)
    assert torch.allclose(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5)


def test_cached_build_is_reused(tmp_path):
    kept = block_mask(32, 32, (8, 8), 0.5)
    first = SparseLinear(torch.randn(32, 32), None, kept, block_rows=8, cache_dir=tmp_path)
    second = SparseLinear(torch.randn(32, 32), None, kept, block_rows=8, cache_dir=tmp_path)
    assert not first.built.cached and second.built.cached  # same pattern: same code, values are data
    assert first.built.key == second.built.key


def test_build_failure_falls_back_with_warning(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise KernelBuildError("gcc failed building sparse_linear: simulated")

    monkeypatch.setattr(sparse_linear_module, "build", broken)
    with pytest.warns(KernelFallbackWarning, match="simulated"):
        layer = SparseLinear(torch.randn(8, 6), torch.randn(8), torch.rand(8, 6) > 0.5, cache_dir=tmp_path)
    assert layer.fallback_reason and "simulated" in layer.fallback_reason
    x = torch.randn(3, 6)
    assert torch.equal(layer(x), layer.reference(x))


def test_wrong_numerics_fall_back(tmp_path, monkeypatch):
    original = fp32_layouts.pack_weights

    def corrupt(*args, **kwargs):
        return original(*args, **kwargs) * 2  # a kernel that computes the wrong thing

    monkeypatch.setattr(fp32_layouts, "pack_weights", corrupt)
    with pytest.warns(KernelFallbackWarning, match="max error"):
        layer = SparseLinear(torch.randn(16, 16), None, torch.rand(16, 16) > 0.3, cache_dir=tmp_path)
    x = torch.randn(4, 16)
    assert torch.equal(layer(x), layer.reference(x))


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="activation"):
        SparseLinear(torch.randn(4, 4), None, torch.ones(4, 4, dtype=torch.bool), activation="swish")
    with pytest.raises(ValueError, match="kept mask"):
        SparseLinear(torch.randn(4, 4), None, torch.ones(4, 5, dtype=torch.bool))


@pytest.mark.slow
def test_bert_shapes_large_m(tmp_path):
    for k, n in ((768, 3072), (3072, 768)):
        layer = SparseLinear(torch.randn(n, k), torch.randn(n), block_mask(n, k, (32, 32), 0.1), block_rows=32,
                             activation="gelu", cache_dir=tmp_path)
        check(layer, 4096, k)


def test_no_warning_on_the_happy_path(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SparseLinear(torch.randn(8, 8), None, torch.rand(8, 8) > 0.5, cache_dir=tmp_path)


def test_kernels_survive_deepcopy_and_torch_save(tmp_path):
    import io

    from sparta_explore.kernels import Int8SparseLinear

    w, b = torch.randn(24, 40), torch.randn(24)
    kept = torch.rand(24, 40) > 0.7
    x = torch.randn(9, 40)
    for layer in (SparseLinear(w, b, kept, cache_dir=tmp_path), Int8SparseLinear(w, b, kept, cache_dir=tmp_path)):
        twin = copy.deepcopy(layer)
        assert twin._fn is not None and torch.equal(twin(x), layer(x))
        buf = io.BytesIO()
        torch.save(layer, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        assert loaded._fn is not None and torch.equal(loaded(x), layer(x))


@pytest.mark.parametrize("activation", ["silu", "gelu", "relu6"])
def test_fused_activations_hold_at_large_magnitudes(tmp_path, activation):
    # the exp-based activations clamp exp's argument at -80: no overflow, no denormal, no NaN at the tails
    layer = SparseLinear(torch.eye(16), None, torch.eye(16, dtype=torch.bool), block_rows=1, activation=activation,
                         cache_dir=tmp_path)
    x = torch.linspace(-200, 200, 16 * 9).reshape(9, 16)
    want = {"silu": F.silu, "gelu": F.gelu, "relu6": F.relu6}[activation](x)
    got = layer(x)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tile", [TileConfig(rows=1, vectors=1, single_vectors=1),
                                  TileConfig(rows=2, vectors=3, single_vectors=3),
                                  TileConfig(rows=4, vectors=2, single_vectors=2, panel=True)])
def test_scattered_rows_with_split_accumulators_match_reference(tmp_path, tile):
    # one-k pieces run `ways` at a time into separate accumulators (bsr_codegen._flat_loop); rows keep
    # 0..11 scattered k's, so every remainder of every split is run, and some rows keep nothing
    g = torch.Generator().manual_seed(7)
    n, k = 48, 200
    kept = torch.zeros(n, k, dtype=torch.bool)
    for row in range(n):
        kept[row, torch.randperm(k, generator=g)[:row % 12]] = True
    assert "i += 4" in bsr_codegen._flat_loop(1, 1) and "i += 3" in bsr_codegen._flat_loop(1, 3)
    assert "p += 2" in bsr_codegen._flat_loop(2, 2) and "high_float" not in bsr_codegen._flat_loop(2, 2)
    assert "s1_" not in bsr_codegen._flat_loop(4, 2)  # eight chains already
    lin = SparseLinear(torch.randn(n, k, generator=g), torch.randn(n, generator=g), kept, cache_dir=tmp_path,
                       tile=tile)
    assert lin.fallback_reason is None
    for m in (1, 37, 130):
        check(lin, m, k, seed=m)


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_fused_activation_is_exact_to_float_rounding_over_its_range(tmp_path, activation):
    # identity weights expose the activation itself: GELU's 32 fitted pieces (AVX-512) and every piece edge,
    # the 5.5 cut, and the reciprocal estimates; against float64
    n = 64
    lin = SparseLinear(torch.eye(n), torch.zeros(n), torch.ones(n, n, dtype=torch.bool), activation=activation,
                       cache_dir=tmp_path)
    edges = torch.arange(33) * (5.5 / 32)
    x = torch.cat([torch.linspace(-12, 12, 48000), edges, -edges, edges + 1e-6, torch.randn(16000 - 99) * 3])
    x = x.reshape(-1, n)
    with torch.no_grad():
        got = lin(x)
    want = getattr(F, activation)(x.double()).float()
    assert float(((got - want).abs() / (1 + x.abs())).max()) < 5e-7  # a few float steps


def test_a_weight_zeroed_already_is_held_as_it_is_and_computes_the_same(cache_dir):
    g = torch.Generator().manual_seed(11)
    kept = torch.rand(37, 70, generator=g) > 0.8
    masked = torch.randn(37, 70, generator=g) * kept
    held = SparseLinear(masked, None, kept, cache_dir=cache_dir, zeroed=True)
    copied = SparseLinear(masked, None, kept, cache_dir=cache_dir)
    assert held.weight.data_ptr() == masked.data_ptr() and copied.weight.data_ptr() != masked.data_ptr()
    x = torch.randn(21, 70, generator=g)
    assert torch.equal(held(x), copied(x)) and held.rebuilt(cache_dir).weight.data_ptr() == masked.data_ptr()
