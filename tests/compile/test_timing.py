"""Whole-model timing in compile: a settled race stops early and never changes who wins."""

import time
from types import SimpleNamespace

import pytest

from sparta_explore.compile import timing


class Sleeper:
    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls = seconds, 0

    def __call__(self, *args) -> None:
        self.calls += 1
        time.sleep(self.seconds)


def fake_graph():
    return SimpleNamespace(run=lambda m: m(), call_args=(), call_kwargs={})


def test_settled_race_drops_the_slow_and_stops_after_min_rounds():
    dense, fast, slow = Sleeper(0.02), Sleeper(0.004), Sleeper(0.03)
    ms = timing.alternating_ms(fake_graph(), [dense, fast, slow], runs=20, settle=True)
    assert min(range(3), key=ms.__getitem__) == 1
    assert slow.calls == 1  # warm-up only: past OUT_OF_RACE times the fastest warm-up
    assert dense.calls == fast.calls == timing.MIN_ROUNDS  # the baseline is always timed; under half: a round less
    assert ms[2] >= 25  # its warm-up stands as its figure


def test_close_race_runs_every_round_and_without_settle_nothing_is_dropped():
    a, b = Sleeper(0.05), Sleeper(0.052)  # slow enough that `runs` rounds fill the time budget
    timing.alternating_ms(fake_graph(), [a, b], runs=6, settle=True)
    assert a.calls == b.calls == 1 + 6  # within CLEAR_MARGIN: no early stop
    dense, fast, slow = Sleeper(0.01), Sleeper(0.002), Sleeper(0.02)
    timing.alternating_ms(fake_graph(), [dense, fast, slow], runs=4)
    assert dense.calls == fast.calls == slow.calls > 1 + timing.MIN_ROUNDS


def test_calls_made_already_are_not_repeated_and_estimates_keep_the_slow_out():
    dense, fast, slow = Sleeper(0.02), Sleeper(0.004), Sleeper(0.03)
    ms = timing.alternating_ms(fake_graph(), [dense, fast, slow], runs=20, settle=True, warm={1: 0.004},
                               estimates={2: 0.03})
    assert slow.calls == 0 and ms[2] == pytest.approx(30.0)  # the estimate stands: never called
    assert fast.calls == dense.calls - 1  # its warm-up was the checks' call
    close = Sleeper(0.0045)
    timing.alternating_ms(fake_graph(), [dense, fast, close], runs=3, settle=True, estimates={2: 0.0045})
    assert close.calls >= 1 + 1  # still in the race: warmed up for real, then timed


def test_first_calls_already_far_apart_settle_after_one_agreeing_round():
    dense, fast = Sleeper(0.02), Sleeper(0.004)
    ms = timing.alternating_ms(fake_graph(), [dense, fast], runs=20, settle=True, warm={0: 0.02, 1: 0.004})
    assert dense.calls == fast.calls == 1  # the checks' calls were the warm-ups and the first evidence
    assert ms[1] < ms[0]
    near = Sleeper(0.012)  # first calls within WIDE_MARGIN of each other: the usual rounds
    timing.alternating_ms(fake_graph(), [dense, near], runs=20, settle=True, warm={0: 0.02, 1: 0.012})
    assert near.calls >= timing.MIN_ROUNDS - 1


def test_exact_first_calls_four_times_apart_settle_without_a_call():
    # tenths of a second, so that a loaded machine's late wake-ups (a few ms) cannot move a ratio past a margin
    dense, fast = Sleeper(0.1), Sleeper(0.02)
    ms = timing.alternating_ms(fake_graph(), [dense, fast], runs=20, settle=True, warm={0: 0.1, 1: 0.02},
                               warm_exact=True)
    assert dense.calls == fast.calls == 0 and ms == pytest.approx([100.0, 20.0])  # the first calls are the figures
    near = Sleeper(0.04)  # 0.4 of dense's call, not a third: the agreeing round still runs
    timing.alternating_ms(fake_graph(), [dense, near], runs=20, settle=True, warm={0: 0.1, 1: 0.04},
                          warm_exact=True)
    assert dense.calls == near.calls == 1
    timing.alternating_ms(fake_graph(), [dense, fast], runs=20, settle=True, warm={0: 0.1, 1: 0.02})
    assert fast.calls == 1  # a stand-in's first call (not exact): one agreeing round
