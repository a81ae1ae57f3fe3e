"""WeightedBlockCover: disjoint parts that cover exactly the kept elements, at low cost."""

import pytest
import torch

from sparta_explore.plan import single_shape_cover, weighted_block_cover
from sparta_explore.plan.block_cover import tile_counts

COSTS = {(1, 1): 1.0, (1, 32): 8.0, (32, 32): 160.0}  # per element: 1, 0.25, 0.16


def block_pattern(n, k, block, density, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, w = block
    tiles = torch.rand(-(-n // h), -(-k // w), generator=g) < density
    return tiles.repeat_interleave(h, 0).repeat_interleave(w, 1)[:n, :k]


def assert_partition(cover, kept):
    union = torch.zeros_like(kept)
    for p in cover.parts:
        assert not bool((union & p.mask).any()), "parts overlap"
        union |= p.mask
        assert p.n_blocks == int((tile_counts(p.mask, p.block) > 0).sum()) or p.block == (1, 1)
    assert torch.equal(union, kept)


@pytest.mark.parametrize("shape", [(96, 128), (70, 45), (33, 1)])  # ragged edges
@pytest.mark.parametrize("block", [(32, 32), (1, 32), (1, 1)])
@pytest.mark.parametrize("density", [0.0, 0.2, 1.0])
def test_cover_partitions_the_kept_elements(shape, block, density):
    kept = block_pattern(*shape, block, density)
    cover = weighted_block_cover(kept, COSTS)
    assert_partition(cover, kept)
    assert cover.cost <= int(kept.sum()) * COSTS[(1, 1)] + 1e-9  # never worse than all 1x1


def test_pure_block_pattern_uses_its_own_block():
    kept = block_pattern(128, 128, (32, 32), 0.3, seed=1)
    cover = weighted_block_cover(kept, COSTS)
    assert [p.block for p in cover.parts] == [(32, 32)]
    assert cover.parts[0].n_blocks == int(kept.sum()) // 1024


def test_scattered_elements_stay_1x1_and_mixture_mixes():
    kept = torch.rand(64, 64, generator=torch.Generator().manual_seed(2)) < 0.02
    assert [p.block for p in weighted_block_cover(kept, COSTS).parts] == [(1, 1)]
    mixed = kept.clone()
    mixed[:32, :32] = True  # one dense block among scattered elements
    blocks = {p.block for p in weighted_block_cover(mixed, COSTS).parts}
    assert (32, 32) in blocks and (1, 1) in blocks


def test_cover_beats_or_matches_the_best_single_shape_on_mixtures():
    kept = block_pattern(128, 128, (32, 32), 0.25, seed=4) | block_pattern(128, 128, (1, 32), 0.05, seed=5)
    cover = weighted_block_cover(kept, COSTS)
    single = min(single_shape_cover(kept, b, c).cost for b, c in COSTS.items())
    assert cover.cost <= single


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="1, 1"):
        weighted_block_cover(torch.ones(4, 4, dtype=torch.bool), {(2, 2): 1.0})
    with pytest.raises(ValueError, match="2-D"):
        weighted_block_cover(torch.ones(4, dtype=torch.bool), COSTS)


@pytest.mark.parametrize("shape", [(96, 128), (70, 45), (33, 1), (0, 8)])
@pytest.mark.parametrize("block", [(1, 1), (1, 4), (4, 1), (3, 5), (32, 32)])
def test_tile_counts_equal_a_loop_over_tiles(shape, block):
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(3)) < 0.3
    h, w = block
    want = [[int(mask[i:i + h, j:j + w].sum()) for j in range(0, shape[1], w)] for i in range(0, shape[0], h)]
    assert tile_counts(mask, block).tolist() == want
    assert tile_counts(mask.float(), block).tolist() == want  # not only bool masks


def _cover_recounting_every_round(kept, costs, eps=0.25):
    """The greedy as first written: every shape recounted every round (the reference for the one that skips)."""
    unit, uncovered, parts_mask = float(costs[(1, 1)]), kept.clone(), {}
    shapes = [b for b in costs if b != (1, 1)]
    threshold = min(costs[b] / (b[0] * b[1]) for b in shapes) * (1 + eps)
    while shapes and threshold < unit * (1 + eps) and bool(uncovered.any()):
        for b in sorted(shapes, key=lambda s: costs[s] / (s[0] * s[1])):
            counts = tile_counts(uncovered, b)
            if float(counts.max()) * unit < costs[b]:
                shapes.remove(b)
                continue
            take = (counts > 0) & (costs[b] / counts.clamp(min=1) <= min(threshold, unit))
            region = take.repeat_interleave(b[0], 0).repeat_interleave(b[1], 1)[:kept.shape[0], :kept.shape[1]]
            region &= uncovered
            parts_mask[b] = region if b not in parts_mask else parts_mask[b] | region
            uncovered &= ~region
        threshold *= 1 + eps
    return {b: m for b, m in parts_mask.items() if bool(m.any())}, uncovered


MANY = {(1, 1): 1.0, (1, 4): 2.5, (4, 1): 2.7, (1, 8): 4.0, (8, 8): 21.0, (1, 32): 9.0, (32, 32): 190.0}


@pytest.mark.parametrize("costs", [COSTS, MANY])
@pytest.mark.parametrize("seed", range(4))
def test_skipping_recounts_takes_exactly_what_recounting_every_round_takes(costs, seed):
    g = torch.Generator().manual_seed(seed)
    masks = [torch.rand(96, 130, generator=g) < d for d in (0.1, 0.5, 0.9)]
    masks.append(block_pattern(96, 130, (8, 8), 0.3, seed) | (torch.rand(96, 130, generator=g) < 0.05))
    masks.append(block_pattern(96, 130, (1, 4), 0.4, seed) | block_pattern(96, 130, (32, 32), 0.2, seed + 9))
    for kept in masks:
        cover = weighted_block_cover(kept, costs)
        want, left = _cover_recounting_every_round(kept, costs)
        got = {p.block: p.mask for p in cover.parts if p.block != (1, 1)}
        assert got.keys() == want.keys() and all(torch.equal(got[b], want[b]) for b in want)
        ones = [p.mask for p in cover.parts if p.block == (1, 1)]
        assert torch.equal(ones[0] if ones else torch.zeros_like(kept), left)
        assert_partition(cover, kept)


def test_counts_made_already_change_no_cover():
    g = torch.Generator().manual_seed(5)
    costs = {**COSTS, (8, 8): 20.0}  # rounds that cover 8x8 blocks first, then recount the rest
    blocks = (torch.rand(6, 5, generator=g) > 0.6).repeat_interleave(8, 0).repeat_interleave(8, 1)
    for kept in (blocks | (torch.rand(48, 40, generator=g) > 0.93), torch.rand(37, 29, generator=g) > 0.8):
        counts = {b: tile_counts(kept, b) for b in costs if b != (1, 1)}
        told, found = weighted_block_cover(kept, costs, counts=counts), weighted_block_cover(kept, costs)
        assert told.describe() == found.describe() and told.cost == found.cost
        assert all(torch.equal(a.mask, b.mask) for a, b in zip(told.parts, found.parts))
        for b, c in costs.items():
            assert single_shape_cover(kept, b, c, counts.get(b)).cost == single_shape_cover(kept, b, c).cost
