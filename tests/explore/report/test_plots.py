"""Figures: both PNGs written, non-empty, really drawn; one pair per (model, batch) group."""

import matplotlib.image
import pandas as pd
import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.report.plots import plot_accuracy_latency, plot_latency_flops, plot_results
from sparta_explore.explore.sweep import sweep

from ..conftest import GRID


@pytest.fixture
def results(tmp_path, fake_trial):
    return sweep(GRID, tmp_path / "sweep", trial_fn=fake_trial, progress=False)


def _drawn(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] > 400 and pixels.shape[1] > 600
    assert pixels[..., :3].std() > 0.05  # not a blank canvas


def test_both_figures_are_written(results, tmp_path):
    paths = plot_results(results, tmp_path / "figs")
    assert [p.name for p in paths] == ["pareto_accuracy_latency.png", "latency_vs_flops.png"]
    for p in paths:
        _drawn(p)
    assert not list((tmp_path / "figs").glob(".*"))  # no temporary files left behind


def test_one_pair_per_model_and_batch(results, tmp_path):
    other = results.assign(batch=512, latency_ms=results["latency_ms"] * 2)
    paths = plot_results(pd.concat([results, other]), tmp_path)
    assert sorted(p.name for p in paths) == [f"{kind}-digits-mlp-b{b}.png" for kind in
                                             ("latency_vs_flops", "pareto_accuracy_latency") for b in (512, 64)]


def test_bad_tables_are_config_errors(results, tmp_path):
    with pytest.raises(ConfigError, match="no results"):
        plot_accuracy_latency(results.iloc[:0], tmp_path / "a.png")
    with pytest.raises(ConfigError, match="effective_flops"):
        plot_latency_flops(results.drop(columns=["effective_flops"]), tmp_path / "b.png")
