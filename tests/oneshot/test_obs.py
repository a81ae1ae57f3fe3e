"""The OBS sweep: exact sparsity per column block, N:M per row, fixed masks kept, weights exactly on their grids."""

import pytest
import torch

from sparta_explore.errors import ConfigError
from sparta_explore.oneshot import GroupGrid, QuantSpec, fit_grid, obs_compress, quantize_to_grid


def _hessian(cols: int, seed: int = 0) -> torch.Tensor:
    # correlated inputs (a low-rank part plus noise) with a few outlier channels, as in LLM activations
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 8, generator=g, dtype=torch.float64) @ torch.randn(8, cols, generator=g, dtype=torch.float64)
    x = x + 0.3 * torch.randn(512, cols, generator=g, dtype=torch.float64)
    x[:, :3] *= 10
    return 2 * x.t() @ x / 512


def _weight(rows: int = 16, cols: int = 64) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(1))


def test_unstructured_prunes_the_share_of_each_column_block_and_zeroes_it():
    w = _weight(16, 96)
    r = obs_compress(w, _hessian(96), sparsity=0.5, blocksize=32)
    for start in range(0, 96, 32):
        assert int((~r.keep[:, start:start + 32]).sum()) == 16 * 32 // 2
    assert bool((r.weight[~r.keep] == 0).all()) and bool((r.weight[r.keep] != 0).all())


def test_nm_keeps_n_of_every_m_per_row():
    r = obs_compress(_weight(), _hessian(64), nm=(2, 4), blocksize=30)  # blocksize rounds to a multiple of m
    assert bool((r.keep.reshape(16, 16, 4).sum(-1) == 2).all())


def test_the_update_beats_plain_masking_on_the_layer_output():
    w, h = _weight(), _hessian(64)
    r = obs_compress(w, h, sparsity=0.5)
    masked = w.double() * r.keep

    def err(v):
        d = v.double() - w.double()
        return float(torch.einsum("ij,jk,ik->", d, h, d))

    assert err(r.weight) < 0.5 * err(masked)


def test_a_fixed_mask_stays_exactly_zero_when_quantizing():
    w = _weight()
    keep = torch.rand(w.shape, generator=torch.Generator().manual_seed(3)) > 0.5
    r = obs_compress(w * keep, _hessian(64), keep=keep, quant=QuantSpec(4, 16))
    assert bool((r.weight[~keep] == 0).all()) and torch.equal(r.keep, keep)


@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
def test_quantized_weights_lie_exactly_on_contiguous_group_grids(sym, act_order):
    w = _weight()
    r = obs_compress(w, _hessian(64), quant=QuantSpec(3, 16, sym), act_order=act_order)
    assert r.grid.scale.shape == (16, 4) and r.grid.group_size == 16
    for g in range(4):
        group = r.weight[:, g * 16:(g + 1) * 16]
        codes = torch.round(group / r.grid.scale[:, g:g + 1]) + r.grid.zero[:, g:g + 1]
        assert bool(((codes >= 0) & (codes <= 7)).all())
        assert torch.equal(r.grid.scale[:, g:g + 1] * (codes - r.grid.zero[:, g:g + 1]), group)
        assert all(len(row.unique()) <= 8 for row in group)


def test_with_an_identity_hessian_gptq_is_round_to_nearest():
    # no correlation between inputs: an error has nowhere to go, so each column just rounds
    w = _weight()
    r = obs_compress(w, torch.eye(64, dtype=torch.float64), quant=QuantSpec(4, None), damp=0.0)
    scale, zero = fit_grid(w, QuantSpec(4, None))
    assert torch.allclose(r.weight, quantize_to_grid(w, scale[:, None], zero[:, None], 15), atol=1e-6)


def test_a_dead_input_column_is_zeroed_and_cholesky_still_works():
    h = _hessian(64)
    h[5, :] = 0
    h[:, 5] = 0
    r = obs_compress(_weight(), h, sparsity=0.5)
    assert bool((r.weight[:, 5] == 0).all())


def test_grids_hold_zero_and_round_trip():
    scale, zero = fit_grid(torch.tensor([[0.5, 1.0, 2.0], [0.0, 0.0, 0.0]]), QuantSpec(2))
    assert scale.tolist() == pytest.approx([2.0 / 3, 2.0 / 3]) and zero.tolist() == [0.0, 2.0]  # zeros: [-1, 1]
    grid = GroupGrid(torch.tensor([[0.25, 0.5]]), torch.tensor([[2.0, 1.0]]), bits=2, group_size=2, sym=False)
    w = torch.tensor([[-0.5, 0.25, 1.0, -0.5]])
    assert torch.equal(grid.dequantize(grid.codes(w)), w)


@pytest.mark.parametrize("kwargs, message", [
    ({"nm": (2, 5)}, "m=5 does not divide the input width 64 of 'fc'"),
])
def test_shape_errors_name_the_layer(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        obs_compress(_weight(), _hessian(64), name="fc", **kwargs)


def test_bits_out_of_range_are_config_errors():
    for bits in (1, 9, 4.0):
        with pytest.raises(ConfigError, match="bits must be an int in 2..8"):
            QuantSpec(bits)


def test_a_group_size_that_does_not_divide_the_width_leaves_a_shorter_last_group():
    r = obs_compress(_weight(), _hessian(64), quant=QuantSpec(3, 48), name="fc")
    assert r.grid.scale.shape == (_weight().shape[0], 2)
    assert r.grid.on_grid(r.weight)
    for row in r.weight:
        assert len(row[:48].unique()) <= 8 and len(row[48:].unique()) <= 8


def test_the_least_error_grid_is_never_worse_than_min_max_and_clips_an_outlier():
    w = torch.randn(16, 64)
    w[:, 0] = 12.0  # one outlier per row: min..max wastes most levels on it
    errors = {}
    for mse in (False, True):
        spec = QuantSpec(3, None, mse=mse)
        scale, zero = fit_grid(w, spec)
        q = quantize_to_grid(w, scale[:, None], zero[:, None], spec.maxq)
        errors[mse] = (q - w).abs().pow(2.4).sum(1)
    assert bool((errors[True] <= errors[False]).all()) and float(errors[True].sum()) < 0.9 * float(errors[False].sum())


def test_subnormals_are_flushed_inside_the_sweep_and_the_setting_is_restored(monkeypatch):
    import sparta_explore.oneshot.obs as obs

    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormals (no SSE3 DAZ/FTZ)")
    seen = []
    real = obs._obs_sweep

    def spy(*args):
        seen.append(float(torch.tensor([1e-40]) * 1.0))
        return real(*args)

    monkeypatch.setattr(obs, "_obs_sweep", spy)
    try:
        for before in (False, True):
            torch.set_flush_denormal(before)
            obs_compress(_weight(), _hessian(64), sparsity=0.5)
            assert obs._flushing() is before
    finally:
        torch.set_flush_denormal(False)
    assert seen == [0.0, 0.0]
