"""Result folders written before the exploration wing moved into folders still load and report the same.

`data/saved/` was written by the code before that change (see its README): a sweep folder,
a protocol folder and an NNI experiment's database, with what that code read back and
rendered from them. The one sentence that changed on purpose is the sweep report's intro,
which named "the held-out test digits" whatever the workload; it is checked on its own.
"""

import io
import shutil
from pathlib import Path

import pandas as pd
import pytest

from sparta_explore.explore.nni.experiment import export_trials
from sparta_explore.explore.protocol.report import render_protocol_report
from sparta_explore.explore.protocol.run import load_protocol
from sparta_explore.explore.report.sweep_report import render_report
from sparta_explore.explore.sweep import load_results

SAVED = Path(__file__).parent / "data" / "saved"
EXPECTED = SAVED / "expected"


@pytest.fixture
def saved(tmp_path):
    """A copy of the saved folders (reading must not change them, but a test never risks the originals)."""
    out = tmp_path / "saved"
    shutil.copytree(SAVED, out)
    return out


def _as_csv(df: pd.DataFrame) -> pd.DataFrame:
    # the expected tables went through CSV: compare what a CSV of today's table reads back as
    return pd.read_csv(io.StringIO(df.to_csv(index=False)))


def _body(report: str) -> str:
    # everything after the intro paragraph (which changed on purpose)
    return report[report.index("\n## "):]


def test_sweep_folder_loads_the_same(saved):
    pd.testing.assert_frame_equal(_as_csv(load_results(saved / "sweep")), pd.read_csv(EXPECTED / "sweep.csv"))


def test_sweep_report_is_the_same_but_its_intro_names_the_metric_and_workload(saved):
    report = render_report(load_results(saved / "sweep"))
    old = (EXPECTED / "sweep_report.md").read_text()
    assert _body(report) == _body(old)
    intro = report[:report.index("\n## ")]
    assert "held-out test digits" not in intro and "accuracy" in intro and "digits-mlp" in intro


def test_protocol_folder_loads_and_reports_the_same(saved):
    pd.testing.assert_frame_equal(_as_csv(load_protocol(saved / "protocol")), pd.read_csv(EXPECTED / "protocol.csv"))
    assert render_protocol_report(saved / "protocol") == (EXPECTED / "protocol_report.md").read_text()


def test_nni_experiment_exports_and_reports_the_same(saved):
    trials = export_trials(saved / "nni" / "hc2yfs3t")
    # results from before the metric's direction was recorded read as accuracies: higher is better, quality = it
    assert trials["higher_is_better"].tolist() == [True] * len(trials)
    assert trials["quality"].tolist() == trials["accuracy"].tolist()
    pd.testing.assert_frame_equal(_as_csv(trials.drop(columns=["higher_is_better", "quality"])),
                                  pd.read_csv(EXPECTED / "nni.csv"))
    csv = saved / "nni.csv"
    trials.to_csv(csv, index=False)
    assert _body(render_report(load_results(csv))) == _body((EXPECTED / "nni_report.md").read_text())


def test_saved_folders_are_untouched_by_reading(saved):
    before = sorted(p.relative_to(saved) for p in saved.rglob("*"))
    load_results(saved / "sweep")
    load_protocol(saved / "protocol")
    assert sorted(p.relative_to(saved) for p in saved.rglob("*")) == before
