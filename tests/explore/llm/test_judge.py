"""Fronts kept by each guide's cost, judged on measured latency: hypervolume and speed-up at equal perplexity."""

import math

import pandas as pd
import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.llm.judge import front_hypervolume, guided_front, speedup_at_equal_perplexity

ROWS = pd.DataFrame({
    "key": ["as-given-a32", "as-given-a8", "pruned", "int4-mlp"],
    "perplexity": [15.0, 15.1, 22.0, 15.3],
    "quality": [1.0, 15.0 / 15.1, 15.0 / 22.0, 15.0 / 15.3],
    "latency_ratio": [1.0, 0.85, 1.3, 0.8],
    "flops_ratio": [1.0, 1.0, 0.6, 1.0],
    "bytes_ratio": [1.0, 1.0, 0.55, 0.8],
})


def test_each_guide_keeps_what_its_cost_sees():
    # FLOPs cannot see int8 activations or 4-bit weights: the a32 model as given beats both on its cost
    assert guided_front(ROWS, "flops")["key"].tolist() == ["as-given-a32", "pruned"]
    assert guided_front(ROWS, "latency")["key"].tolist() == ["int4-mlp", "as-given-a8", "as-given-a32"]
    assert guided_front(ROWS, "bytes")["key"].tolist() == ["int4-mlp", "as-given-a32", "pruned"]
    with pytest.raises(ConfigError, match="guide"):
        guided_front(ROWS, "params")


def test_hypervolume_counts_only_what_is_faster_than_the_model_as_given():
    flops = front_hypervolume(guided_front(ROWS, "flops"))
    assert flops == 0.0  # ratio 1.0 and 1.3: nothing inside the reference
    latency = front_hypervolume(guided_front(ROWS, "latency"))
    want = (0.85 - 0.8) * ROWS.quality[3] + (1.0 - 0.85) * ROWS.quality[1]
    assert latency == pytest.approx(want)
    assert front_hypervolume(ROWS.iloc[0:0]) == 0.0


def test_speedup_pairs_each_point_with_our_fastest_within_the_perplexity_tolerance():
    ours, theirs = guided_front(ROWS, "latency"), guided_front(ROWS, "flops")
    best, our_point, their_point = speedup_at_equal_perplexity(ours, theirs)
    assert best == pytest.approx(1.3 / 0.8)  # int4-mlp against the pruned model, far worse in perplexity
    assert our_point["key"] == "int4-mlp" and their_point["key"] == "pruned"
    best_quality = theirs[theirs["key"] == "as-given-a32"]
    assert speedup_at_equal_perplexity(ours, best_quality)[0] == pytest.approx(1.0 / 0.8)  # 15.3 <= 1.02 x 15.0
    strict, _, _ = speedup_at_equal_perplexity(ours, best_quality, tolerance=0.0)
    assert strict == pytest.approx(1.0)  # only a32 itself is at most its perplexity
    none = speedup_at_equal_perplexity(ours, pd.DataFrame({"perplexity": [10.0], "latency_ratio": [1.0]}))
    assert math.isnan(none[0]) and none[1] is None
