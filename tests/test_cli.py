"""The command line: demo end to end, prune/summary round trip, sweep/plot/report, errors as one line."""

import pandas as pd
import pytest

from sparta_explore.cli import main
from sparta_explore.tesa_table import TeSATable


def test_demo_prints_summary_and_writes_files(cache_dir, tmp_path, capsys):
    assert main(["demo", "--cache-dir", str(cache_dir), "--out", str(tmp_path), "--finetune-epochs", "1",
                 "--no-sweep"]) == 0  # the sweep part: test_demo_sweep_writes_table_plots_and_report
    out = capsys.readouterr().out
    assert "conv2.weight" in out and "sparsity" in out and "l1norm" in out
    assert "test accuracy: dense" in out
    assert "left dense: fc2" in out and "after propagation" in out
    table = TeSATable.load(tmp_path / "tesa.npz")  # the propagated table
    # the pruner took half of conv2's filters; propagation also took the inputs of conv1's pruned filters
    assert table["conv2.weight"].sparsity > 0.6
    assert table["fc2.bias"].sparsity == 0.0  # the classifier head itself was not pruned
    assert (tmp_path / "summary.csv").read_text().startswith("name,shape,numel,sparsity_before,sparsity_after")


def test_prune_then_summary(cache_dir, tmp_path, capsys):
    path = tmp_path / "t.npz"
    assert main(["prune", "--model", "digits-mlp", "--pruner", "block", "--block", "1x32", "--sparsity", "0.75",
                 "--quantizer", "uniform", "--finetune-epochs", "0", "--cache-dir", str(cache_dir),
                 "--out", str(path)]) == 0
    capsys.readouterr()
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "layers.0.weight" in out and "int" in out
    assert TeSATable.load(path)["layers.0.weight"].block_density((1, 32)) == pytest.approx(0.25)


def test_bad_input_is_one_clear_line(cache_dir, capsys):
    assert main(["demo", "--pruner", "magic", "--cache-dir", str(cache_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown pruner 'magic'" in err[0]
    assert main(["demo", "--quantizer", "fp8", "--cache-dir", str(cache_dir)]) == 2
    assert "unknown quantizer 'fp8'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["prune", "--block", "3y", "--out", "x.npz"])


def test_listing_commands(capsys):
    assert main(["models"]) == 0 and "bert-base" in capsys.readouterr().out
    assert main(["pruners"]) == 0
    out = capsys.readouterr().out
    assert "l1norm" in out and "dorefa" in out


def test_demo_sweep_writes_table_plots_and_report(cache_dir, device, tmp_path):
    from sparta_explore.demo import DemoConfig, run_demo_sweep

    cfg = DemoConfig(sweep_model="digits-mlp", sweep_sparsity=(0.75,), sweep_blocks=("32x32",), sweep_bits=(32, 8),
                     sweep_batch=64, sweep_runs=3, sweep_finetune_epochs=0)
    lines = []
    rows = run_demo_sweep(cfg, tmp_path, cache_dir=cache_dir, echo=lines.append,
                          compile_kwargs={"device": device, "tune": False})
    assert len(rows) == 2 and len(pd.read_csv(tmp_path / "results.csv")) == 2
    for png in ("pareto_accuracy_latency.png", "latency_vs_flops.png"):
        assert (tmp_path / png).stat().st_size > 20_000
    report = (tmp_path / "report.md").read_text()
    assert "### Best trial per objective" in report and "](pareto_accuracy_latency.png)" in report
    assert any("latency-guided pick" in line for line in lines) and any("flops-guided pick" in line for line in lines)


@pytest.mark.parametrize("name", ["sweep", "plot", "report", "demo"])
def test_new_commands_have_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0 and "usage: sparta-explore " + name in capsys.readouterr().out


def test_sweep_resumes_then_plot_and_report(cache_dir, device, tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", "--model", "digits-mlp", "--sparsity", "0.75", "--block", "32x32", "--bits", "32",
            "--batch", "64", "--runs", "3", "--finetune-epochs", "0", "--cache-dir", str(cache_dir),
            "--quick-profile", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    (row_file,) = (out / "rows").glob("*.json")
    stamp = row_file.stat().st_mtime_ns
    assert main(argv) == 0  # resumed: nothing left to run, the row is not rewritten
    assert row_file.stat().st_mtime_ns == stamp and len(pd.read_csv(out / "results.csv")) == 1
    for png in ("pareto_accuracy_latency.png", "latency_vs_flops.png"):
        (out / png).unlink()
    capsys.readouterr()
    assert main(["plot", str(out / "results.csv")]) == 0
    assert (out / "latency_vs_flops.png").stat().st_size > 20_000 and "wrote" in capsys.readouterr().out
    assert main(["report", str(out), "--out", str(tmp_path / "r.md"), "--target", "0.9"]) == 0
    assert "flops-mnas" in capsys.readouterr().out
    assert "0.9 x the dense cost" in (tmp_path / "r.md").read_text()


def test_plot_and_report_of_missing_results_are_one_line(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nothing")]) == 2
    assert "no results at" in capsys.readouterr().err
    assert main(["sweep", "--sparsity", "1.5", "--out", str(tmp_path)]) == 2
    assert "sparsity must be in [0, 1)" in capsys.readouterr().err
