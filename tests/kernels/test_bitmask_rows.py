"""Bitmask rows: a pruned float32 weight's kept values and mask, the decode step's s32 layout."""

import pytest
import torch

from sparta_explore.kernels.bitmask_rows import MAX_DENSITY, PAD, bitmask_rows, dense_rows, density, fits_bitmask
from sparta_explore.kernels.packed_weights import pack_weight


def _pruned(n: int, k: int, kept: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen) * (torch.rand(n, k, generator=gen) < kept)


@pytest.mark.parametrize("n, k, kept", [(1, 8, 0.5), (7, 64, 0.3), (16, 200, 0.75), (5, 576, 0.0), (3, 16, 1.0)])
def test_the_layout_round_trips_and_counts_each_rows_values(n, k, kept):
    w = _pruned(n, k, kept, seed=n + k)
    w[0] = 0.0  # an empty row
    values, mask, starts = bitmask_rows(w)
    assert mask.shape == (n, k // 8) and mask.dtype == torch.uint8 and starts.dtype == torch.int32
    assert starts.tolist() == [0, *(w != 0).sum(dim=1).cumsum(0).tolist()]
    assert values.numel() == int(starts[-1]) + PAD and not values[int(starts[-1]):].any()
    assert torch.equal(dense_rows(values, mask, starts, k), w)
    for row in range(n):  # a row's values are its nonzeros in column order
        assert torch.equal(values[starts[row]:starts[row + 1]], w[row][w[row] != 0])


def test_only_pruned_weights_off_any_grid_take_the_layout():
    pruned, dense = _pruned(24, 64, 0.5, 1), torch.randn(24, 64)
    assert density(pruned) <= MAX_DENSITY < density(dense)
    assert fits_bitmask(pruned) and not fits_bitmask(dense) and not fits_bitmask(pruned[:, :60])
    packed = pack_weight(pruned)
    assert packed.fmt == "s32" and not packed.can_tile and not packed.has_codes
    assert packed.nbytes < 0.6 * pruned.numel() * 4  # half the values plus a bit a column
    assert torch.equal(packed.dequantize(), pruned)
    assert pack_weight(pruned, bits=32).fmt == "f32"  # asked for float32 rows: kept so
    assert pack_weight(torch.randn(24, 60) * (torch.rand(24, 60) < 0.5)).fmt == "f32"  # ragged: no mask bytes
    on_grid = torch.round(pruned * 4) / 4 * (pruned != 0)
    assert pack_weight(on_grid.clamp(-1, 1)).fmt in ("u4", "u8")  # codes beat the mask where a grid holds
    with pytest.raises(ValueError, match="no codes"):
        packed.codes()
    with pytest.raises(ValueError, match="multiple of 8"):
        bitmask_rows(torch.zeros(2, 12))
