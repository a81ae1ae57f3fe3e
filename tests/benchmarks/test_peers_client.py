"""The peer benchmark's verdict per row (benchmarks/peers_client.py): a one-sided sign test over paired turns."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from peers_client import Turns, sign_tail  # noqa: E402


def test_sign_tail_is_the_binomial_upper_tail():
    for n in (1, 5, 9, 14):
        assert sign_tail(0, n) == 1.0
        assert sign_tail(n + 1, n) == 0.0
        for wins in range(n + 1):
            want = sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n
            assert sign_tail(wins, n) == pytest.approx(want)


@pytest.mark.parametrize(
    ("ratios", "want"),
    [
        ([1.2] * 9, "ahead"),
        ([1.01] * 8 + [0.5], "ahead"),  # the sign test counts wins, not their size
        ([1.3] * 7 + [0.99] * 2, "level"),  # 7 of 9 heads: a fair coin gives that 9% of the time
        ([0.97] * 8 + [1.4], "behind"),
        ([1.1, 0.9] * 4 + [1.0], "level"),  # a tie is neither side's win
        ([], "-"),
        ([1.5, 1.5, 1.5], "level"),  # three turns cannot show 5%
        ([1.5] * 5, "ahead"),  # five of five: 3%
    ],
)
def test_verdict(ratios, want):
    assert Turns(ratios=ratios).verdict() == want


def test_verdict_is_symmetric():
    # swapping the sides (1 / ratio) swaps ahead and behind
    for ratios in ([1.2] * 9, [1.01] * 8 + [0.5], [0.9] * 6 + [1.1] * 3):
        flipped = Turns(ratios=[1 / r for r in ratios]).verdict()
        got = Turns(ratios=ratios).verdict()
        assert {got, flipped} in ({"ahead", "behind"}, {"level"})
