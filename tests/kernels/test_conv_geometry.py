"""ConvGeometry: output sizes as PyTorch computes them, padding modes, and the C macros the packer reads."""

import pytest
import torch
from torch import nn

from sparta_explore.kernels.conv_geometry import ConvGeometry


@pytest.mark.parametrize("kernel,stride,padding,dilation", [(1, 1, 0, 1), (3, 1, 1, 1), (3, 2, 1, 1), (5, 3, 2, 2),
                                                            ((3, 1), (2, 1), (1, 0), 1), (2, 2, 0, 1)])
@pytest.mark.parametrize("hw", [(7, 9), (1, 5), (16, 16)])
def test_out_hw_matches_pytorch(kernel, stride, padding, dilation, hw):
    conv = nn.Conv2d(3, 4, kernel, stride=stride, padding=padding, dilation=dilation)
    try:
        want = conv(torch.zeros(1, 3, *hw)).shape[2:]
    except RuntimeError:  # kernel larger than the padded input: PyTorch refuses, and so do we
        with pytest.raises(ValueError, match="no output pixel"):
            ConvGeometry.of(conv, hw)
        return
    g = ConvGeometry.of(conv, hw)
    assert g.out_hw == tuple(want)
    assert g.k == 3 * conv.kernel_size[0] * conv.kernel_size[1]


def test_non_zero_padding_modes_are_applied_before_the_kernel():
    g = ConvGeometry.of(nn.Conv2d(3, 4, 3, padding=(1, 2), padding_mode="circular"), (6, 6))
    assert g.in_hw == (8, 10) and g.padding == (0, 0) and g.out_hw == (6, 8)


def test_flat_only_for_1x1_stride_1_unpadded():
    assert ConvGeometry.of(nn.Conv2d(3, 4, 1), (4, 4)).flat
    assert not ConvGeometry.of(nn.Conv2d(3, 4, 1, stride=2), (4, 4)).flat
    assert not ConvGeometry.of(nn.Conv2d(3, 4, 1, padding=1), (4, 4)).flat


def test_defines_name_every_size_and_bad_geometry_is_refused():
    d = ConvGeometry.of(nn.Conv2d(3, 4, 3, stride=2, padding=1), (7, 9)).defines(96)
    for macro in ("CONV_C 3L", "CONV_H 7L", "CONV_W 9L", "CONV_SH 2L", "CONV_OH 4L", "CONV_OW 5L", "CONV_OHW 20L",
                  "CONV_FLAT 0L", "CONV_MI 20L"):
        assert f"#define {macro}" in d
    assert "XB_FLOATS" not in d  # gathered tiles: K rows of TILE, the kernel's default
    with pytest.raises(ValueError, match="invalid conv geometry"):
        ConvGeometry(0, (4, 4), (3, 3))
    with pytest.raises(ValueError, match="numeric padding"):
        ConvGeometry.of(nn.Conv2d(3, 4, 3, padding="same"), (4, 4))


def test_windowed_kernels_compute_a_padded_grid_in_whole_tiles():
    g = ConvGeometry.of(nn.Conv2d(3, 4, 3, padding=1, dilation=1), (7, 9))
    assert g.windowed and g.grid_width == 11 and g.out_hw == (7, 9)
    assert g.rows_per_image(32) == 96  # 7 grid rows x 11 = 77 grid points, in whole tiles of 32
    # column (c, i, j) sits at c * window + i * grid width + j: the halo reaches 2 rows and 2 columns on
    assert g.window(32) == 64 and g.window(32) >= 32 + 2 * 11 + 2
    assert g.window_offsets(32)[:4] == (0, 1, 2, 11) and g.window_offsets(32)[9] == 64
    assert "#define XB_FLOATS (192L)" in g.defines(32)
    assert not ConvGeometry.of(nn.Conv2d(3, 4, 3, stride=2), (7, 9)).windowed
    assert not ConvGeometry.of(nn.Conv2d(3, 4, 1), (7, 9)).windowed  # flat: rows are the pixels already
