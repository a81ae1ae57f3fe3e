"""Broadcast-compact masks: every helper equals the plain torch op, and compact inputs stay compact."""

import pytest
import torch

from sparta_explore.compact import (
    EQUAL_BLOCK,
    any_of_both,
    any_over,
    any_true,
    both,
    core,
    count_true,
    either,
    equal,
    keep_where,
    kept_only,
    negate,
    rows_like,
    zero_where_,
)
from sparta_explore.tesa import TeSA

SHAPE = (3, 4, 5)
PATTERNS = [(1, 1, 5), (3, 1, 5), (1, 4, 1), (3, 4, 5), (1, 1, 1)]


def _mask(pattern, seed, p=0.5):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(pattern, generator=g) < p).expand(SHAPE)


@pytest.mark.parametrize("pa", PATTERNS)
@pytest.mark.parametrize("pb", PATTERNS)
def test_binary_helpers_equal_torch_ops(pa, pb):
    a, b = _mask(pa, 1), _mask(pb, 2)
    assert torch.equal(both(a, b), a & b) and torch.equal(either(a, b), a | b)
    assert torch.equal(negate(a), ~a)
    key = torch.randint(0, 9, pa, dtype=torch.uint8).expand(SHAPE)
    assert torch.equal(keep_where(key, b), torch.where(b, key, 0))
    assert count_true(a) == int(a.sum())
    assert equal(a, a.contiguous()) and equal(a, b) == torch.equal(a, b)


@pytest.mark.parametrize("pa", PATTERNS)
@pytest.mark.parametrize("pb", PATTERNS)
def test_equal_finds_one_differing_byte_under_any_broadcast(pa, pb):
    key = torch.randint(1, 9, pa, dtype=torch.uint8).expand(SHAPE)
    ones = torch.ones(pb, dtype=torch.uint8).expand(SHAPE)
    assert equal(key, key.contiguous()) and equal(key.contiguous(), key)
    assert equal(ones, key.bool().to(torch.uint8)) and equal(key.bool().to(torch.uint8), ones)
    for flat in (0, 37, 59):  # first, middle, last position
        changed = key.contiguous().clone()
        changed.view(-1)[flat] = 0
        assert not equal(key, changed) and not equal(changed, key)
        assert equal(changed.bool(), key.bool()) == torch.equal(changed.bool(), key.bool())
    assert equal(key.mT, key.contiguous().mT) and not equal(key.mT.bool(), key.mT == 0)
    assert equal(torch.zeros(0, 3, dtype=torch.bool), torch.zeros(0, 3, dtype=torch.bool))
    assert not equal(torch.zeros(2, 3, dtype=torch.bool), torch.zeros(3, 2, dtype=torch.bool))


def test_equal_in_blocks_on_large_masks_and_by_identity():
    n = 3 * EQUAL_BLOCK + 123  # three whole blocks and a ragged one
    a = torch.rand(n, generator=torch.Generator().manual_seed(0)) > 0.5
    assert equal(a, a.clone()) and equal(a, a)
    for flat in (0, EQUAL_BLOCK - 1, EQUAL_BLOCK, 2 * EQUAL_BLOCK + 7, n - 1):
        changed = a.clone()
        changed[flat] = ~changed[flat]
        assert not equal(a, changed) and not equal(changed, a)
    square = torch.rand(700, 700) > 0.5  # its transpose: same memory, same shape, other strides
    assert equal(square.t(), square.t().contiguous()) and not equal(square, square.t())
    keys = torch.randint(0, 9, (2, n // 2), dtype=torch.uint8)
    assert equal(keys, keys.clone()) and not equal(keys, keys.flip(1))


@pytest.mark.parametrize("n,k", [(3, 5), (EQUAL_BLOCK // 100 + 7, 100), (2, EQUAL_BLOCK + 3), (0, 4), (4, 0)])
@pytest.mark.parametrize("b_shape", ["row", "column", "full", "one"])
def test_any_of_both_equals_the_product_then_any_in_row_blocks(n, k, b_shape):
    g = torch.Generator().manual_seed(n * 31 + k)
    a = torch.rand(n, k, generator=g) > 0.97  # sparse: many rows and columns with nothing kept
    b = {"row": torch.rand(k, generator=g) > 0.5, "column": torch.rand(n, 1, generator=g) > 0.5,
         "full": torch.rand(n, k, generator=g) > 0.5, "one": torch.ones(1, 1, dtype=torch.bool)}[b_shape]
    for dim in (0, 1, -1):
        assert torch.equal(any_of_both(a, b, dim), (a & b).any(dim=dim))
    before = a.clone()
    any_of_both(a, b, 1)
    assert torch.equal(a, before)


@pytest.mark.parametrize("n,k", [(1, 3), (9, 4), (EQUAL_BLOCK // 64 + 5, 64), (3, 0)])
def test_rows_like_finds_the_rows_equal_to_one(n, k):
    g = torch.Generator().manual_seed(n + k)
    kinds = torch.rand(3, k, generator=g) > 0.5
    rows = kinds[torch.randint(0, 3, (n,), generator=g)]
    for i in {0, n // 2, n - 1}:
        want = (rows == rows[i]).all(dim=1)
        assert torch.equal(rows_like(rows, i), want)
        assert torch.equal(rows_like(rows.to(torch.uint8), i), want)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_any_over_equals_reductions(pattern):
    m = _mask(pattern, 3, p=0.2)
    for dims in ([0], [1, 2], [0, 2], [-1]):
        ref = m
        for d in sorted(d % 3 for d in dims):
            ref = ref.any(dim=d, keepdim=True)
        assert torch.equal(any_over(m, dims), ref)


def test_compact_inputs_stay_compact():
    a, b = _mask((1, 1, 5), 4), _mask((1, 4, 1), 5)
    assert core(both(a, b)).shape == (1, 4, 5) and both(a, b).shape == SHAPE
    assert core(a).shape == (1, 1, 5) and core(a.contiguous()).shape == SHAPE


def test_tesa_dense_and_merge_are_compact_with_exact_counts():
    dense = TeSA.dense((8, 128, 3072), bits=8)
    assert dense._key.untyped_storage().nbytes() == 1  # one stored element for 3M attributes
    row = TeSA.from_mask(torch.tensor([1, 0, 1, 1]).expand(6, 4))
    merged = row.merge(TeSA.dense((6, 4), bits=4))
    assert core(merged._key).shape == (1, 4)
    assert merged.bit_histogram() == {0: 6, 4: 18} and merged.sparsity == 0.25
    pruned = row.prune(torch.tensor([[True], [False], [False], [False], [False], [True]]))
    assert torch.equal(pruned.kept, row.kept.contiguous() & torch.tensor([0, 1, 1, 1, 1, 0]).bool()[:, None])
    assert pruned.sparsity == pytest.approx(1 - 12 / 24)


@pytest.mark.parametrize("mask", [
    torch.rand(37, 70) < 0.05,                      # contiguous, sparse: rows without a True
    (torch.rand(70, 37) < 0.3).t(),                  # transposed (strided)
    (torch.rand(1, 5, 9) < 0.5).expand(4, 5, 9),     # expanded: stride 0
    torch.zeros(3, 0, 4, dtype=torch.bool),          # empty
    torch.zeros(6, 8, dtype=torch.bool),             # all false
    torch.tensor(True),                              # 0-d
], ids=["sparse", "transposed", "expanded", "empty", "all-false", "scalar"])
def test_any_true_equals_any_on_every_layout(mask):
    assert any_true(mask).item() == mask.any().item()
    for dim in range(mask.dim()):
        for keepdim in (False, True):
            assert torch.equal(any_true(mask, dim=dim, keepdim=keepdim), mask.any(dim=dim, keepdim=keepdim))
    if mask.dim() == 3:
        assert torch.equal(any_true(mask, dim=(0, 2)), mask.any(dim=(0, 2)))
    as_int = mask.to(torch.int32)  # not bool: any itself
    assert torch.equal(any_true(as_int), as_int.any())


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                   torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize(("shape", "mask_shape"), [((5, 7), (5, 7)), ((5, 7), (5, 1)), ((5, 7), (7,)),
                                                   ((3, 5, 7), (1, 5, 7)), ((0, 3), (0, 3)), ((), ()),
                                                   ((301, 500), (301, 500)), ((301, 500), (301, 1)),
                                                   ((301, 500), (500,)), ((3, 70000), (3, 70000))])
@pytest.mark.parametrize("where", [True, False])
def test_zero_where_equals_masked_fill_bit_for_bit(dtype, shape, mask_shape, where):
    g = torch.Generator().manual_seed(4)
    t = (torch.randn(shape, generator=g) * 10).to(dtype)
    # (301, 500) runs in blocks of rows, the last one short; (3, 70000) a row at a time, each above one block
    if dtype.is_floating_point and t.numel() > 2:  # non-finite and negative zero become +0.0 where masked
        t.view(-1)[:3] = torch.tensor([float("nan"), float("-inf"), -0.0])
    mask = torch.rand(mask_shape, generator=g) < 0.5
    given = mask.clone()
    zeroed = mask if where else ~mask
    assert torch.equal(_bytes(zero_where_(t.clone(), mask, where)), _bytes(t.clone().masked_fill_(zeroed, 0)))
    assert torch.equal(mask, given)  # the mask is read, never written
    if t.dim() == 2:  # a transposed (non-contiguous) tensor, masked through its strides
        mask_t = torch.rand(t.mT.shape, generator=g) < 0.5
        zeroed_t = mask_t if where else ~mask_t
        assert torch.equal(_bytes(zero_where_(t.clone().mT, mask_t, where)),
                           _bytes(t.clone().mT.masked_fill_(zeroed_t, 0)))


@pytest.mark.parametrize("pattern", PATTERNS)
def test_kept_only_is_a_masked_copy(pattern):
    t = torch.randn(SHAPE, generator=torch.Generator().manual_seed(6))
    t[0, 0, :2] = torch.tensor([float("nan"), float("inf")])
    kept = _mask(pattern, 8)
    before = t.clone()
    got = kept_only(t, kept)
    assert torch.equal(_bytes(got), _bytes(torch.where(kept, t, 0.0))) and torch.equal(_bytes(t), _bytes(before))
    assert torch.equal(_bytes(kept_only(t, kept.to(torch.uint8))), _bytes(got))  # a 0/1 mask of another dtype
