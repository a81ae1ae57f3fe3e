"""The demo job: an embedded model, pruned (and optionally quantized) through NNI, as TeSAs.

This is what `make demo` runs on the embedded default (the digits CNN with NNI's
L1NormPruner). Later stages (propagation, plan, compile, measure) extend it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.graph import Graph, capture
from sparta_explore.masking import apply_table, masked_copy
from sparta_explore.propagation import run_propagation
from sparta_explore.tesa_table import TeSATable


@dataclass(frozen=True)
class DemoConfig:
    """What the demo prunes and how; `exclude=None` leaves the classifier head dense.

    `dependent_norms` also prunes the BatchNorm channels after pruned filters, so
    propagation can carry the pruning into the next layer.

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
    training_steps: int = 20
    finetune_epochs: int = 3
    dependent_norms: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.sparsity < 1.0:
            raise ConfigError(f"sparsity must be in [0, 1), got {self.sparsity}")
        if self.finetune_epochs < 0:
            raise ConfigError(f"finetune_epochs must be >= 0, got {self.finetune_epochs}")


@dataclass
class DemoResult:
    """The demo's outputs: the graph, the TeSA table and the accuracies it measured."""

    graph: Graph
    table: TeSATable
    dense_accuracy: float
    masked_accuracy: float
    finetuned_accuracy: float | None
    seconds: float


def classifier_head(model: nn.Module) -> str:
    """FQN of the last nn.Linear: pruning its rows would delete classes, so it stays dense."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    return linears[-1] if linears else ""


def _prune_config(cfg: DemoConfig, model: nn.Module) -> tuple[object, tuple[str, ...]]:
    from sparta_explore.pruners import BlockPruneConfig, NMPruneConfig, NNIPruneConfig, get_pruner

    exclude = cfg.exclude if cfg.exclude is not None else tuple(filter(None, [classifier_head(model)]))
    name = get_pruner(cfg.pruner).name
    if name == "block":
        return BlockPruneConfig(cfg.sparsity, cfg.block, exclude_op_names=exclude), exclude
    if name == "nm":
        return NMPruneConfig(2, 4, exclude_op_names=exclude), exclude
    has_bn = any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    op_types = ("BatchNorm2d",) if name == "slim" and has_bn else ("Linear", "Conv2d")
    return NNIPruneConfig(cfg.sparsity, op_types=op_types, exclude_op_names=exclude,
                          training_steps=cfg.training_steps), exclude


def run_demo(cfg: DemoConfig = DemoConfig(), *, out: str | os.PathLike | None = "results/demo",
             cache_dir: str | os.PathLike | None = None, echo: Callable[[str], None] = print) -> DemoResult:
    """Load (or train) `cfg.model`, prune it, optionally quantize, and report the TeSAs.

    Writes `tesa.npz` and `summary.csv` into `out` (unless None).

    Example:
        >>> result = run_demo(DemoConfig(pruner="level", sparsity=0.8))  # doctest: +SKIP
    """
    from sparta_explore.pruners import get_pruner, prune
    from sparta_explore.zoo import TrainConfig, evaluate, get_spec, load_digits_split, pretrained, train

    start = time.perf_counter()
    get_pruner(cfg.pruner)  # fail on a bad name before any training
    if cfg.quantizer:
        from sparta_explore.quantizers import get_quantizer

        get_quantizer(cfg.quantizer)
    if get_spec(cfg.model).task != "digits":
        raise ConfigError(f"demo model {cfg.model!r} must train on the digits (see `sparta-explore models`)")
    data = load_digits_split()
    model, dense_acc = pretrained(cfg.model, cache_dir=cache_dir, data=data)
    echo(f"model {cfg.model}: test accuracy {dense_acc:.4f} on {len(data.test_x)} held-out digits")
    graph = capture(model, (data.test_x[:1],))
    prune_cfg, exclude = _prune_config(cfg, model)
    echo(f"pruning with {cfg.pruner} ({type(prune_cfg).__name__}, sparsity {cfg.sparsity}); "
         f"left dense: {', '.join(exclude) or 'nothing'}")
    table = prune(model, prune_cfg, pruner=cfg.pruner, evaluator=data, graph=graph)
    if cfg.quantizer:
        from sparta_explore.quantizers import NNIQuantConfig, UniformQuantConfig, get_quantizer, quantize

        qname = get_quantizer(cfg.quantizer).name
        qcfg = (UniformQuantConfig(weight_bits=cfg.bits, activation_bits=cfg.bits, exclude_op_names=exclude)
                if qname == "uniform" else
                NNIQuantConfig(weight_bits=cfg.bits, activation_bits=cfg.bits, exclude_op_names=exclude,
                               training_steps=cfg.training_steps))
        echo(f"quantizing with {qname} to {cfg.bits} bits")
        table = table.merge(quantize(model, qcfg, quantizer=qname, evaluator=data, graph=graph))
    if cfg.dependent_norms:
        from sparta_explore.pruners import prune_dependent_norms

        table = prune_dependent_norms(graph, table)
    propagated = run_propagation(graph, table)
    # the propagated table is sound, so masking with it computes the same function; fine-tuning
    # under it keeps every propagated zero at zero, as the compiled kernels will assume
    masked = masked_copy(model, propagated.table)
    masked_acc = evaluate(masked, data.test_x, data.test_y)
    tuned_acc = None
    if cfg.finetune_epochs:
        # masks are re-applied after every step, so fine-tuning never revives a pruned weight
        tuned_acc = train(masked, data, TrainConfig(epochs=cfg.finetune_epochs, lr=1e-3),
                          after_step=lambda m: apply_table(m, propagated.table))
    compare = propagated.compare()
    summary = compare[[graph.tensors[n].kind == "param" or propagated.table[n].kept_bits() != [32]
                       or propagated.table[n].sparsity > 0 for n in compare["name"]]]
    echo("")
    echo(summary.to_string(index=False))
    echo("")
    weights = [n for n in table if graph.tensors[n].kind == "param" and n.endswith("weight")]
    total = sum(table[n].numel for n in weights)
    pruned = sum(int(table[n].pruned.sum()) for n in weights)
    after = sum(int(propagated.table[n].pruned.sum()) for n in weights)
    echo(f"weights pruned: {pruned}/{total} ({pruned / max(total, 1):.1%}) by the pruner, "
         f"{after}/{total} ({after / max(total, 1):.1%}) after propagation "
         f"({propagated.report.visits} rule visits, {propagated.report.seconds:.2f} s)")
    echo(f"test accuracy: dense {dense_acc:.4f}, masked {masked_acc:.4f}"
         + (f", masked + {cfg.finetune_epochs} epochs fine-tuning {tuned_acc:.4f}" if tuned_acc is not None else ""))
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        propagated.table.save(out / "tesa.npz")
        compare.to_csv(out / "summary.csv", index=False)
        echo(f"wrote {out / 'tesa.npz'} and {out / 'summary.csv'}")
    return DemoResult(graph, propagated.table, dense_acc, masked_acc, tuned_acc, time.perf_counter() - start)
