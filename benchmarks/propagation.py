"""Propagation speed and strength on the embedded models.

Prints (1) the time to propagate a 12-layer BERT-base-shaped encoder (batch 1 x 128 tokens)
and the MobileNet-style model, median of repeated runs, and (2) weight sparsity before and
after propagation for the embedded CNN, ResNet-, MobileNet- and BERT-style models under
NNI's L1NormPruner (50% of rows/filters), with and without pruning the BatchNorm channels
that follow pruned filters. Run: `python benchmarks/propagation.py [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from sparta_explore import capture
from sparta_explore.propagation import run_propagation
from sparta_explore.pruners import BlockPruneConfig, NNIPruneConfig, prune, prune_dependent_norms
from sparta_explore.zoo import BertConfig, BertEncoder, build_model, example_inputs


def weight_sparsity(graph, table) -> float:
    names = [n for n, i in graph.tensors.items() if i.kind == "param" and n.endswith("weight")]
    return sum(int(table[n].pruned.sum()) for n in names) / sum(table[n].numel for n in names)


def head_of(model: nn.Module) -> tuple[str, ...]:
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return (linears[-1],) if linears and not isinstance(model, BertEncoder) else ()


def timing(repeats: int) -> None:
    print("== propagation time (median of", repeats, "runs, after one warm-up) ==")
    print(f"{'model':34s} {'ops':>5s} {'visits':>7s} {'capture_s':>10s} {'propagate_s':>12s}")
    bert = BertEncoder(BertConfig(layers=12, batch=1, seq=128)).eval()
    cases = [("BERT-base 12 layers, 1x128 tokens", bert, bert.example_inputs(),
              BlockPruneConfig(0.9, (32, 32)), "block"),
             ("BERT-base 12 layers, L1Norm rows", bert, bert.example_inputs(), NNIPruneConfig(0.5), "l1norm"),
             ("MobileNet-style (3x32x32)", build_model("mobilenet-32"), example_inputs("mobilenet-32", batch=1),
              NNIPruneConfig(0.5, exclude_op_names=("fc",)), "l1norm")]
    for label, model, inputs, cfg, pruner in cases:
        start = time.perf_counter()
        graph = capture(model, inputs)
        capture_s = time.perf_counter() - start
        table = prune(model, cfg, pruner=pruner, graph=graph)
        run_propagation(graph, table)
        times, result = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            result = run_propagation(graph, table)
            times.append(time.perf_counter() - start)
        print(f"{label:34s} {result.report.nodes:5d} {result.report.visits:7d} {capture_s:10.2f} "
              f"{statistics.median(times):12.2f}")


def strength() -> None:
    print("\n== weight sparsity before -> after propagation (L1NormPruner 50%, classifier head dense) ==")
    print(f"{'model':20s} {'pruned':>8s} {'propagated':>11s} {'+BN channels':>13s} {'propagated':>11s}")
    for name in ("digits-cnn", "digits-resnet", "digits-mobilenet", "bert-tiny", "digits-transformer"):
        model = build_model(name)
        graph = capture(model, example_inputs(name, batch=1))
        table = prune(model, NNIPruneConfig(0.5, exclude_op_names=head_of(model)), pruner="l1norm", graph=graph)
        plain = run_propagation(graph, table).table
        closed = prune_dependent_norms(graph, table)
        closed_after = run_propagation(graph, closed).table
        print(f"{name:20s} {weight_sparsity(graph, table):8.3f} {weight_sparsity(graph, plain):11.3f} "
              f"{weight_sparsity(graph, closed):13.3f} {weight_sparsity(graph, closed_after):11.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"threads={torch.get_num_threads()} torch={torch.__version__}")
    timing(args.repeats)
    strength()


if __name__ == "__main__":
    main()
