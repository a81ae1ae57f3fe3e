"""The `sparta-explore` command line: one registered function per sub-command.

Heavy imports (NNI, scikit-learn) happen inside the commands, so `--help` is instant.

Example:
    $ sparta-explore demo
    $ sparta-explore prune --model digits-mlp --pruner level --sparsity 0.8 --out t.npz
    $ sparta-explore summary t.npz
    $ sparta-explore sweep --sparsity 0.5 0.9 --block 32x32 1x32 --bits 32 8 --out results/sweep
    $ sparta-explore sweep --workload experiments/workloads/bert_digits.py:workload --sparsity 0.9 --out results/bert
    $ sparta-explore plot results/sweep && sparta-explore report results/sweep
    $ sparta-explore cache && sparta-explore cache trim --max-mb 500
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparta_explore.cli_args import (
    OneLineParser,
    bits,
    fraction,
    grid_block,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)
from sparta_explore.cli_cache import cache_arguments
from sparta_explore.cli_options import demo_arguments, prune_arguments
from sparta_explore.errors import SpartaError

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


_COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None] = lambda p: None
            ) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Decorator registering a sub-command."""
    def add(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        _COMMANDS[name] = Command(name, help, add_arguments, run)
        return run
    return add


@command("demo", "prune the digits CNN with NNI and propagate; then sweep, plot and report measured latency",
         demo_arguments)
def _demo(args: argparse.Namespace) -> int:
    from sparta_explore.demo import DemoConfig, run_demo

    cfg = DemoConfig(model=args.model, pruner=args.pruner, sparsity=args.sparsity, block=args.block,
                     exclude=None if args.exclude is None else tuple(args.exclude), quantizer=args.quantizer,
                     bits=args.bits, finetune_epochs=args.finetune_epochs, sweep=args.sweep,
                     sweep_model=args.sweep_model, sweep_sparsity=tuple(args.sweep_sparsity),
                     sweep_blocks=tuple(args.sweep_block), sweep_bits=tuple(args.sweep_bits),
                     sweep_batch=args.sweep_batch, sweep_runs=args.sweep_runs)
    run_demo(cfg, out=args.out, cache_dir=args.cache_dir, echo=print)
    return 0


def _prune_cmd_arguments(p: argparse.ArgumentParser) -> None:
    prune_arguments(p)
    p.add_argument("--out", type=Path, required=True, help="where to write the TeSA table (.npz)")


@command("prune", "prune an embedded model and save its TeSA table", _prune_cmd_arguments)
def _prune(args: argparse.Namespace) -> int:
    from sparta_explore.demo import DemoConfig, run_demo

    cfg = DemoConfig(model=args.model, pruner=args.pruner, sparsity=args.sparsity, block=args.block,
                     exclude=None if args.exclude is None else tuple(args.exclude), quantizer=args.quantizer,
                     bits=args.bits, finetune_epochs=args.finetune_epochs, sweep=False)
    result = run_demo(cfg, out=args.out.parent, cache_dir=args.cache_dir, echo=print)
    result.table.save(args.out)
    print(f"wrote {args.out}")
    return 0


@command("summary", "print the summary of a saved TeSA table",
         lambda p: p.add_argument("table", type=Path, help="a .npz written by `prune` or TeSATable.save"))
def _summary(args: argparse.Namespace) -> int:
    from sparta_explore.tesa_table import TeSATable

    table = TeSATable.load(args.table)
    print(table.summary().to_string(index=False))
    print(f"total sparsity {table.total_sparsity():.3f} over {len(table)} tensors")
    return 0


@command("models", "list the embedded models")
def _models(args: argparse.Namespace) -> int:
    from sparta_explore.zoo import get_spec, model_names

    for name in model_names():
        spec = get_spec(name)
        shape = "x".join(map(str, (spec.default_batch, *spec.input_shape)))
        print(f"{name:20s} {shape:14s} {spec.task or 'latency':8s} {spec.description}")
    return 0


@command("pruners", "list the pruners and quantizers")
def _pruners(args: argparse.Namespace) -> int:
    from sparta_explore.pruners import pruner_names
    from sparta_explore.quantizers import quantizer_names

    print("pruners:    " + ", ".join(pruner_names()))
    print("quantizers: " + ", ".join(quantizer_names()))
    return 0


def _nni_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path,
                   help="experiment YAML to run (experiments/*.yml), or an experiment folder "
                        "(<experimentWorkingDirectory>/<id>) to export without running")
    p.add_argument("--max-trials", type=positive_int, default=None, help="override the config's maxTrialNumber")
    p.add_argument("--concurrency", type=positive_int, default=None, help="override the config's trialConcurrency")
    p.add_argument("--port", type=port, default=None, help="manager and web UI port (default: a free one)")
    p.add_argument("--timeout-min", type=positive_float, default=None,
                   help="stop the experiment after this many minutes")
    p.add_argument("--out", type=Path, default=None,
                   help="results CSV (default: results.csv in the experiment folder)")


@command("nni", "run an NNI experiment (start, wait, stop) and export its trials to a results table",
         _nni_arguments)
def _nni(args: argparse.Namespace) -> int:
    from sparta_explore.explore.nni.experiment import (
        RESULTS_CSV,
        ExperimentRun,
        export_trials,
        run_experiment,
        trial_counts,
    )
    from sparta_explore.explore.sweep import write_csv

    if args.config.is_dir():  # an experiment that already ran (e.g. started by nnictl): export only
        df = export_trials(args.config)
        out = write_csv(df, args.out or args.config / RESULTS_CSV)
        print(f"{args.config.name}: trials {dict(trial_counts(args.config))}, {len(df)} rows -> {out}")
    else:
        run = ExperimentRun(args.config, max_trials=args.max_trials, concurrency=args.concurrency, port=args.port,
                            timeout_s=None if args.timeout_min is None else 60.0 * args.timeout_min)
        df = run_experiment(run, out=args.out).trials
    cols = ["nni_trial", "sparsity", "layer_sparsity", "block", "bits", "scope", "accuracy", "latency_ms",
            "dense_latency_ms", "flops_ratio", "score", "nni_params_matched"]
    print(df[[c for c in cols if c in df.columns]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


def _space_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "--model", dest="workload", default="digits-ffn",
                   help="built-in workload or 'module:attr' / 'file.py:attr'")
    p.add_argument("--families", action="store_true",
                   help="the family space (per-layer sparsity x pattern x precision) instead of the block space")
    p.add_argument("--out", type=Path, default=None, help="write here (e.g. experiments/search_space.json)")


@command("space", "print (or write) a workload's NNI search space", _space_arguments)
def _space(args: argparse.Namespace) -> int:
    from sparta_explore.cache import atomic_write
    from sparta_explore.explore.search.block_space import BlockSpaceConfig, block_search_space, format_search_space
    from sparta_explore.explore.search.family_space import FamilySpaceConfig, family_search_space

    space = (family_search_space(FamilySpaceConfig(workload=args.workload)) if args.families
             else block_search_space(BlockSpaceConfig(workload=args.workload)))
    text = format_search_space(space)
    if args.out is None:
        sys.stdout.write(text)
    else:
        print(f"wrote {atomic_write(args.out, lambda f: f.write(text.encode()))}")
    return 0


def _sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("results/sweep"),
                   help="results folder (rows/, results.csv, figures, report.md); rerunning resumes it")
    p.add_argument("--grid", type=Path, default=None,
                   help="JSON grid (a dict of axes or a list of points); replaces the axis options below")
    p.add_argument("--workload", "--model", dest="workload", default="digits-ffn",
                   help="built-in workload (`sparta-explore models`), or your own as 'package.module:attr' or "
                        "'path/file.py:attr' (a Workload, or a function returning one)")
    p.add_argument("--pruner", nargs="+", default=["block"], help="pruners (block, nm, l1norm, level, ...)")
    p.add_argument("--sparsity", type=fraction, nargs="+", default=[0.5, 0.75, 0.9], help="sparsities")
    p.add_argument("--block", type=grid_block, nargs="+", default=["32x32", "1x32"],
                   help="pruning granularities, e.g. 32x32 1x32 1x1; 'default' = the pruner's own")
    p.add_argument("--bits", type=bits, nargs="+", default=[32, 8], help="32 (fp32) or 2..8 (integer kernels)")
    p.add_argument("--scope", nargs="+", default=["layer"], help="layer and/or global sparsity")
    p.add_argument("--quantizer", default="uniform", help="quantizer for bits < 32")
    p.add_argument("--act-bits", type=bits, nargs="+", default=None,
                   help="inputs' widths (default: as --bits; 32 = weight-only, as gptq needs)")
    p.add_argument("--calibrate", action="store_true", help="lower bits further by distillation calibration")
    p.add_argument("--finetune-epochs", type=non_negative_int, default=1, help="epochs of mask-respecting fine-tuning")
    p.add_argument("--batch", type=positive_int, default=None, help="latency batch (default: the model's)")
    p.add_argument("--objective", default="latency", help="objective scored in each row (latency, flops, ...)")
    p.add_argument("--target", type=positive_float, default=0.5,
                   help="objective target, as a fraction of the dense cost")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--runs", type=positive_int, default=20, help="timed forward calls per latency measurement")
    p.add_argument("--cache-dir", type=Path, default=None, help="trained weights, kernels and device profile")
    p.add_argument("--quick-profile", action="store_true",
                   help="if this machine has no cached device profile, measure the small one (seconds, coarser "
                        "predictions; compile still times every candidate)")
    p.add_argument("--compile-cap", type=positive_float, default=None, metavar="SECONDS",
                   help="cap each trial's compile: past it, ops take the device profile's favourite untimed "
                        "(rows count them in compile_capped)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


@command("sweep", "run a grid of trials (prune, quantize, compile, measure) into a resumable results folder",
         _sweep_arguments)
def _sweep(args: argparse.Namespace) -> int:
    from sparta_explore.explore.sweep import expand_grid, read_grid, sweep
    from sparta_explore.workload import load_workload

    if args.grid is not None:
        grid = read_grid(args.grid)
    else:
        grid = {"workload": args.workload, "pruner": args.pruner, "scope": args.scope, "block": args.block,
                "sparsity": args.sparsity, "bits": args.bits, "quantizer": args.quantizer,
                "calibrate": args.calibrate, "finetune_epochs": args.finetune_epochs, "batch": args.batch,
                "objective": args.objective, "target": args.target, "seed": args.seed}
        if args.act_bits is not None:
            grid["act_bits"] = args.act_bits
    for ref in sorted({p.workload for p in expand_grid(grid)}):  # every point checked before any trial runs
        load_workload(ref, cache_dir=args.cache_dir)  # a workload that does not import fails now, in one line
    kwargs: dict[str, object] = {"cache_dir": args.cache_dir, "runs": args.runs}
    compile_options: dict[str, object] = {}
    if args.compile_cap is not None:
        compile_options["max_seconds"] = args.compile_cap
    if args.quick_profile:
        from sparta_explore.device import DeviceProfile

        compile_options["device"] = DeviceProfile.load_or_measure(quick=True, cache_dir=args.cache_dir)
    if compile_options:
        kwargs["compile_kwargs"] = compile_options
    df = sweep(grid, args.out, progress=not args.no_progress, trial_kwargs=kwargs)
    _print_results(df)
    _plot_and_report(df, args.out)
    return 0


def _print_results(df: pd.DataFrame) -> None:
    cols = ["workload", "pruner", "block", "sparsity", "bits", "metric_name", "accuracy", "latency_ms",
            "dense_latency_ms", "speedup", "flops_ratio", "score"]
    print(df[[c for c in cols if c in df.columns]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def _plot_and_report(df: pd.DataFrame, out: Path) -> None:
    from sparta_explore.explore.report.plots import plot_results
    from sparta_explore.explore.report.sweep_report import write_report

    images = plot_results(df, out)
    report = write_report(df, out / "report.md", images=images)
    print("wrote " + ", ".join(str(p) for p in [out / "results.csv", *images, report]))


def _results_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=Path, help="a sweep folder or a results CSV")


def _plot_arguments(p: argparse.ArgumentParser) -> None:
    _results_argument(p)
    p.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: beside the results)")


def _results_folder(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def _load_trials(path: Path) -> pd.DataFrame:
    from sparta_explore.errors import FileFormatError
    from sparta_explore.explore.sweep import load_results

    df = load_results(path)
    if df.empty:
        raise FileFormatError(f"{path} holds no finished trials: nothing to plot or report")
    return df


@command("plot", "draw accuracy-vs-latency Pareto fronts and latency-vs-FLOPs from a results table", _plot_arguments)
def _plot(args: argparse.Namespace) -> int:
    from sparta_explore.explore.report.plots import plot_results

    for path in plot_results(_load_trials(args.results), args.out or _results_folder(args.results)):
        print(f"wrote {path}")
    return 0


def _report_arguments(p: argparse.ArgumentParser) -> None:
    _results_argument(p)
    p.add_argument("--out", type=Path, default=None, help="markdown file (default: report.md beside the results)")
    p.add_argument("--target", type=positive_float, default=None,
                   help="cost target as a fraction of dense (default: the one the trials ran with)")


@command("report", "write a markdown report (best model per objective, hypervolumes, all trials)",
         _report_arguments)
def _report(args: argparse.Namespace) -> int:
    from sparta_explore.explore.report.plots import ACCURACY_LATENCY_PNG, LATENCY_FLOPS_PNG
    from sparta_explore.explore.report.sweep_report import objective_picks, write_report

    df = _load_trials(args.results)
    out = args.out or _results_folder(args.results) / "report.md"
    images = sorted(p for stem in (ACCURACY_LATENCY_PNG, LATENCY_FLOPS_PNG)
                    for p in out.parent.glob(stem.replace(".png", "*.png")))
    write_report(df, out, target=args.target, images=images)
    target = args.target if args.target is not None else float(df["target"].median())
    picks = objective_picks(df, target)
    print(picks.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"wrote {out}")
    return 0


def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=Path, help="a sweep or protocol folder, an NNI experiment folder or a results CSV")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--trial", help="the trial's key (or a unique prefix of it), NNI trial id or sequence number")
    which.add_argument("--best", action="store_true",
                       help="the most accurate trial within the latency target, else the fastest above the "
                            "accuracy floor, else the highest score")
    p.add_argument("--min-accuracy", type=float, default=None,
                   help="with --best: the metric's floor (a ceiling for a metric to minimize, e.g. perplexity)")
    p.add_argument("--max-latency-ms", type=positive_float, default=None, help="with --best: the latency target")
    p.add_argument("--max-latency-ratio", type=positive_float, default=None,
                   help="with --best: the latency target as a fraction of dense")
    p.add_argument("--out", type=Path, default=None,
                   help="package file to write (default: exported/<key>.sparta beside the results)")
    p.add_argument("--runs", type=positive_int, default=20, help="timed forward calls per latency measurement")
    p.add_argument("--cache-dir", type=Path, default=None, help="trained weights, kernels and device profile")
    p.add_argument("--eval-windows", type=positive_int, default=4,
                   help="an LLM trial: perplexity windows, as its search scored (the search's default: 4)")
    p.add_argument("--calibration-windows", type=positive_int, default=8,
                   help="an LLM trial: calibration windows, as its search compressed with (default: 8)")


@command("export", "rebuild the trial you picked (its seed, its kernels), check its metric, save it as a package",
         _export_arguments)
def _export(args: argparse.Namespace) -> int:
    from sparta_explore.errors import ConfigError
    from sparta_explore.explore.export import export_trial, load_trials, pick_trial

    targets = {"min_accuracy": args.min_accuracy, "max_latency_ms": args.max_latency_ms,
               "max_latency_ratio": args.max_latency_ratio}
    if args.trial is not None and any(v is not None for v in targets.values()):
        raise ConfigError("--min-accuracy / --max-latency-ms / --max-latency-ratio pick the --best trial; "
                          "with --trial they mean nothing")
    row = pick_trial(load_trials(args.results), trial=args.trial, best=args.best, **targets)
    out = args.out or _results_folder(args.results) / "exported" / f"{row['key']}.sparta"
    if "decode_ms" in row.index:  # a row of an LLM trial log
        from sparta_explore.explore.llm.export import export_llm_trial
        from sparta_explore.explore.llm.nni_trial import llm_workload

        workload = llm_workload(str(row["workload"]), eval_windows=args.eval_windows,
                                calibration_windows=args.calibration_windows)
        print("\n".join(export_llm_trial(row.dropna().to_dict(), out, workload, echo=print).lines()))
        return 0
    result = export_trial(row, out, cache_dir=args.cache_dir, runs=args.runs, source=str(args.results), echo=print)
    print("\n".join(result.lines()))
    return 0


@command("cache", "show the cache's folders and sizes; clear it, or trim the kernels to their size cap",
         cache_arguments)
def _cache(args: argparse.Namespace) -> int:
    from sparta_explore.cli_cache import run_cache

    return run_cache(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered sub-command."""
    parser = OneLineParser(prog="sparta-explore", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in _COMMANDS.values():
        cmd.add_arguments(sub.add_parser(cmd.name, help=cmd.help, description=cmd.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `sparta-explore` console script; returns the exit status.

    Example:
        >>> main(["models"])  # doctest: +SKIP
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad argument (2, already said in one line)
        return int(e.code) if isinstance(e.code, int) else 2
    try:
        return _COMMANDS[args.command].run(args)
    except (SpartaError, OSError) as e:  # bad input or an unreadable / unwritable path: one line, status 2
        print(f"sparta-explore {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
