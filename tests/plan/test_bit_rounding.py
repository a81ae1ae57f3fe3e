"""BitRounding: kept bits rounded up to the device's widths; uniform vs split options."""

import pytest
import torch

from sparta_explore.plan import bit_options, round_bits


def test_rounds_up_never_down_and_keeps_pruned():
    bits = torch.tensor([0, 1, 4, 8, 9, 16, 32], dtype=torch.uint8)
    assert round_bits(bits, (8, 32)).tolist() == [0, 8, 8, 8, 32, 32, 32]
    assert round_bits(bits, (32,)).tolist() == [0, 32, 32, 32, 32, 32, 32]
    assert round_bits(bits, (4, 8, 16, 32)).tolist() == [0, 4, 4, 8, 16, 16, 32]


def test_bits_beyond_every_width_are_refused():
    with pytest.raises(ValueError, match="exceed"):
        round_bits(torch.tensor([32], dtype=torch.uint8), (8, 16))


def test_split_only_when_widths_differ_and_parts_partition_the_kept():
    bits = torch.tensor([[0, 4, 12], [8, 32, 0]], dtype=torch.uint8)
    uniform, split = bit_options(bits, (8, 32))
    assert uniform.name == "uniform" and list(uniform.parts) == [32]
    assert torch.equal(uniform.parts[32], bits > 0) and uniform.grid[32] == 32
    assert split.name == "split" and sorted(split.parts) == [8, 32]
    assert not bool((split.parts[8] & split.parts[32]).any())
    assert torch.equal(split.parts[8] | split.parts[32], bits > 0)
    assert split.grid == {8: 8, 32: 32}
    only_low = bit_options(torch.tensor([[4, 0, 3]], dtype=torch.uint8), (8, 32))
    assert [o.name for o in only_low] == ["uniform"] and only_low[0].grid == {8: 4}
