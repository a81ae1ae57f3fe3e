"""Parameter grids for kernel tests: every pair of values in `make test`, the whole grid in `make test-slow`.

A kernel test crosses instruction modes, block patterns, ragged shapes and densities (all-zero,
mostly empty, dense). The full product builds one library per case (~0.6-1.5 s each). Bugs in these
kernels come from one value or the meeting of two (a ragged shape in a block pattern, empty blocks
in a mode), so the default suite runs a set of cases that meets every pair of values at least once,
and marks the rest of the product `slow`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest

_PARAM = type(pytest.param(None))  # what `pytest.param` returns


def _pairs(combo: tuple) -> set[tuple]:
    return {(i, repr(combo[i]), j, repr(combo[j])) for i, j in itertools.combinations(range(len(combo)), 2)}


def covering(*axes: Sequence) -> list[tuple]:
    """The combinations of `axes` (in product order) chosen greedily until every pair of values across two axes
    appears in one of them.

    Example:
        >>> len(covering([0, 1], "ab", "xyz"))
        6
    """
    product = list(itertools.product(*axes))
    if len(axes) < 2:
        return product
    uncovered = set().union(*(_pairs(c) for c in product))
    chosen = []
    while uncovered:
        best = max(product, key=lambda c: len(_pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= _pairs(best)
    return [c for c in product if c in chosen]


def pairwise(*axes: Sequence, spread: Sequence[int] = (), ids: Callable[[Any], str] = str) -> list:
    """`pytest.param`s over the product of `axes`: the `covering` set unmarked, every other combination `slow`.

    Values of the axes at the indices in `spread` are tuples of several arguments (as `parametrize("a, b", ...)`
    would take them); `ids` names one value. A value may be a `pytest.param` of one argument: its id names it and
    its marks (e.g. a skip where the CPU lacks an instruction set) go on every case it is in.

    Example:
        >>> cases = pairwise([(32, 32), (1, 1)], [0.0, 1.0], [(8, 8), (5, 3)])
        >>> sum(not c.marks for c in cases), len(cases)
        (4, 8)
    """
    params = []
    chosen = covering(*axes)
    for combo in itertools.product(*axes):
        args, marks, names = [], [] if combo in chosen else [pytest.mark.slow], []
        for i, value in enumerate(combo):
            if isinstance(value, _PARAM):  # unwrapped: a param passed on as one argument was always truthy
                (value,), marks, name = value.values, marks + list(value.marks), value.id or ids(value.values[0])
            else:
                name = ids(value)
            args.extend(value if i in spread else (value,))
            names.append(name)
        params.append(pytest.param(*args, marks=marks, id="-".join(names)))
    return params
