"""How fast the foundation's primitives are at BERT-base sizes (propagation calls them a lot).

Prints one table: operation, tensor shape, median milliseconds over repeated runs, and
throughput. Run: `python benchmarks/tesa_ops.py [--repeats 20]`. Not a test; no asserts.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sparta_explore import TeSA, TeSATable, capture
from sparta_explore.pruners import BlockPruneConfig, prune
from sparta_explore.zoo import build_model, example_inputs


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = (3072, 768)
    a = TeSA.from_mask(torch.rand(shape) > 0.9, bits=8, fmt="int")
    b = TeSA.from_mask(torch.rand(shape) > 0.5, bits=16)
    model = build_model("bert-base")
    inputs = example_inputs("bert-base", batch=1)
    graph = capture(model, inputs)
    table = prune(model, BlockPruneConfig(0.9, (32, 32)), pruner="block", graph=graph)
    cases = [
        ("TeSA.merge", "3072x768", lambda: a.merge(b), a.numel),
        ("TeSA.from_mask", "3072x768", lambda: TeSA.from_mask(torch.rand(shape) > 0.5), a.numel),
        ("TeSA.block_density 32x32", "3072x768", lambda: a.block_density((32, 32)), a.numel),
        ("TeSA.block_density 1x32", "3072x768", lambda: a.block_density((1, 32)), a.numel),
        ("TeSA.bit_histogram", "3072x768", lambda: a.bit_histogram(), a.numel),
        ("capture bert-base layer", "1x128x768", lambda: capture(model, inputs), None),
        ("block prune 6 linears", "bert-base", lambda: prune(model, BlockPruneConfig(0.9, (32, 32)),
                                                             pruner="block"), None),
        ("TeSATable.merge", f"{len(table)} tensors", lambda: table.merge(table), None),
        ("TeSATable.summary", f"{len(table)} tensors", lambda: table.summary(), None),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.npz"
        cases += [("TeSATable.save", f"{len(table)} tensors", lambda: table.save(path), None),
                  ("TeSATable.load", f"{len(table)} tensors", lambda: TeSATable.load(path), None)]
        table.save(path)
        print(f"cpu={platform.processor() or platform.machine()} threads={torch.get_num_threads()} "
              f"torch={torch.__version__} repeats={args.repeats}")
        print(f"{'operation':28s} {'shape':14s} {'median_ms':>10s} {'Melem/s':>9s}")
        for name, shape_text, fn, numel in cases:
            ms = median_ms(fn, args.repeats)
            rate = f"{numel / ms / 1e3:9.0f}" if numel else f"{'-':>9s}"
            print(f"{name:28s} {shape_text:14s} {ms:10.2f} {rate}")


if __name__ == "__main__":
    main()
