"""A metric as a quality: one direction (up) for accuracies and perplexities alike."""

import math

import pandas as pd
import pytest

from sparta_explore.explore.trial.objectives import objective_names, score
from sparta_explore.quality import as_bool, quality, quality_column, row_quality


def test_a_lower_is_better_metric_becomes_the_dense_value_over_it():
    assert quality(0.9) == 0.9
    assert quality(14.8, higher_is_better=False, reference=14.8) == 1.0
    assert quality(29.6, higher_is_better=False, reference=14.8) == 0.5
    assert quality(4.0, higher_is_better=False) == 0.25  # no reference: 1 / metric
    assert quality(0.0, higher_is_better=False) == math.inf  # a loss of 0 is perfect
    assert math.isnan(quality(math.nan, higher_is_better=False, reference=2.0))


@pytest.mark.parametrize("pair", [(15.0, 16.0), (20.0, 40.0), (1.5, 1.6)])
def test_quality_orders_perplexities_the_other_way_round(pair):
    better, worse = pair
    assert quality(better, False, 15.0) > quality(worse, False, 15.0)


def test_rows_read_back_from_files_get_their_quality():
    rows = pd.DataFrame({"accuracy": [0.9, 30.0, 20.0], "higher_is_better": [float("nan"), "False", False],
                         "dense_accuracy": [0.95, 15.0, 15.0], "quality": [None, None, 0.7]})
    assert quality_column(rows).tolist() == [0.9, 0.5, 0.7]  # a quality given stays
    assert math.isnan(row_quality({"latency_ms": 1.0}))
    assert (as_bool("false"), as_bool("True"), as_bool(None, default=False)) == (False, True, False)


@pytest.mark.parametrize("objective", objective_names())
def test_every_objective_prefers_the_lower_perplexity_at_equal_cost(objective):
    base = {"higher_is_better": False, "dense_accuracy": 15.0, "latency_ms": 4.0, "dense_latency_ms": 10.0,
            "effective_flops": 4e6, "dense_flops": 1e7}
    for target in (0.2, 0.5, 1.0):  # under and over the target
        assert score({**base, "accuracy": 16.0}, objective, target) > score({**base, "accuracy": 18.0}, objective,
                                                                            target)
