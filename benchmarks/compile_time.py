"""Compile time, and where it goes: BERT-base and small models, new masks, empty and filled kernel caches.

Every row is one `se.compile` measured in this run (the device profile is measured once per
machine and given). For 12-layer BERT-base (`transformers.BertForSequenceClassification`,
random weights, batch 8 x 128, all 72 encoder linears pruned 90%, unstructured and 32x32
blocks, fp32 and w8a8):

  empty cache    a new kernel and tile-search cache folder, as on a fresh machine (goal: <= 15 s)
  new masks      the weights perturbed, so the pruner gives other masks, in the cache the first
                 compile filled: what every further trial of a search pays (goal: <= 15 s)
  same masks     the second compile's masks again (goal: <= 5 s)

Small models (digits workloads; 4-layer ViT, hidden 192, 8 images; 4-layer DistilBERT, 8 x 128
tokens), 90% unstructured on every prunable linear: an empty cache, then new masks
(goal: <= 3 s with new masks). Each row prints the stage breakdown
(`CompiledModel.compile_times`, largest first) and the model's speed against dense from
compile's own guard (marked * where the dense figure is capture's call of the model, the first
in this process: no guard round timed it).

    python benchmarks/compile_time.py                    # ~10 min on 2 cores
    python benchmarks/compile_time.py --only small       # the small models
    python benchmarks/compile_time.py --layers 2 --only bert
    python benchmarks/compile_time.py --case 32x32-w8a8    # one BERT case (each runs in a process of its own)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.compile_times import times_text
from sparta_explore.compile.config import CompileConfig
from sparta_explore.device import DeviceProfile
from sparta_explore.pruners import prune
from sparta_explore.pruners.block import BlockPruneConfig
from sparta_explore.quantizers import quantize
from sparta_explore.quantizers.uniform import UniformQuantConfig

sys.path.insert(0, str(Path(__file__).parent))
from bert_model import bert, encoder_linears, inputs  # noqa: E402  (the same model and inputs as bert_model.py)


def perturbed(model: nn.Module, seed: int) -> nn.Module:
    """The model with every weight scaled by a random factor in [1, 1.5): magnitude pruning picks other masks."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 0.5 * torch.rand(p.shape, generator=g))
    return model


def table_for(model: nn.Module, graph, names: tuple[str, ...], block: tuple[int, int], bits: int):
    table = prune(model, BlockPruneConfig(sparsity=0.9, block=block, op_names=names), pruner="block", graph=graph)
    if bits == 8:
        q = quantize(model, UniformQuantConfig(weight_bits=8, activation_bits=8, activation_fmt="int",
                                               op_types=("Linear",), op_names=names), "uniform", graph=graph)
        table = table.merge(q)
    return se.run_propagation(graph, table)


def timed_compile(model: nn.Module, x, names, block, bits, device, cache: Path) -> tuple[float, object]:
    graph = se.capture(model, x)
    result = table_for(model, graph, names, block, bits)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = se.compile(graph, result, config=CompileConfig(device=device, cache_dir=cache))
    return time.perf_counter() - start, cm


def row(label: str, case: str, seconds: float, cm) -> None:
    guard = cm.guard or {}
    speed = f"{guard['x_dense']:.2f}x dense" if "x_dense" in guard else "no guard"
    speed += "*" if guard.get("dense_from") == "capture" else ""
    print(f"{label:<34} {case:<12} {seconds:7.1f} s  {speed:<13} {times_text(cm.compile_times)}", flush=True)


BERT_CASES = {f"{pattern}-{precision}": (block, bits)
              for block, pattern in (((1, 1), "unstructured"), ((32, 32), "32x32"))
              for bits, precision in ((32, "fp32"), (8, "w8a8"))}


def bert_case(case: str, layers: int, device) -> None:
    """The three compiles of one BERT case (empty cache, new masks, same masks) in this process."""
    block, bits = BERT_CASES[case]
    pattern, precision = case.split("-")
    label = f"BERT-base {layers}L 90% {pattern} {precision}"
    x = inputs(8, 128)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        model = bert(layers)
        names = encoder_linears(model)
        seconds, cm = timed_compile(model, x, names, block, bits, device, cache)
        row(label, "empty cache", seconds, cm)
        del cm, model
        model = perturbed(bert(layers), seed=1)
        seconds, cm = timed_compile(model, x, names, block, bits, device, cache)
        row(label, "new masks", seconds, cm)
        del cm
        seconds, cm = timed_compile(model, x, names, block, bits, device, cache)
        row(label, "same masks", seconds, cm)


def bert_rows(layers: int, threads: int) -> None:
    """Each case in a process of its own: the freed memory of one (glibc keeps gigabytes of a BERT-base compile's
    copies mapped) slowed the model runs of the next by up to 1.6x in one long process."""
    for case in BERT_CASES:
        subprocess.run([sys.executable, __file__, "--case", case, "--layers", str(layers), "--threads", str(threads)],
                       check=True)


def small_models() -> list[tuple[str, nn.Module, object, tuple[str, ...]]]:
    from transformers import DistilBertConfig, DistilBertModel, ViTConfig, ViTForImageClassification

    from sparta_explore.workload import load_workload

    out = []
    for name in ("digits-mlp", "digits-ffn", "digits-cnn"):
        w = load_workload(name)
        model = w.dense_model()
        out.append((name, model, w.inputs, w.prunable_modules(model)))
    torch.manual_seed(0)
    vit = ViTForImageClassification(ViTConfig(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
                                              intermediate_size=768, num_labels=10)).eval()
    linears = lambda m: tuple(n for n, mod in m.named_modules() if isinstance(mod, nn.Linear)  # noqa: E731
                              and "classifier" not in n)
    out.append(("ViT 4L hidden 192", vit, (torch.randn(8, 3, 224, 224),), linears(vit)))
    distil = DistilBertModel(DistilBertConfig(n_layers=4)).eval()
    ids = torch.randint(0, 30522, (8, 128), generator=torch.Generator().manual_seed(0))
    out.append(("DistilBERT 4L", distil, {"input_ids": ids}, linears(distil)))
    return out


def small_rows(device) -> None:
    for label, model, x, names in small_models():
        with tempfile.TemporaryDirectory() as tmp:
            cache = Path(tmp)
            seconds, cm = timed_compile(model, x, names, (1, 1), 32, device, cache)
            row(label, "empty cache", seconds, cm)
            seconds, cm = timed_compile(perturbed(model, seed=1), x, names, (1, 1), 32, device, cache)
            row(label, "new masks", seconds, cm)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--only", choices=("bert", "small"), default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--case", choices=tuple(BERT_CASES), default=None, help="one BERT case, in this process")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = DeviceProfile.load_or_measure()
    if args.case is not None:
        bert_case(args.case, args.layers, device)
        return
    print(f"threads {args.threads}; device profile {device.key if hasattr(device, 'key') else 'measured'}; "
          "columns: model, case, compile seconds, x dense (compile's guard), breakdown", flush=True)
    if args.only in (None, "small"):
        small_rows(device)
    if args.only in (None, "bert"):
        bert_rows(args.layers, args.threads)


if __name__ == "__main__":
    main()
