"""A real Hugging Face model end to end: 12-layer BERT-base, every encoder linear pruned, captured, compiled.

`transformers.BertForSequenceClassification` with bert-base shapes (random weights: no hub),
batch 8 x 128 tokens with an attention mask. Every encoder linear (Q, K, V, attention
output, FFN in and out: 72 weights) is pruned to 90% in 32x32 blocks. Printed, all from
this run on this machine:

  capture + propagate   seconds for `se.capture` (torch.export, normalized) and
                        `run_propagation` including its self-check, median of
                        --repeats fresh runs (goal: < 10 s)
  max rel error         compiled vs the model masked with the pruner's table (goal: < 1e-3)
  x dense               median whole-model latency vs torch dense fp32 (goal: >= 4x fp32),
                        and with 8-bit weights + inputs beside torch dynamic int8 (quantize_dynamic)
                        of the same masked model

    python benchmarks/bert_model.py              # 12 layers (~10 min on 2 cores, most of it compiling)
    python benchmarks/bert_model.py --layers 2   # quicker look
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile import compile
from sparta_explore.compile.config import CompileConfig
from sparta_explore.explore.trial.timing import interleaved_measure
from sparta_explore.pruners import prune
from sparta_explore.pruners.block import BlockPruneConfig
from sparta_explore.quantizers import quantize
from sparta_explore.quantizers.uniform import UniformQuantConfig


def bert(layers: int) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=layers, num_labels=2, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config).eval()


def inputs(batch: int, seq: int, vocab: int = 30522) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[batch // 2:, seq - seq // 4:] = 0  # padded sequences, so the mask matters
    return {"input_ids": ids, "attention_mask": mask}


def encoder_linears(model: nn.Module) -> tuple[str, ...]:
    return tuple(n for n, m in model.named_modules() if isinstance(m, nn.Linear) and ".encoder." in f".{n}")


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def logits(model: nn.Module, x: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model(**x)
    return out.logits if hasattr(out, "logits") else out[0]


def run(layers: int, batch: int, seq: int, sparsity: float, block: tuple[int, int], runs: int,
        repeats: int = 3) -> list[dict]:
    model = bert(layers)
    x = inputs(batch, seq)
    names = encoder_linears(model)
    timings = []
    for _ in range(max(1, repeats)):  # fresh capture each time: the figure a user sees on first use
        start = time.perf_counter()
        graph = se.capture(model, x)
        captured = time.perf_counter() - start
        table = prune(model, BlockPruneConfig(sparsity=sparsity, block=block, op_names=names), pruner="block",
                      graph=graph)
        start = time.perf_counter()
        result = se.run_propagation(graph, table)
        timings.append((captured, time.perf_counter() - start))
    each = ", ".join(f"{c + p:.1f}" for c, p in timings)
    captured, propagated = sorted(timings, key=sum)[len(timings) // 2]
    print(f"capture {captured:.1f} s + propagate (with self-check) {propagated:.1f} s = "
          f"{captured + propagated:.1f} s (median of {len(timings)}: {each}); self-check passed: "
          f"{result.check.passed}; {len(names)} encoder linears pruned at {sparsity:.0%} in "
          f"{block[0]}x{block[1]} blocks")
    masked = se.masked_copy(model, table)
    reference = logits(masked, x)
    dense_ms = None
    rows = []
    cases = [("fp32 sparse", None), ("w8a8 sparse", 8)]
    for label, bits in cases:
        tab = table
        if bits is not None:
            q = quantize(model, UniformQuantConfig(weight_bits=bits, activation_bits=bits, activation_fmt="int",
                                                   op_types=("Linear",), op_names=names), "uniform", graph=graph)
            tab = se.run_propagation(graph, table.merge(q))
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cm = compile(graph, tab if bits is not None else result, config=CompileConfig(runs=3))
        compile_s = time.perf_counter() - start
        err = relative_error(logits(cm, x), reference)
        dense, fast = interleaved_measure([model, cm], x, runs=runs)
        dense_ms = dense.median_ms
        kinds: dict[str, int] = {}
        for op in cm.plan.ops.values():
            kinds[op.chosen] = kinds.get(op.chosen, 0) + 1
        rows.append({"case": label, "ms": fast.median_ms, "x_dense": dense.median_ms / fast.median_ms,
                     "max_rel_error": err, "table_check": cm.table_error, "compile_s": compile_s,
                     "choices": ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items(), key=str))})
    with warnings.catch_warnings():  # torch deprecates quantize_dynamic; it is still the baseline users have
        warnings.simplefilter("ignore")
        dyn = torch.ao.quantization.quantize_dynamic(masked, {nn.Linear}, dtype=torch.qint8)
    dense, fast = interleaved_measure([model, dyn], x, runs=runs)
    rows.append({"case": "torch dynamic int8 (masked)", "ms": fast.median_ms,
                 "x_dense": dense.median_ms / fast.median_ms,
                 "max_rel_error": relative_error(logits(dyn, x), reference), "table_check": float("nan"),
                 "compile_s": 0.0, "choices": "quantize_dynamic"})
    rows.insert(0, {"case": "torch dense fp32", "ms": dense_ms, "x_dense": 1.0, "max_rel_error": 0.0,
                    "table_check": float("nan"), "compile_s": 0.0, "choices": ""})
    return rows


def add_bert_arguments(p: argparse.ArgumentParser, block: tuple[int, int] = (32, 32)) -> None:
    """The model and pruning options of the BERT-base benchmarks: layers, batch, seq, sparsity, block."""
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--sparsity", type=float, default=0.9)
    p.add_argument("--block", type=int, nargs=2, default=block)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_bert_arguments(p)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--repeats", type=int, default=3, help="capture + propagate runs; the median is reported")
    args = p.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    rows = run(args.layers, args.batch, args.seq, args.sparsity, tuple(args.block), args.runs, args.repeats)
    print(f"\nBertForSequenceClassification, {args.layers} layers, bert-base widths, batch {args.batch}x{args.seq}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'case':<30}{'ms':>10}{'x dense':>9}{'max rel err':>13}{'table chk':>11}{'compile s':>11}  choices")
    for r in rows:
        print(f"{r['case']:<30}{r['ms']:>10.1f}{r['x_dense']:>9.2f}{r['max_rel_error']:>13.2e}"
              f"{r['table_check']:>11.2e}{r['compile_s']:>11.1f}  {r['choices']}")


if __name__ == "__main__":
    main()
