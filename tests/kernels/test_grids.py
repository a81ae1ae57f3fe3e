"""The pairwise grid: every pair met unmarked, the rest slow, `pytest.param` values unwrapped."""

import pytest

from .grids import pairwise


def test_a_param_value_is_passed_as_its_value_with_its_id_and_marks():
    skip = pytest.mark.skipif(True, reason="no such CPU")
    cases = pairwise([pytest.param(True, id="emulated"), pytest.param(False, id="native", marks=skip)], [1, 2])
    assert [c.values for c in cases] == [(True, 1), (True, 2), (False, 1), (False, 2)]  # not the params: bools
    assert [c.id for c in cases] == ["emulated-1", "emulated-2", "native-1", "native-2"]
    assert [any(m.name == "skipif" for m in c.marks) for c in cases] == [False, False, True, True]
    assert not any(c.marks for c in cases[:2])  # two axes of two values: every combination meets a new pair
