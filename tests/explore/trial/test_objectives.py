"""Objectives: a soft target that rewards feasibility, MnasNet's scalarization, and the cost each reads."""

import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.trial.objectives import MNAS_EXPONENT, get_objective, objective_names, score


def row(accuracy, latency_ms, effective_flops, dense_ms=10.0, dense_flops=100.0):
    return {"accuracy": accuracy, "latency_ms": latency_ms, "dense_latency_ms": dense_ms,
            "effective_flops": effective_flops, "dense_flops": dense_flops}


def test_both_families_are_registered():
    names = objective_names()
    assert {"latency", "flops", "latency-mnas", "flops-mnas"} <= set(names)
    assert {get_objective(n).guide for n in names} == {"latency", "flops"}
    assert get_objective("latency").cost == "latency_ms" and get_objective("flops-mnas").cost == "effective_flops"


def test_target_objective_is_accuracy_when_feasible():
    assert score(row(0.93, 5.0, 100.0), "latency", 0.5) == pytest.approx(0.93)
    assert score(row(0.93, 2.0, 100.0), "latency", 0.5) == pytest.approx(0.93)  # no bonus below the target


def test_target_objective_penalizes_overshoot_linearly():
    # 6 ms vs a 5 ms target: 20% over the target costs 0.2
    assert score(row(0.99, 6.0, 100.0), "latency", 0.5) == pytest.approx(0.79)
    assert score(row(0.99, 7.0, 100.0), "latency", 0.5) < score(row(0.99, 6.0, 100.0), "latency", 0.5)
    # a more accurate model that misses the target loses to a feasible one
    assert score(row(0.99, 7.5, 100.0), "latency", 0.5) < score(row(0.90, 5.0, 100.0), "latency", 0.5)


def test_flops_objectives_read_flops_not_latency():
    fast_in_flops_only = row(0.95, latency_ms=9.0, effective_flops=30.0)
    assert score(fast_in_flops_only, "flops", 0.5) == pytest.approx(0.95)
    assert score(fast_in_flops_only, "latency", 0.5) < 0.95
    assert score(fast_in_flops_only, "flops-mnas", 0.5) > score(fast_in_flops_only, "latency-mnas", 0.5)


def test_mnas_trades_cost_for_accuracy_smoothly():
    at_target = score(row(0.9, 5.0, 100.0), "latency-mnas", 0.5)
    half = score(row(0.9, 2.5, 100.0), "latency-mnas", 0.5)
    assert at_target == pytest.approx(0.9)
    assert half == pytest.approx(0.9 * 2 ** -MNAS_EXPONENT)  # halving latency is worth ~5%
    assert score(row(0.9, 10.0, 100.0), "latency-mnas", 0.5) == pytest.approx(0.9 * 2 ** MNAS_EXPONENT)


def test_bad_inputs_are_config_errors():
    with pytest.raises(ConfigError, match="unknown objective 'speed'"):
        score(row(0.9, 1.0, 1.0), "speed", 0.5)
    with pytest.raises(ConfigError, match="target"):
        score(row(0.9, 1.0, 1.0), "latency", -1.0)
    with pytest.raises(ConfigError, match="dense_latency_ms must be > 0"):
        score(row(0.9, 1.0, 1.0, dense_ms=0.0), "latency", 0.5)
