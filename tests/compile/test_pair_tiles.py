"""Remembered pair verdicts: written whole, read back, a torn record ignored; a hint only for an fp32 sparse op
after an fp32 sparse kernel."""

from types import SimpleNamespace

from torch import nn

from sparta_explore.compile import pair_tiles


def test_a_verdict_is_read_back_and_a_torn_record_is_none(tmp_path):
    pair_tiles.remember(tmp_path, "k1", True, "apart 2 ms, fused 1 ms")
    assert pair_tiles.recall(tmp_path, "k1") == (True, "apart 2 ms, fused 1 ms")
    pair_tiles.remember(tmp_path, "k1", False, "apart 1 ms, fused 2 ms")  # timed again: the record is replaced
    assert pair_tiles.recall(tmp_path, "k1") == (False, "apart 1 ms, fused 2 ms")
    assert pair_tiles.recall(tmp_path, "k2") is None
    pair_tiles._path(tmp_path, "k3").write_text('{"faster": tr')
    assert pair_tiles.recall(tmp_path, "k3") is None
    assert not [p for p in (tmp_path / "tuning").iterdir() if p.suffix == ".tmp"]


def test_no_tiling_is_given_after_anything_but_an_fp32_sparse_kernel(tmp_path):
    second = SimpleNamespace(candidates=[], activation="none")
    for first in (None, nn.Linear(4, 4)):
        assert pair_tiles.first_tiling(first, second, (2, 4), tmp_path) is None
