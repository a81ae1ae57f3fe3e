"""The markdown report: picks per objective judged on measured latency, hypervolumes, every trial."""

import pandas as pd
import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.report.pareto import front_hypervolume
from sparta_explore.explore.report.sweep_report import (
    BENCHMARK_PAGES,
    markdown_table,
    objective_picks,
    render_report,
    write_report,
)
from sparta_explore.explore.sweep import sweep
from sparta_explore.explore.trial.objectives import objective_names

from ..conftest import GRID


@pytest.fixture
def results(tmp_path, fake_trial):
    return sweep(GRID, tmp_path / "sweep", trial_fn=fake_trial, progress=False)


def test_flops_guided_pick_can_miss_the_latency_target(results):
    picks = objective_picks(results, 0.5).set_index("objective")
    assert set(picks.index) == set(objective_names())
    lat, flo = picks.loc["latency"], picks.loc["flops"]
    # in the synthetic data unstructured sparsity cuts FLOPs but not time: FLOPs pick it anyway
    assert lat["meets_latency_target"] and lat["latency_ratio"] <= 0.5
    assert flo["flops_ratio"] <= 0.5 and flo["latency_ms"] > lat["latency_ms"]
    best_feasible = results[results["latency_ms"] <= 0.5 * results["dense_latency_ms"]]["accuracy"].max()
    assert lat["accuracy"] == pytest.approx(best_feasible)


def test_report_has_every_section_and_the_numbers(results):
    text = render_report(results, images=["pareto_accuracy_latency.png", "latency_vs_flops.png"])
    for heading in ("## digits-mlp, latency batch 64", "### Best trial per objective", "### Pareto fronts",
                    "### Where FLOPs mislead", "### Figures", "### All trials"):
        assert heading in text
    assert f"{front_hypervolume(results, 'latency'):.4g}" in text
    assert f"{front_hypervolume(results, 'flops'):.4g}" in text
    assert "![pareto_accuracy_latency](pareto_accuracy_latency.png)" in text
    trials = text.split("### All trials")[1]
    assert trials.count("\n| block") == len(results)


def test_write_report_links_images_relative_to_it(results, tmp_path):
    (tmp_path / "out" / "figs").mkdir(parents=True)
    path = write_report(results, tmp_path / "out" / "report.md", images=[tmp_path / "out" / "figs" / "a.png"])
    assert "](figs/a.png)" in path.read_text()


def test_report_names_where_the_benchmark_pages_live(results, tmp_path):
    text = write_report(results, tmp_path / "report.md").read_text()
    assert BENCHMARK_PAGES in text.splitlines()  # one line of its own, a repository path, not a URL
    assert "docs/benchmarks/" in BENCHMARK_PAGES and "benchmarks/README.md" in BENCHMARK_PAGES
    assert "://" not in BENCHMARK_PAGES


def test_markdown_table_escapes_pipes_and_blanks_nan():
    text = markdown_table(pd.DataFrame({"a": ["x|y"], "b": [float("nan")]}))
    assert text.splitlines()[2] == "| x\\|y |  |"


def test_empty_results_are_an_error():
    with pytest.raises(ConfigError, match="no results"):
        render_report(pd.DataFrame())


def test_report_names_the_workloads_own_metric_not_the_digits(results):
    # a user's workload scored by its own metric on its own data: the report must not speak of digits
    theirs = results.assign(workload="my-bert", metric_name="f1")
    text = render_report(theirs)
    intro = text[:text.index("\n## ")]
    assert "digits" not in intro and "f1" in intro and "my-bert" in intro
    assert "### Pareto fronts (f1 vs measured latency)" in text and "accuracy" not in text.split("### Best")[0]
