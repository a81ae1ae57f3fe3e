"""Pareto fronts and hypervolume on points whose answers are known, plus a brute-force check."""

import numpy as np
import pandas as pd
import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.report.pareto import (
    front_hypervolume,
    guided_front,
    hypervolume,
    non_dominated,
    pareto_front,
    reference_point,
)


def test_non_dominated_known_points():
    cost = [1.0, 2.0, 2.0, 3.0, 0.5, 4.0]
    value = [0.5, 0.9, 0.8, 0.9, 0.1, 0.95]
    # (2, .8) is dominated by (2, .9); (3, .9) too (same value, more cost)
    assert non_dominated(cost, value).tolist() == [True, True, False, False, True, True]


def test_equal_points_both_stay_and_nan_never_does():
    assert non_dominated([1.0, 1.0, np.nan], [0.5, 0.5, 0.99]).tolist() == [True, True, False]


def test_front_is_sorted_by_cost():
    df = pd.DataFrame({"latency_ms": [3.0, 1.0, 2.0, 2.5], "accuracy": [0.9, 0.5, 0.8, 0.7], "id": list("abcd")})
    assert pareto_front(df)["id"].tolist() == ["b", "c", "a"]
    with pytest.raises(ConfigError, match="no column 'speed'"):
        pareto_front(df, cost="speed")


@pytest.mark.parametrize("cost, value, ref, expected", [
    ([1.0], [0.5], (3.0, 0.0), 1.0),                               # one rectangle: 2 x 0.5
    ([1.0, 2.0], [0.5, 1.0], (3.0, 0.0), 1.5),                     # staircase: 1 x .5 + 1 x 1
    ([1.0, 2.0, 1.5], [0.5, 1.0, 0.4], (3.0, 0.0), 1.5),           # a dominated point adds nothing
    ([1.0, 5.0], [0.5, 1.0], (3.0, 0.0), 1.0),                     # beyond the reference cost: ignored
    ([1.0, 2.0], [0.5, 0.2], (3.0, 0.3), 0.4),                     # below the reference value: ignored
    ([], [], (3.0, 0.0), 0.0),
])
def test_hypervolume_known_values(cost, value, ref, expected):
    assert hypervolume(cost, value, ref) == pytest.approx(expected)


def _brute_force_hv(cost, value, ref, n=800):
    xs = (np.arange(n) + 0.5) / n * ref[0]
    ys = ref[1] + (np.arange(n) + 0.5) / n * (1.0 - ref[1])
    gx, gy = np.meshgrid(xs, ys)
    covered = np.zeros_like(gx, dtype=bool)
    for c, v in zip(cost, value):
        covered |= (gx >= c) & (gy <= v)
    return covered.mean() * ref[0] * (1.0 - ref[1])


def test_hypervolume_matches_grid_counting_on_random_points():
    rng = np.random.default_rng(0)
    for _ in range(5):
        cost, value = rng.uniform(0, 10, 12), rng.uniform(0, 1, 12)
        ref = (9.0, 0.2)
        assert hypervolume(cost, value, ref) == pytest.approx(_brute_force_hv(cost, value, ref), abs=0.03)


def test_flops_front_keeps_what_flops_like_and_never_beats_the_latency_front():
    df = pd.DataFrame({"latency_ms": [2.0, 4.0, 9.0, 5.0], "effective_flops": [50, 60, 10, 20],
                       "accuracy": [0.90, 0.95, 0.93, 0.80], "dense_latency_ms": 10.0})
    assert guided_front(df, "latency")["latency_ms"].tolist() == [2.0, 4.0]
    # on FLOPs, (10 FLOPs, .93) and (60, .95) are non-dominated; listed by their measured latency
    assert guided_front(df, "flops")["latency_ms"].tolist() == [4.0, 9.0]
    assert front_hypervolume(df, "latency") > front_hypervolume(df, "flops")
    rng = np.random.default_rng(1)
    for _ in range(10):
        rand = pd.DataFrame({"latency_ms": rng.uniform(1, 10, 15), "effective_flops": rng.uniform(1, 10, 15),
                             "accuracy": rng.uniform(0.5, 1, 15), "dense_latency_ms": 10.0})
        assert front_hypervolume(rand, "latency") >= front_hypervolume(rand, "flops") - 1e-12
    with pytest.raises(ConfigError, match="guide"):
        guided_front(df, "energy")


def test_reference_point_is_the_median_dense_latency():
    assert reference_point(pd.DataFrame({"dense_latency_ms": [9.0, 11.0, 10.0]})) == (10.0, 0.0)
    with pytest.raises(ConfigError, match="dense_latency_ms"):
        reference_point(pd.DataFrame({"latency_ms": [1.0]}))
