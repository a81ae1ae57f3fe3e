"""Loading a saved compiled model against compiling it: 12-layer BERT-base, warm and cold kernel cache.

`transformers.BertForSequenceClassification` with bert-base shapes (random weights), batch
8 x 128 with an attention mask, every encoder linear (72) pruned 90% (unstructured by
default, `--block 32 32` for blocks), fp32 and w8a8. For each precision, all in one run:

  compile warm   `se.compile` with the kernel cache already holding this model's kernels
                 (a second compile of the same masks)
  compile cold   `se.compile` with an empty kernel and tile-search cache (the device profile
                 given: it is measured once per machine)
  load warm      `se.load` in a fresh process, kernel libraries in the cache
  load cold      `se.load` in a fresh process with an empty kernel cache: every C source
                 of the package built again
  x              compile / load, warm over warm and cold over cold (goal: >= 10x both)
  identical      the loaded model's outputs equal the saved model's bit for bit (goal: yes)

    python benchmarks/save_load.py                     # ~30 min on 2 cores (the cold compiles)
    python benchmarks/save_load.py --layers 2 --precision fp32   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

import sparta_explore as se
from sparta_explore.compile.config import CompileConfig
from sparta_explore.device import DeviceProfile
from sparta_explore.pruners import prune
from sparta_explore.pruners.block import BlockPruneConfig
from sparta_explore.quantizers import quantize
from sparta_explore.quantizers.uniform import UniformQuantConfig

sys.path.insert(0, str(Path(__file__).parent))
from bert_model import add_bert_arguments, bert, encoder_linears, inputs  # noqa: E402  (the same model and inputs as bert_model.py)

_LOAD = """
import json, sys, time, torch
import sparta_explore as se
start = time.perf_counter()
cm = se.load(sys.argv[1], cache_dir=sys.argv[2])
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "bit_identical": cm.record.loaded["bit_identical"],
                  "mode": cm.record.loaded["mode"], "libraries": cm.record.loaded["libraries"]}))
"""


def _load(path: Path, cache: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _LOAD, str(path), str(cache)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _compile(graph, table, device, cache: Path):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = se.compile(graph, table, config=CompileConfig(device=device, cache_dir=cache))
    return cm, time.perf_counter() - start


def run(layers: int, batch: int, seq: int, sparsity: float, block: tuple[int, int], precisions: list[str]) -> list:
    model = bert(layers)
    x = inputs(batch, seq)
    names = encoder_linears(model)
    graph = se.capture(model, x)
    table = prune(model, BlockPruneConfig(sparsity=sparsity, block=block, op_names=names), pruner="block",
                  graph=graph)
    device = DeviceProfile.load_or_measure()
    rows = []
    for precision in precisions:
        tab = table
        if precision == "w8a8":
            q = quantize(model, UniformQuantConfig(weight_bits=8, activation_bits=8, activation_fmt="int",
                                                   op_types=("Linear",), op_names=names), "uniform", graph=graph)
            tab = table.merge(q)
        result = se.run_propagation(graph, tab)
        with tempfile.TemporaryDirectory() as tmp:
            cache, empty, package = Path(tmp) / "compiled", Path(tmp) / "empty", Path(tmp) / "bert.sparta"
            cm, cold_s = _compile(graph, result, device, cache)      # empty cache: every kernel built
            cm, warm_s = _compile(graph, result, device, cache)      # the same masks again: kernels cached
            start = time.perf_counter()
            cm.save(package)
            save_s = time.perf_counter() - start
            warm = _load(package, cache)
            cold_load = _load(package, empty)                        # a cache that never saw these kernels
            rows.append({"precision": precision, "compile_warm": warm_s, "load_warm": warm["seconds"],
                         "compile_cold": cold_s, "load_cold": cold_load["seconds"], "save": save_s,
                         "mb": os.path.getsize(package) / 1e6, "libraries": warm["libraries"],
                         "identical": warm["bit_identical"] and cold_load["bit_identical"],
                         "choices": ", ".join(f"{k} x{v}" for k, v in cm.report["choice"].value_counts().items())})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_bert_arguments(p, block=(1, 1))
    p.add_argument("--precision", nargs="+", default=["fp32", "w8a8"], choices=["fp32", "w8a8"])
    args = p.parse_args()
    rows = run(args.layers, args.batch, args.seq, args.sparsity, tuple(args.block), args.precision)
    print(f"\nBERT-base widths, {args.layers} layers, batch {args.batch}x{args.seq}, {args.sparsity:.0%} "
          f"{args.block[0]}x{args.block[1]}, {torch.get_num_threads()} threads; seconds")
    print(f"{'precision':<10}{'compile warm':>13}{'load warm':>10}{'x':>7}{'compile cold':>14}{'load cold':>10}"
          f"{'x':>7}{'save':>7}{'MB':>7}{'libs':>6}  identical  choices")
    for r in rows:
        print(f"{r['precision']:<10}{r['compile_warm']:>13.1f}{r['load_warm']:>10.2f}"
              f"{r['compile_warm'] / r['load_warm']:>7.1f}{r['compile_cold']:>14.1f}{r['load_cold']:>10.2f}"
              f"{r['compile_cold'] / r['load_cold']:>7.1f}{r['save']:>7.1f}{r['mb']:>7.0f}{r['libraries']:>6}  "
              f"{str(r['identical']):<9}  {r['choices']}")


if __name__ == "__main__":
    main()
