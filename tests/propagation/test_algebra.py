"""row_wise_linear (deduplicated rows) must give exactly what multilinear gives on the full masks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sparta_explore.propagation.algebra import (
    DISTINCT_MOST,
    _distinct_rows,
    _rows_equal,
    multilinear_masks,
    row_wise_linear,
)


def _full(x: torch.Tensor, w: torch.Tensor, allowed: torch.Tensor):
    out, (kx, kw) = multilinear_masks(lambda a, b: F.linear(a, b), [x, w], allowed)
    return out, kx, kw


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("lead", [(7,), (2, 5), (3, 1, 4)])
def test_row_wise_linear_matches_the_full_product(seed: int, lead: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(seed)
    k, n = 6, 5
    patterns = torch.rand(3, k, generator=g) > 0.4  # few distinct rows, as in real activations
    pick = torch.randint(0, 3, lead, generator=g)
    x = patterns[pick]
    w = torch.rand(n, k, generator=g) > 0.5
    allowed = torch.rand(*lead, n, generator=g) > 0.2 if seed % 2 else torch.ones(*lead, n, dtype=torch.bool)
    got, want = row_wise_linear(x, w, allowed), _full(x, w, allowed)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        assert torch.equal(a, b)


def test_row_wise_linear_broadcast_input_and_identical_rows() -> None:
    x = torch.tensor([[True, False, True]])  # one row broadcast over 4 output rows
    w = torch.tensor([[True, True, False], [False, True, False]])
    allowed = torch.ones(4, 2, dtype=torch.bool)
    out, kx, kw = row_wise_linear(x, w, allowed)
    assert out.tolist() == [[True, False]] * 4  # row 1 of W only meets the pruned x[1]
    assert kx.shape == x.shape and kx.tolist() == [[True, True, False]]  # x[2] meets only pruned weights
    assert kw.tolist() == [[True, False, True], [False, False, False]]  # weights meeting x[1] do not matter


@pytest.mark.parametrize("kinds", [1, 2, DISTINCT_MOST, DISTINCT_MOST + 1, 40])
def test_row_wise_linear_per_kind_of_row_and_by_unique_beyond_the_most(kinds: int) -> None:
    # up to DISTINCT_MOST kinds of rows run the one-row rule per kind; beyond, torch.unique and autograd: both exact
    g = torch.Generator().manual_seed(kinds)
    k, n, rows = 12, 9, 64
    xs = torch.rand(kinds, k, generator=g) > 0.5
    ys = torch.rand(kinds, n, generator=g) > 0.3
    xs[:, 0], ys[:, 0] = torch.arange(kinds) % 2 == 0, torch.arange(kinds) % 3 == 0  # kinds apart in both halves
    pick = torch.cat([torch.arange(kinds), torch.randint(0, kinds, (rows - kinds,), generator=g)])
    pick = pick[torch.randperm(rows, generator=g)]
    x, allowed = xs[pick].reshape(4, 16, k), ys[pick].reshape(4, 16, n)
    w = torch.rand(n, k, generator=g) > 0.5
    got, want = row_wise_linear(x, w, allowed), _full(x, w, allowed)
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.equal(a, b)


def test_distinct_rows_finds_each_kind_once_in_order_of_first_appearance() -> None:
    rows = torch.tensor([[3, 0], [1, 1], [3, 0], [0, 0], [1, 1]], dtype=torch.uint8)
    first, kind = _distinct_rows(rows)
    assert first == [0, 1, 3] and kind.tolist() == [0, 1, 0, 2, 1]
    assert _distinct_rows(rows, most=2) is None
    assert torch.equal(rows[torch.tensor(first)][kind], rows)


def test_rows_equal_on_bytes_sees_one_differing_element_in_any_layout() -> None:
    rows = torch.rand(6, 40, generator=torch.Generator().manual_seed(0)) > 0.5
    same = rows[:1].repeat(6, 1)
    assert _rows_equal(same) and _rows_equal(rows[:1].expand(6, 40)) and _rows_equal(same.t().contiguous().t())
    for r, c in [(5, 39), (1, 0), (3, 17)]:
        one_off = same.clone()
        one_off[r, c] = ~one_off[r, c]
        assert not _rows_equal(one_off) and not _rows_equal(one_off.t().contiguous().t())
    assert _rows_equal(torch.zeros(4, 0, dtype=torch.bool)) and _rows_equal(torch.zeros(0, 3, dtype=torch.bool))
    assert not _rows_equal(torch.tensor([[1.0, 2.0], [1.0, 2.5]]))
