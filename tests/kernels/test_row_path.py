"""Few-row paths: the one-row kernels behind compiled linears, for inputs of 1..8 rows."""

import copy
import pickle
import time

import pytest
import torch
import torch.nn.functional as F

from sparta_explore.fake_quant import fake_quantize_rows, qmax
from sparta_explore.kernels import Int8SparseLinear, SparseLinear
from sparta_explore.kernels.row_path import RowPath, RowPathWarning, attach, why_no_row_path
from sparta_explore.oneshot.grid import QuantSpec, round_to_grids

pytestmark = pytest.mark.skipif(why_no_row_path() is not None, reason=f"few-row kernels: {why_no_row_path()}")


def _close(got, want):
    return float((got - want).abs().max()) <= 1e-4 * (1 + float(want.abs().max()))


def _sparse(n, k, density, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g), torch.randn(n, generator=g), torch.rand(n, k, generator=g) < density


@pytest.mark.parametrize("spec, fmt", [(None, "s32"), (QuantSpec(4, 32), "u4"), (QuantSpec(8, 64), "u8")])
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_a_path_multiplies_like_its_weight_in_every_layout(spec, fmt, rows):
    w, bias, kept = _sparse(24, 192, 0.5, rows)
    w = w * kept  # on a grid zeros stay values (codes); off any, the kept values and a mask (s32)
    w = w if spec is None else round_to_grids(w, spec)
    w[3] = 0.0  # an empty row
    path = RowPath(w, bias)
    assert path.packed.fmt == fmt
    x = torch.randn(rows, 192)
    assert _close(path(x), F.linear(x, w, bias))


@pytest.mark.parametrize("act_bits", [8, 5])
def test_rounded_inputs_use_one_grid_a_row(act_bits):
    w = round_to_grids(torch.randn(16, 128), QuantSpec(4, 32))
    x = torch.randn(3, 128)
    x[1] = 0.0  # an all-zero row: scale 1, every code 0
    path = RowPath(w, None, act_bits)
    assert path.int_inputs
    assert _close(path(x), fake_quantize_rows(x, act_bits) @ w.T)
    unpacked = RowPath(torch.randn(16, 100), None, act_bits)  # float rows, 100 columns: rounded in torch
    assert not unpacked.int_inputs
    assert _close(unpacked(x[:, :100]), fake_quantize_rows(x[:, :100], act_bits) @ unpacked.packed.dequantize().T)


def _forced(op):
    """The op with a few-row path serving 1..8 rows whatever the timing said (dispatch is tested, not speed)."""
    path = RowPath(op.effective_weight(), op.bias, getattr(op, "act_bits", 32))
    op.rows, op.few_rows = path, 8
    return path


def test_a_sparse_linear_dispatches_on_the_row_count(tmp_path):
    w, bias, kept = _sparse(40, 96, 0.3, 0)
    op = SparseLinear(w, bias, kept, activation="relu", cache_dir=tmp_path)
    path = _forced(op)
    calls = []
    op.rows = lambda x2: calls.append(x2.shape[0]) or path(x2)
    want = lambda x: F.relu(F.linear(x, w * kept, bias))  # noqa: E731 - what the user gave: the masked op
    with torch.no_grad():
        for shape in [(1, 96), (2, 4, 96), (8, 96), (9, 96), (130, 96)]:
            x = torch.randn(shape)
            assert _close(op(x), want(x)), shape
    assert calls == [1, 8, 8]  # 2 x 4 rows are 8 rows; 9 and 130 run the op's own kernel


def test_an_int8_linear_path_rounds_as_the_op_does(tmp_path):
    w, bias, kept = _sparse(32, 128, 0.5, 1)
    op = Int8SparseLinear(w, bias, kept, block_rows=1, weight_bits=4, act_bits=8, cache_dir=tmp_path)
    path = _forced(op)
    assert path.packed.fmt == "u4" and path.int_inputs  # a symmetric 4-bit grid per row: 4-bit codes
    with torch.no_grad():
        for rows in (1, 3, 8):
            x = torch.randn(rows, 128)
            assert _close(op(x), op.reference(x))
    q, scale = op._levels()
    assert float(q.abs().max()) <= qmax(4) and torch.equal(op.effective_weight() == 0, q == 0)


def test_attach_keeps_a_path_only_where_it_matches_and_wins():
    w = torch.randn(64, 128)
    full = lambda x: torch.relu(x @ w.T)  # noqa: E731 - the op's reference
    slow = lambda x: time.sleep(0.005) or full(x)  # noqa: E731 - a kernel no one-row product loses to
    path = attach("fc", w, None, 32, torch.relu, slow, full)
    assert path is not None and path.up_to == 8  # the first count timed (8 rows) won: it serves 1..8
    answers = {m: full(torch.zeros(m, 128)) for m in (1, 2, 4, 8)}
    instant = lambda x: answers[x.shape[0]]  # noqa: E731 - a kernel no product beats
    assert attach("fc", w, None, 32, torch.relu, instant, full) is None
    assert attach("fc", w, None, 32, torch.relu, instant, full, rows=2).up_to == 2  # a count as given is not timed
    with pytest.warns(RowPathWarning, match="fc: the few-row path misses the reference"):
        assert attach("fc", w, None, 32, torch.relu, slow, lambda x: full(x) + 1.0) is None


def test_ops_keep_their_row_count_through_copies_rebuilds_and_can_go_without(tmp_path):
    w, bias, kept = _sparse(16, 64, 0.5, 2)
    op = SparseLinear(w, bias, kept, cache_dir=tmp_path, few_rows=4)  # a count as given: checked, not timed
    assert op.few_rows == 4 and op.rows.up_to == 4
    x = torch.randn(3, 64)
    with torch.no_grad():
        want = op(x)
        for other in (copy.deepcopy(op), pickle.loads(pickle.dumps(op)), op.rebuilt(tmp_path)):
            assert other.few_rows == 4 and _close(other(x), want)
            assert other.rows is not None  # packed again on first use
    assert "rows" not in op.__getstate__()  # only the count travels (pickles, packages)
    assert SparseLinear(w, bias, kept, cache_dir=tmp_path).few_rows == 0  # ops built directly: off by default
    measured = SparseLinear(w, bias, kept, cache_dir=tmp_path, few_rows=True)
    assert measured.few_rows in (0, 1, 2, 4, 8) and (measured.rows is None) == (measured.few_rows == 0)
