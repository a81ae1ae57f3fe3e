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


def _options_by_rounding_every_element(bits, widths):
    """bit_options as first written (every element rounded, the kept ones' widths found by unique)."""
    rounded, kept = round_bits(bits, widths), bits > 0
    present = sorted({int(w) for w in rounded[kept].unique().tolist()}) if bool(kept.any()) else [max(widths)]
    top = present[-1]
    out = [("uniform", {top: kept}, {top: int(bits.max()) if bool(kept.any()) else top})]
    if len(present) > 1:
        parts = {w: rounded == w for w in present}
        out.append(("split", parts, {w: int(bits[parts[w]].max()) for w in present}))
    return out


@pytest.mark.parametrize("widths", [(8, 32), (32,), (4, 8, 16, 32), (2, 8)])
@pytest.mark.parametrize("seed", range(6))
def test_options_equal_rounding_every_element(widths, seed):
    g = torch.Generator().manual_seed(seed)
    top = max(widths)
    values = [v for v in (0, 1, 2, 3, 4, 7, 8, 9, 12, 16, 32) if v <= top]
    pick = torch.randint(0, len(values), (30, 17), generator=g)
    bits = torch.tensor(values, dtype=torch.uint8)[pick]
    if seed % 3 == 0:
        bits[bits > 0] = bits[bits > 0].max()  # one width only
    if seed == 5:
        bits.zero_()  # nothing kept
    got = [(o.name, o.parts, o.grid) for o in bit_options(bits, widths)]
    want = _options_by_rounding_every_element(bits, widths)
    assert [(n, sorted(p), gr) for n, p, gr in got] == [(n, sorted(p), gr) for n, p, gr in want]
    assert all(torch.equal(p[w], q[w]) for (_, p, _), (_, q, _) in zip(got, want) for w in p)


def test_what_the_caller_knows_gives_the_options_a_pass_over_the_bits_does():
    g = torch.Generator().manual_seed(0)
    for bits in (torch.randint(0, 9, (16, 24), generator=g, dtype=torch.uint8),
                 torch.where(torch.rand(16, 24, generator=g) > 0.5, 32, 0).to(torch.uint8),
                 torch.where(torch.rand(16, 24, generator=g) > 0.5, 4, 8).to(torch.uint8)):
        kept = bits > 0
        span = (int(bits[kept].min()), int(bits[kept].max()))
        for widths in ((8, 32), (4, 8, 32), (32,)):
            told = bit_options(bits, widths, kept=kept, span=span)
            found = bit_options(bits, widths)
            assert [(o.name, o.grid, {w: m.tolist() for w, m in o.parts.items()}) for o in told] == \
                [(o.name, o.grid, {w: m.tolist() for w, m in o.parts.items()}) for o in found]
