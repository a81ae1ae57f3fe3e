"""Packed decode weights: grids read back from de-quantized values, codes and layouts that round-trip exactly."""

import pytest
import torch

from sparta_explore.fake_quant import fake_quantize_rows
from sparta_explore.kernels.packed_weights import TILE, pack_weight, recover_grid, tiled, untiled
from sparta_explore.oneshot.grid import QuantSpec, round_to_grids

from .gguf_weights import gguf_like


def on_grids(w: torch.Tensor, bits: int, group: int | None) -> torch.Tensor:
    """`w` on min-max grids of `group` columns (None: a row), as GPTQ leaves it."""
    return round_to_grids(w, QuantSpec(bits, group))


@pytest.mark.parametrize("bits, group, k, fmt", [(4, 32, 128, "u4"), (4, 64, 192, "u4"), (4, 128, 576, "u4"),
                                                 (3, 32, 64, "u4"), (2, None, 64, "u4"), (4, 32, 96, "u8"),
                                                 (8, 32, 96, "u8"), (8, 128, 576, "u8"), (8, None, 64, "u8")])
def test_grids_are_read_back_and_codes_round_trip(bits, group, k, fmt):
    w = on_grids(torch.randn(24, k, generator=torch.Generator().manual_seed(k + bits)), bits, group)
    w[3] = 0.0  # an empty row
    w[5, :32] = 0.0  # an all-zero group
    packed = pack_weight(w)
    assert packed.fmt == fmt and packed.bits <= max(bits, 4)
    assert torch.allclose(packed.dequantize(), w, rtol=0, atol=1e-6 * float(w.abs().max()))
    assert int(packed.codes().max()) < 1 << packed.bits
    assert torch.equal(pack_weight(packed.dequantize()).codes(), packed.codes())


def test_a_ragged_last_group_and_symmetric_row_grids():
    w = on_grids(torch.randn(8, 576), 4, 128)  # groups 128, 128, 128, 128, 64
    packed = pack_weight(w)
    assert (packed.fmt, packed.group, packed.groups) == ("u4", 128, 5)
    rows = fake_quantize_rows(torch.randn(8, 64), 8)  # codes -127 .. 127: 255 levels over the range
    assert pack_weight(rows).fmt == "u8"
    assert torch.allclose(pack_weight(rows).dequantize(), rows, atol=1e-6)


def test_float_weights_and_wrong_hints_stay_float32():
    w = torch.randn(16, 64)
    assert pack_weight(w).fmt == "f32"
    assert pack_weight(on_grids(w, 8, 32), bits=4, group=32).fmt == "f32"  # 256 levels do not fit 4 bits
    assert pack_weight(on_grids(w, 4, 32), bits=32).fmt == "f32"
    assert torch.equal(pack_weight(w).dequantize(), w)
    with pytest.raises(ValueError, match="no codes"):
        pack_weight(w).codes()


def test_recover_grid_names_the_step_and_offset():
    codes, scale, offset = recover_grid(torch.tensor([[-0.5, 0.0, 1.0, 1.0]]), 2, 4)
    assert codes.tolist() == [[0, 1, 3, 3]] and scale.tolist() == [[0.5]] and offset.tolist() == [[-0.5]]
    assert recover_grid(torch.tensor([[0.0, 0.1, 0.25, 1.0]]), 2, 4) is None


@pytest.mark.parametrize("bits, n, k, fmt", [(4, 13, 64, "u4"), (3, 8, 192, "u4"), (8, 21, 96, "u8"),
                                             (4, 1, 32 * 3, "u8"), (8, 16, 32, "u8")])
def test_tiles_hold_the_same_codes_and_convert_back_exactly(bits, n, k, fmt):
    w = on_grids(torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)), bits, 32)
    w[0] = 0.0  # an empty row
    rows = pack_weight(w)
    assert rows.fmt == fmt and not rows.tiles and rows.can_tile
    tiles = rows.to_tiles()
    assert tiles.tiles and tiles.to_tiles() is tiles and rows.to_rows() is rows
    assert torch.equal(tiles.codes(), rows.codes()) and torch.equal(tiles.dequantize(), rows.dequantize())
    assert torch.equal(tiles.to_rows().data, rows.data)
    padded = -(-n // TILE) * TILE  # the last tile's missing rows are zero codes the step reads too
    assert tiles.nbytes - rows.nbytes == (padded - n) * k // (2 if fmt == "u4" else 1)
    codes = torch.randint(0, 16 if fmt == "u4" else 256, (n, k), dtype=torch.uint8)
    assert torch.equal(untiled(tiled(codes, fmt), fmt, n, k), codes)


def test_float32_rows_do_not_tile():
    f32 = pack_weight(torch.randn(8, 64))
    assert not f32.can_tile and f32.to_tiles() is f32 and f32.to_rows() is f32


def test_bytes_count_codes_and_grids():
    packed = pack_weight(on_grids(torch.randn(4, 128), 4, 32))
    assert packed.nbytes == 4 * 128 // 2 + 4 * 4 * 2 * 4  # half a byte a code, scale and offset per group



@pytest.mark.parametrize("symmetric, fmt", [(False, "u4"), (True, "u8")])
def test_gguf_grids_pack_as_float16_and_mean_the_same_values(symmetric, fmt, monkeypatch):
    w = gguf_like(16, 128, 32, symmetric)
    packed = pack_weight(w, half=True)
    assert packed.fmt == fmt and packed.half_grids
    assert torch.equal(packed.dequantize(), w)  # float16 grids hold GGUF's values exactly
    if symmetric:  # re-centred: code 128 is zero, so the offset is -128 x scale, a float16 as exact as the scale
        assert torch.equal(packed.offset.float(), -128 * packed.scale.float())
    as_float = pack_weight(w, half=False)
    assert not as_float.half_grids and torch.equal(as_float.codes(), packed.codes())
    assert as_float.nbytes - packed.nbytes == 2 * packed.scale.numel() * 2  # two bytes less a scale and offset


def test_grids_float16_cannot_hold_stay_float32():
    w = on_grids(torch.randn(8, 128, generator=torch.Generator().manual_seed(3)), 4, 32)  # GPTQ-like float32 grids
    packed = pack_weight(w, half=True)
    assert packed.fmt == "u4" and not packed.half_grids
    assert torch.allclose(packed.dequantize(), w, rtol=0, atol=1e-6 * float(w.abs().max()))
