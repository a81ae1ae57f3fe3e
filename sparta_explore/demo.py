"""The demo job: an embedded model pruned through NNI and propagated; then a small measured sweep.

This is what `make demo` runs. Part one: the digits CNN pruned by NNI's L1NormPruner,
propagated and fine-tuned (`tesa.npz`, `summary.csv`). Part two (`sweep=True`): a handful
of trials on the exploration default, digits-ffn (BERT-base FFN shapes, latency batch 256),
over sparsity x block pattern x bits, each compiled and timed against dense PyTorch on this
machine; writes `results.csv` (resumable: a rerun skips finished trials), the Pareto PNGs and
`report.md` into the same folder.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sparta_explore.errors import ConfigError
from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.graph import Graph
from sparta_explore.tesa_table import TeSATable


@dataclass(frozen=True)
class DemoConfig:
    """What the demo prunes and how; `exclude=None` leaves the classifier head dense.

    BatchNorm channels after pruned filters are pruned too (`prune_dependent_norms`), so
    propagation carries the pruning into the next layer.

    Example:
        >>> DemoConfig(pruner="level", sparsity=0.8).model
        'digits-cnn'
    """

    model: str = "digits-cnn"
    pruner: str = "l1norm"
    sparsity: float = 0.5
    block: tuple[int, int] = (32, 32)
    exclude: tuple[str, ...] | None = None
    quantizer: str | None = None
    bits: int = 8
    finetune_epochs: int = 3
    sweep: bool = True
    sweep_model: str = "digits-ffn"
    sweep_sparsity: tuple[float, ...] = (0.5, 0.9)
    sweep_blocks: tuple[str | None, ...] = ("32x32", "1x1")
    sweep_bits: tuple[int, ...] = (32, 8)
    sweep_batch: int | None = None
    sweep_runs: int = 20
    sweep_finetune_epochs: int = 1

    def __post_init__(self) -> None:
        if not 0.0 <= self.sparsity < 1.0:
            raise ConfigError(f"sparsity must be in [0, 1), got {self.sparsity}")
        if self.finetune_epochs < 0:
            raise ConfigError(f"finetune_epochs must be >= 0, got {self.finetune_epochs}")
        if self.sweep_runs < 1:
            raise ConfigError(f"sweep_runs must be >= 1, got {self.sweep_runs}")
        for key in ("sweep_sparsity", "sweep_blocks", "sweep_bits"):
            if not getattr(self, key):
                raise ConfigError(f"{key} needs at least one value")

    def sweep_grid(self) -> dict[str, object]:
        """The demo sweep's grid: sparsity x block pattern x bits on `sweep_model` (block pruner).

        Example:
            >>> DemoConfig().sweep_grid()["block"]
            ['32x32', '1x1']
        """
        return {"workload": self.sweep_model, "pruner": "block", "block": list(self.sweep_blocks),
                "sparsity": list(self.sweep_sparsity), "bits": list(self.sweep_bits), "batch": self.sweep_batch,
                "finetune_epochs": self.sweep_finetune_epochs}


@dataclass
class DemoResult:
    """The demo's outputs: the graph, the TeSA table, the accuracies it measured, the sweep's rows.

    Example:
        >>> run_demo(DemoConfig(sweep=False)).table.total_sparsity()  # doctest: +SKIP
        0.55
    """

    graph: Graph
    table: TeSATable
    dense_accuracy: float
    masked_accuracy: float
    finetuned_accuracy: float | None
    seconds: float
    sweep: pd.DataFrame | None = None


def _trial_params(cfg: DemoConfig) -> TrialParams:
    from sparta_explore.pruners import get_pruner

    shaped = get_pruner(cfg.pruner).name in ("block", "nm")  # NNI pruners: their own granularity
    return TrialParams(workload=cfg.model, pruner=cfg.pruner, sparsity=cfg.sparsity,
                       block=cfg.block if shaped else None, bits=cfg.bits if cfg.quantizer else 32,
                       quantizer=cfg.quantizer or "uniform", finetune_epochs=cfg.finetune_epochs)


def run_demo(cfg: DemoConfig = DemoConfig(), *, out: str | os.PathLike | None = "results/demo",
             cache_dir: str | os.PathLike | None = None, echo: Callable[[str], None] = print) -> DemoResult:
    """Load (or train) `cfg.model`, prune it, optionally quantize, propagate, fine-tune, and report the TeSAs.

    The first two stages of a trial (`explore.trial.stages`: compress, finetune) on the model's
    built-in workload. Writes `tesa.npz` and `summary.csv` into `out` (unless None), then,
    with `cfg.sweep`, runs the sweep there (`results.csv`, `rows/`, the PNGs and `report.md`).

    Example:
        >>> result = run_demo(DemoConfig(pruner="level", sparsity=0.8))  # doctest: +SKIP
    """
    from sparta_explore.explore.trial.stages import TrialSetup, compress, finetune, weight_stats
    from sparta_explore.prunable import is_prunable
    from sparta_explore.workload import load_workload
    from sparta_explore.zoo import get_spec

    start = time.perf_counter()
    params = _trial_params(cfg)
    if get_spec(cfg.model).task != "digits":
        raise ConfigError(f"demo model {cfg.model!r} must train on the digits (see `sparta-explore models`)")
    workload = load_workload(cfg.model, cache_dir=cache_dir)
    if cfg.exclude is not None:
        keep = tuple(n for n in workload.prunable_modules() if n not in cfg.exclude)
        workload = dataclasses.replace(workload, prunable=keep, _built=workload._built)
    setup = TrialSetup.start(params, workload=workload, cache_dir=cache_dir, echo=echo)
    dense_acc = workload.evaluate(workload.dense_model())
    echo(f"model {cfg.model}: test accuracy {dense_acc:.4f} on the held-out digits")
    weighted = {n for n, m in workload.dense_model().named_modules() if n and is_prunable(m)}
    left = sorted(weighted - set(workload.prunable_modules()))
    echo(f"pruning with {cfg.pruner} (sparsity {cfg.sparsity}"
         + (f", quantized by {cfg.quantizer} to {cfg.bits} bits" if cfg.quantizer else "")
         + f"); left dense: {', '.join(left) or 'nothing'}")
    compressed = compress(setup)
    tuned = finetune(setup, compressed)
    graph, table, propagated = setup.graph, compressed.table, compressed.propagation
    compare = propagated.compare()
    summary = compare[[graph.tensors[n].kind == "param" or propagated.table[n].kept_bits() != [32]
                       or propagated.table[n].sparsity > 0 for n in compare["name"]]]
    echo("")
    echo(summary.to_string(index=False))
    echo("")
    weights = setup.weights()
    before, _, _ = weight_stats(table, weights)
    after, _, _ = weight_stats(propagated.table, weights)
    echo(f"weights pruned: {before:.1%} by the pruner, {after:.1%} after propagation "
         f"({propagated.report.visits} rule visits, {propagated.report.seconds:.2f} s; self-check "
         f"{'passed' if propagated.check.passed else 'reverted ' + str(len(propagated.check.reverted))})")
    masked_acc, tuned_acc = tuned.masked_metric, tuned.metric
    echo(f"test accuracy: dense {dense_acc:.4f}, masked {masked_acc:.4f}"
         + (f", masked + {cfg.finetune_epochs} epochs fine-tuning {tuned_acc:.4f}" if cfg.finetune_epochs else ""))
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        propagated.table.save(out / "tesa.npz")
        compare.to_csv(out / "summary.csv", index=False)
        echo(f"wrote {out / 'tesa.npz'} and {out / 'summary.csv'}")
    rows = run_demo_sweep(cfg, out, cache_dir=cache_dir, echo=echo) if cfg.sweep and out is not None else None
    return DemoResult(graph, propagated.table, dense_acc, masked_acc,
                      tuned_acc if cfg.finetune_epochs else None, time.perf_counter() - start, rows)


def run_demo_sweep(cfg: DemoConfig, out: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
                   echo: Callable[[str], None] = print,
                   compile_kwargs: Mapping[str, object] | None = None) -> pd.DataFrame:
    """The demo's second part: sweep `cfg.sweep_grid()` into `out`, then draw the fronts and write the report.

    `compile_kwargs` go to every trial's `compile` (e.g. a `device` profile).

    Example:
        >>> rows = run_demo_sweep(DemoConfig(), "results/demo")  # doctest: +SKIP
    """
    from sparta_explore.explore.report.plots import plot_results
    from sparta_explore.explore.report.sweep_report import objective_picks, write_report
    from sparta_explore.explore.sweep import RESULTS_CSV, expand_grid, sweep

    out = Path(out)
    start = time.perf_counter()
    points = expand_grid(cfg.sweep_grid())
    echo("")
    echo(f"sweep: {len(points)} trials on {cfg.sweep_model} (sparsity {list(cfg.sweep_sparsity)} x block "
         f"{list(cfg.sweep_blocks)} x bits {list(cfg.sweep_bits)}), each compiled and timed against dense PyTorch")
    rows = sweep(points, out, trial_kwargs={"cache_dir": cache_dir, "runs": cfg.sweep_runs,
                                            "compile_kwargs": dict(compile_kwargs or {})})
    cols = ["block", "sparsity", "bits", "accuracy", "latency_ms", "dense_latency_ms", "speedup", "flops_ratio"]
    echo(rows[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    images = plot_results(rows, out)
    report = write_report(rows, out / "report.md", images=images)
    picks = objective_picks(rows, float(rows["target"].median())).set_index("objective")
    for name in ("latency", "flops"):
        p = picks.loc[name]
        echo(f"{name}-guided pick at {rows['target'].median():g} x dense: {p['pattern']} sparsity {p['sparsity']:g} "
             f"{int(p['bits'])} bits, accuracy {p['accuracy']:.4f}, {p['latency_ms']:.2f} ms "
             f"({p['latency_ratio']:.2f} x dense)")
    echo(f"sweep took {time.perf_counter() - start:.0f} s; wrote {out / RESULTS_CSV}, "
         + ", ".join(str(p) for p in images) + f", {report}")
    return rows
