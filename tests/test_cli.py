"""The command line: demo end to end, prune/summary round trip, errors as one line."""

import pytest

from sparta_explore.cli import main
from sparta_explore.tesa_table import TeSATable


def test_demo_prints_summary_and_writes_files(cache_dir, tmp_path, capsys):
    assert main(["demo", "--cache-dir", str(cache_dir), "--out", str(tmp_path), "--finetune-epochs", "1"]) == 0
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
