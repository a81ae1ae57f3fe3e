"""Judging searches on measured latency: kept fronts, picks, speedup at equal accuracy, goals, machines."""

import math

import pandas as pd
import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.protocol.judge import goal_checks, judge, reference
from sparta_explore.explore.protocol.report import summary_table


def visits(search, seed, rows):
    return [{"seed": seed, "search": search, "key": f"{search}{seed}{i}", "dense_accuracy": 0.98,
             "machine": "m1", "pruner": "block", "block": "32x32", "bits": 32, "act_bits": None,
             "layer_sparsity": "", "sparsity": 0.5, **r} for i, r in enumerate(rows)]


# the FLOPs-guided search keeps a trial FLOPs call cheap but that measures slow; the latency-guided one
# finds a trial as accurate that really is fast
FLOPS_ROWS = [{"accuracy": 0.96, "flops_ratio": 0.1, "latency_ratio": 0.8},
              {"accuracy": 0.90, "flops_ratio": 0.3, "latency_ratio": 0.5}]
LATENCY_ROWS = [{"accuracy": 0.957, "flops_ratio": 0.3, "latency_ratio": 0.2},
                {"accuracy": 0.97, "flops_ratio": 0.5, "latency_ratio": 0.6}]


def frame(seeds=(0, 1)):
    out = []
    for s in seeds:
        out += visits("flops", s, FLOPS_ROWS) + visits("latency", s, LATENCY_ROWS)
    return pd.DataFrame(out)


def test_hypervolume_pick_and_speedup_on_measured_latency():
    j = judge(frame(), target=0.3).set_index(["seed", "search"])
    ref = reference(frame())
    assert ref == (1.0, 0.88)
    lat, flo = j.loc[(0, "latency")], j.loc[(0, "flops")]
    # latency front: (0.2, 0.957) and (0.6, 0.97): area 0.4 * 0.077 + 0.4 * 0.09
    assert lat["hypervolume"] == pytest.approx(0.4 * 0.077 + 0.4 * 0.09)
    # FLOPs-guided keeps only the 0.1-FLOPs trial (it dominates on FLOPs), measured at 0.8
    assert flo["front_size"] == 1 and flo["hypervolume"] == pytest.approx(0.2 * 0.08)
    # its pick: FLOPs 0.1 <= 0.3 predicted, measured 0.8: misses the target
    assert (flo["pick_predicted"], flo["pick_latency"], bool(flo["pick_meets_target"])) == (0.1, 0.8, False)
    assert (lat["pick_accuracy"], bool(lat["pick_meets_target"])) == (0.957, True)
    # equal accuracy: 0.957 is within half a point of 0.96, and 4x faster
    assert lat["speedup_vs_flops_pick"] == pytest.approx(0.8 / 0.2)


def test_goals_hold_only_when_every_seed_holds():
    j = judge(frame(), target=0.3)
    assert [met for _, met, _ in goal_checks(j)] == [True, True]
    worse = frame((0, 1))
    worse.loc[(worse["seed"] == 1) & (worse["search"] == "latency"), "latency_ratio"] = 0.95
    checks = goal_checks(judge(worse, target=0.3))
    assert [met for _, met, _ in checks] == [False, False] and "(1 of 2)" in checks[0][0]


def test_a_search_without_any_pick_reports_none():
    df = frame((0,))
    df.loc[df["search"] == "latency", "latency_ratio"] = 0.9
    row = judge(df, target=0.3).set_index("search").loc["latency"]
    assert math.isnan(row["pick_accuracy"]) and not row["pick_meets_target"]


def test_a_model_at_chance_accuracy_is_never_a_pick():
    df = frame((0,))
    df.loc[df["search"] == "latency", "accuracy"] = [0.10, 0.97]  # the fast one is useless, below the reference
    row = judge(df, target=0.3).set_index("search").loc["latency"]
    assert math.isnan(row["pick_accuracy"]) and row["pick_label"] == ""


def test_rows_from_two_machines_are_refused():
    df = frame((0,))
    df.loc[0, "machine"] = "m2"
    with pytest.raises(ConfigError, match="measured on 2 machines"):
        judge(df, target=0.3)


def test_summary_cells_are_mean_sd_and_range_over_seeds():
    j = judge(frame(), target=0.3)
    table = summary_table(j).set_index("search")
    assert table.loc["latency", "speedup vs FLOPs pick"] == "4 +- 0 [4, 4]"


def test_the_report_says_where_each_search_spent_its_budget_and_where_flops_mislead():
    from sparta_explore.explore.protocol.report import budget_table, family_table

    df = frame((0,))
    df["step"] = [0, 8] * 2
    df.loc[df["search"] == "latency", "bits"] = 8
    spent = budget_table(df, startup=8).set_index("search")
    assert spent.loc["latency", "int kernels"] == "100%" and spent.loc["flops", "int kernels"] == "0%"
    table = family_table(df).set_index("family")
    # the FLOPs-guided trials are fp32 32x32 here: measured 0.8 and 0.5 against FLOPs 0.1 and 0.3
    assert table.loc["32x32 fp32", "latency / FLOPs"] == pytest.approx(0.65 / 0.2, rel=0.01)
