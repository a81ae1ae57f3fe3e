"""The command line: demo end to end, prune/summary round trip, sweep/plot/report, errors as one line."""

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparta_explore.cli import build_parser, main
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
    assert main(["prune", "--block", "3y", "--out", "x.npz"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --block: must look like 32x32, got '3y'" in err[0]


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
    assert main([name, "--help"]) == 0
    assert "usage: sparta-explore " + name in capsys.readouterr().out


def test_sweep_resumes_then_plot_and_report(cache_dir, device, tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", "--model", "digits-mlp", "--sparsity", "0.75", "--block", "32x32", "--bits", "32",
            "--batch", "64", "--runs", "3", "--finetune-epochs", "0", "--cache-dir", str(cache_dir),
            "--quick-profile", "--compile-cap", "60", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    assert pd.read_csv(out / "results.csv")["compile_capped"].tolist() == [0]  # a minute is plenty: nothing capped
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


def test_the_llm_compressors_run_from_the_command_line_and_the_pick_exports(cache_dir, device, tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "llm"
    assert main(["sweep", "--workload", "smollm2-tiny", "--pruner", "sparsegpt", "--sparsity", "0.5", "--block",
                 "none", "--bits", "4", "--act-bits", "32", "--quantizer", "gptq", "--finetune-epochs", "0",
                 "--runs", "3", "--cache-dir", str(cache_dir), "--quick-profile", "--out", str(out),
                 "--no-progress"]) == 0
    rows = pd.read_csv(out / "results.csv")
    assert rows["bits"].tolist() == [4] and set(rows["metric_name"]) == {"perplexity"}
    assert "lower-is-better" in (out / "report.md").read_text()
    worst = float(rows["accuracy"].max())
    capsys.readouterr()
    assert main(["export", str(out), "--best", "--min-accuracy", str(worst), "--runs", "3", "--cache-dir",
                 str(cache_dir), "--out", str(tmp_path / "pick.sparta")]) == 0
    assert "perplexity" in capsys.readouterr().out and (tmp_path / "pick.sparta").is_file()


def test_plot_and_report_of_missing_results_are_one_line(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nothing")]) == 2
    assert "no results at" in capsys.readouterr().err
    assert main(["sweep", "--sparsity", "1.5", "--out", str(tmp_path)]) == 2
    assert "argument --sparsity: must be a number in [0, 1)" in capsys.readouterr().err


def _one_line_error(capsys, argv, *needles):
    assert main(argv) == 2, argv
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize("argv, needles", [
    (["sweep", "--runs", "0"], ["argument --runs", "must be >= 1, got 0"]),
    (["sweep", "--sparsity", "1.5"], ["argument --sparsity"]),
    (["sweep", "--bits", "12"], ["argument --bits", "2..8"]),
    (["sweep", "--batch", "-3"], ["argument --batch"]),
    (["sweep", "--target", "nan"], ["argument --target", "finite"]),
    (["demo", "--sweep-runs", "0"], ["argument --sweep-runs"]),
    (["nni", "experiments/latency_guided.yml", "--port", "99999"], ["argument --port", "1..65535"]),
    (["nni", "experiments/latency_guided.yml", "--max-trials", "0"], ["argument --max-trials"]),
    (["nni", "experiments/latency_guided.yml", "--timeout-min", "-1"], ["argument --timeout-min"]),
    (["report", "x.csv", "--target", "0"], ["argument --target"]),
    (["frobnicate"], ["argument COMMAND"]),
])
def test_bad_arguments_fail_before_any_work_in_one_line(capsys, argv, needles):
    _one_line_error(capsys, argv, *needles)


def _write(path, content: bytes):
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize("command, content, needle", [
    ("summary", b"PK\x03\x04 truncated", "is not a readable TeSA table"),
    ("summary", b"", "the file is empty"),
    ("nni", b"\x00\x01\xff\xfe", "not UTF-8"),
    ("nni", b"", "expected a mapping of fields, got nothing"),
    ("nni", b"a: [1, 2\n", "is not valid YAML: line 2"),
    ("nni", b"- 1\n- 2\n", "expected a mapping of fields, got list"),
    ("nni", b"name: x\nfoo: 1\n", "is not a valid NNI experiment config"),
    ("plot", b"a,b\n1,2\n", "no column"),
    ("plot", b"\xff\xfe\x00", "is not a results CSV"),
    ("report", b"a,b\n1,2\n", "no column"),
])
def test_bad_files_are_one_line_naming_the_file(tmp_path, capsys, command, content, needle):
    name = {"summary": "t.npz", "nni": "exp.yml", "plot": "r.csv", "report": "r.csv"}[command]
    path = _write(tmp_path / name, content)
    _one_line_error(capsys, [command, path], name, needle)


def test_bad_grid_file_is_refused_before_any_trial(tmp_path, capsys):
    _one_line_error(capsys, ["sweep", "--grid", _write(tmp_path / "g.json", b"{oops"), "--out", str(tmp_path / "s")],
                    "g.json", "not a JSON grid")
    _one_line_error(capsys, ["sweep", "--grid", _write(tmp_path / "g.json", b'{"sparsity": [2.0]}'),
                             "--out", str(tmp_path / "s")], "g.json", "sparsity")
    assert not (tmp_path / "s" / "rows").exists() or not list((tmp_path / "s" / "rows").iterdir())


def test_an_empty_results_folder_says_so(tmp_path, capsys):
    (tmp_path / "rows").mkdir()
    _one_line_error(capsys, ["plot", str(tmp_path)], "no finished trials")


@settings(max_examples=200, deadline=None)
@given(option=st.sampled_from(["--runs", "--sparsity", "--bits", "--batch", "--target", "--seed", "--finetune-epochs",
                               "--block"]),
       value=st.one_of(st.text(max_size=8), st.integers(-10**6, 10**6).map(str),
                       st.floats(allow_nan=True, allow_infinity=True).map(str)))
def test_fuzzed_option_values_parse_or_fail_in_one_line(option, value):
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = build_parser().parse_args(["sweep", option, value])
        except SystemExit as e:
            assert e.code == 2
            lines = err.getvalue().strip().splitlines()
            assert len(lines) == 1 and f"argument {option}" in lines[0] or "expected one argument" in lines[0]
            return
    parsed = getattr(args, option.lstrip("-").replace("-", "_"))
    parsed = parsed[0] if isinstance(parsed, list) else parsed
    checks = {"--runs": lambda v: v >= 1, "--batch": lambda v: v >= 1, "--seed": lambda v: v >= 0,
              "--finetune-epochs": lambda v: v >= 0, "--sparsity": lambda v: 0 <= v < 1,
              "--bits": lambda v: v == 32 or 2 <= v <= 8, "--target": lambda v: 0 < v < float("inf"),
              "--block": lambda v: v is None or all(int(s) >= 1 for s in v.split("x"))}
    assert checks[option](parsed), (option, value, parsed)


def test_space_prints_and_writes_the_search_spaces(tmp_path, capsys):
    # the command that regenerates experiments/search_space*.json (it was a main() inside the library module)
    from sparta_explore.explore.search.block_space import BlockSpaceConfig, block_search_space, format_search_space
    from sparta_explore.explore.search.family_space import FamilySpaceConfig, family_search_space

    assert main(["space", "--workload", "digits-mlp"]) == 0
    assert capsys.readouterr().out == format_search_space(block_search_space(BlockSpaceConfig(workload="digits-mlp")))
    out = tmp_path / "families.json"
    assert main(["space", "--workload", "digits-mlp", "--families", "--out", str(out)]) == 0
    assert out.read_text() == format_search_space(family_search_space(FamilySpaceConfig(workload="digits-mlp")))
    assert main(["space", "--workload", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err
