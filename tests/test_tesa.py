"""TeSA: constructors, statistics, block density, and the meet laws of merge."""

import copy
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparta_explore import NumberFormat, TeSA, TeSABitsError, TeSAShapeError


def tesas(shape=(3, 5)):
    n = shape[0] * shape[1]
    bits = st.lists(st.sampled_from([0, 1, 4, 8, 16, 32]), min_size=n, max_size=n)
    fmts = st.lists(st.integers(0, 3), min_size=n, max_size=n)
    return st.builds(lambda b, f: TeSA(torch.tensor(b).reshape(shape), torch.tensor(f).reshape(shape)), bits, fmts)


@settings(max_examples=200, deadline=None)
@given(tesas(), tesas())
def test_merge_is_commutative(a, b):
    assert a.merge(b) == b.merge(a)


@settings(max_examples=200, deadline=None)
@given(tesas(), tesas(), tesas())
def test_merge_is_associative(a, b, c):
    assert a.merge(b).merge(c) == a.merge(b.merge(c))


@settings(max_examples=100, deadline=None)
@given(tesas())
def test_merge_is_idempotent(a):
    assert a.merge(a) == a


@settings(max_examples=100, deadline=None)
@given(tesas(), tesas())
def test_merge_only_tightens(a, b):
    m = a.merge(b)
    assert torch.all(m.bits <= a.bits) and torch.all(m.bits <= b.bits)
    assert torch.equal(m.pruned, a.pruned | b.pruned)


def test_pruned_wins_and_fewer_bits_win():
    a = TeSA(torch.tensor([0, 8, 32, 16], dtype=torch.uint8), "float")
    b = TeSA(torch.tensor([32, 4, 16, 0], dtype=torch.uint8), "int")
    m = a.merge(b)
    assert m.bits.tolist() == [0, 4, 16, 0]
    assert m.fmt.tolist() == [0, int(NumberFormat.INT), int(NumberFormat.INT), 0]


def test_equal_bits_break_ties_by_format_rank():
    a = TeSA.dense((2,), bits=8, fmt="uint")
    b = TeSA.dense((2,), bits=8, fmt="int")
    assert a.merge(b).formats() == {NumberFormat.INT}


def test_merge_broadcasts_batch_dims_of_size_one():
    act = TeSA.from_mask(torch.tensor([[[1, 0, 1]]]))  # batch dims kept at 1
    full = TeSA.dense((4, 2, 3), bits=8)
    m = act.merge(full)
    assert m.shape == (4, 2, 3)
    assert m.pruned[:, :, 1].all() and not m.pruned[:, :, 0].any()


def test_merge_rejects_incompatible_shapes():
    with pytest.raises(TeSAShapeError, match=r"\(2, 3\).*\(3, 2\)"):
        TeSA.dense((2, 3)).merge(TeSA.dense((3, 2)))


def test_from_mask_and_statistics():
    t = TeSA.from_mask(torch.tensor([[1.0, 0.0, 2.0, 0.0]]), bits=8, fmt="int")
    assert t.sparsity == 0.5 and t.density == 0.5
    assert t.bit_histogram() == {0: 2, 8: 2}
    assert t.kept_bits() == [8]
    assert t.mean_bits() == 4.0
    assert t.pruned.tolist() == [[False, True, False, True]]
    assert t.formats() == {NumberFormat.INT}


def test_dense_and_with_bits():
    t = TeSA.dense((2, 2), bits=16, fmt="bfloat")
    assert t.bit_histogram() == {16: 4} and t.formats() == {NumberFormat.BFLOAT}
    lowered = TeSA.from_mask(torch.tensor([1, 0, 1])).with_bits(4, "uint")
    assert lowered.bits.tolist() == [4, 0, 4] and lowered.formats() == {NumberFormat.UINT}


def test_tesa_is_immutable_through_its_views():
    t = TeSA.dense((3,), bits=8)
    t.bits[0] = 0
    assert t.sparsity == 0.0


@pytest.mark.parametrize("bad", [-1, 33, 255])
def test_bits_out_of_range_raise(bad):
    with pytest.raises(TeSABitsError, match="0..32"):
        TeSA(torch.tensor([bad], dtype=torch.int32), name="fc1.weight")


def test_bits_error_names_the_tensor():
    with pytest.raises(TeSABitsError, match="fc1.weight"):
        TeSA(torch.tensor([40]), name="fc1.weight")


@pytest.mark.parametrize("bad", [-1, 33, 2.5, True])
def test_constructor_bits_argument_is_checked(bad):
    with pytest.raises(TeSABitsError):
        TeSA.dense((2,), bits=bad)


def test_float_bits_tensor_is_rejected():
    with pytest.raises(TeSABitsError, match="integer"):
        TeSA(torch.tensor([8.0]))


def test_unknown_format_is_rejected():
    with pytest.raises(TeSABitsError, match="fp8"):
        TeSA.dense((2,), fmt="fp8")


def test_block_density_counts_ragged_edge_blocks():
    mask = torch.zeros(5, 7)
    mask[0, 0] = 1  # block (0, 0)
    mask[4, 6] = 1  # the ragged corner block (2, 1)
    t = TeSA.from_mask(mask)
    grid = t.block_mask((2, 4))
    assert grid.shape == (3, 2)
    assert grid.tolist() == [[True, False], [False, False], [False, True]]
    assert t.block_density((2, 4)) == pytest.approx(2 / 6)


def test_block_density_of_empty_and_full():
    assert TeSA.from_mask(torch.zeros(64, 64)).block_density((32, 32)) == 0.0
    assert TeSA.dense((64, 64)).block_density((1, 32)) == 1.0


def test_block_density_over_leading_dims():
    mask = torch.zeros(2, 4, 4)
    mask[1, :2, :2] = 1
    assert TeSA.from_mask(mask).block_mask((2, 2)).sum() == 1
    assert TeSA.from_mask(mask).block_density((2, 2)) == pytest.approx(1 / 8)


def test_block_shape_errors():
    with pytest.raises(TeSAShapeError, match="block"):
        TeSA.dense((4, 4)).block_density((2, 2, 2))
    with pytest.raises(TeSAShapeError):
        TeSA.dense((4, 4)).block_density((0, 2))


def test_check_fits_names_the_tensor():
    t = TeSA.dense((3072, 512))
    expected = r"'encoder.0.ffn.fc1.weight' has shape \(3072, 512\), tensor has \(3072, 768\)"
    with pytest.raises(TeSAShapeError, match=expected):
        t.check_fits((3072, 768), "encoder.0.ffn.fc1.weight")
    assert TeSA.dense((1, 1, 8)).fits((32, 128, 8))


def test_prune_adds_pruned_elements_only():
    t = TeSA.from_mask(torch.tensor([1, 1, 0, 1]), bits=8)
    p = t.prune(torch.tensor([True, False, False, False]))
    assert p.bits.tolist() == [0, 8, 0, 8]


def test_bit_counts_are_computed_once_and_survive_pickling_and_copies():
    t = TeSA(torch.tensor([0, 4, 8, 8]))
    assert t.bit_histogram() == {0: 1, 4: 1, 8: 2}
    assert t._key_counts() is t._key_counts()  # kept: planning asks the same TeSA thousands of times
    for other in (pickle.loads(pickle.dumps(t)), copy.deepcopy(t), TeSA.dense((2, 3), bits=8)):
        assert other.kept_bits() == ([4, 8] if other == t else [8])


@pytest.mark.parametrize("kind", ["one width", "mixed", "all pruned", "dense", "empty", "broadcast"])
def test_bit_histogram_equals_counting_every_element(kind):
    g = torch.Generator().manual_seed(3)
    kept = torch.rand(37, 23, generator=g) > 0.6
    bits = {"one width": kept * 8, "mixed": kept * torch.randint(1, 33, (37, 23), generator=g),
            "all pruned": torch.zeros(37, 23, dtype=torch.long), "dense": torch.full((37, 23), 32),
            "empty": torch.zeros(0, 5, dtype=torch.long), "broadcast": (kept[:1] * 4).expand(37, 23)}[kind]
    t = TeSA(bits.to(torch.uint8))
    expected = {}
    for b in bits.flatten().tolist():
        expected[b] = expected.get(b, 0) + 1
    assert t.bit_histogram() == dict(sorted(expected.items()))
    assert t.kept_bits() == sorted(b for b in expected if b)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("core_shape", [(4, 5, 6), (1, 5, 6), (4, 1, 6), (4, 5, 1)])
def test_select_equals_indexing_the_key_on_any_layout(dim, core_shape):
    g = torch.Generator().manual_seed(7)
    bits = (torch.randint(0, 3, core_shape, generator=g) * 4).to(torch.uint8).expand(4, 5, 6)
    tesa = TeSA(bits, "int")
    size = (4, 5, 6)[dim]
    index = torch.tensor([size - 1, 0, size // 2])  # unsorted, first and last
    got = tesa.select(dim, index)
    assert torch.equal(got.bits, bits.index_select(dim, index))
    assert torch.equal(got.fmt, tesa.fmt.index_select(dim, index))
    assert got.shape[dim % 3] == 3


def test_grid_groups_meet_at_their_gcd_and_survive_what_keeps_the_values():
    a = TeSA.dense((2, 12), bits=4, fmt="uint").with_group(4)
    assert a.merge(TeSA.dense((2, 12), bits=4, fmt="uint").with_group(6)).group == 2
    assert a.merge(TeSA.from_mask(torch.ones(2, 12))).group == 4  # 0, no grid said, is the identity
    assert a.merge(a).group == 4 and TeSA.dense((2, 12)).merge(a).group == 4
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, 0] = True
    assert a.prune(mask).group == 4 and a.expand((2, 12)).group == 4 and a.with_bits(8).group == 4
    assert a.select(0, torch.tensor([1])).group == 4
    assert not a.equals(a.with_group(0)) and a.equals(a.with_group(4))
    assert "group=4" in repr(a) and pickle.loads(pickle.dumps(a)).group == 4
    with pytest.raises(TeSABitsError, match="group must be an int >= 0"):
        a.with_group(-1)
