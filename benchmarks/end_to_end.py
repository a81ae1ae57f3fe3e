"""End-to-end latency: SparTA-style ablation (dense -> +propagation -> +transformation -> +specialization).

Every number is a median of whole-model forward calls measured in this run, on this machine;
each stage's x_dense comes from timing it alternately with the dense model (call by call).
Stages, each compiled from the same TeSAs:
  dense            the original fp32 model, PyTorch eager (MKL)
  pruned only      compile() on the pruner's TeSAs alone (no propagation), all kernel families
  +propagation     compile() on the propagated TeSAs, PyTorch kernels only (dense, dense-shrink)
  +transformation  + bit rounding, block cover, sparse fp32/int8 sub-operators, chosen by the profile's prediction
  +specialization  + candidates chosen by measured latency and register tiles tuned per pattern
Baselines beside them: torch dynamic int8 (quantize_dynamic) on the same pruned model.

    python benchmarks/end_to_end.py            # all models (~10 min on 2 cores)
    python benchmarks/end_to_end.py --quick    # smaller batches
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile import compile
from sparta_explore.device import DeviceProfile
from sparta_explore.explore.trial.timing import interleaved_measure
from sparta_explore.measure import count_flops, measure
from sparta_explore.pruners import prune, prune_dependent_norms
from sparta_explore.pruners.block import BlockPruneConfig
from sparta_explore.pruners.nni_pruners import NNIPruneConfig
from sparta_explore.quantizers import quantize
from sparta_explore.quantizers.uniform import UniformQuantConfig
from sparta_explore.zoo import build_model, example_inputs
from sparta_explore.zoo.bert import BertConfig, FeedForward

STAGES = {
    "pruned only": dict(kernels=None, choose="measured", tune=True, propagate=False),
    "+propagation": dict(kernels={"dense", "shrink"}, choose="measured", tune=False, propagate=True),
    "+transformation": dict(kernels=None, choose="predicted", tune=False, propagate=True),
    "+specialization": dict(kernels=None, choose="measured", tune=True, propagate=True),
}


def dynamic_int8(model: nn.Module) -> nn.Module:
    return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def tables(model: nn.Module, x: tuple, how: str, sparsity: float, block: tuple[int, int],
           bits: int | tuple[int, int] | None):
    """Pruned TeSAs (and bits: one width, or (weight, activation) widths), raw and propagated."""
    g = se.capture(model, x)
    if how == "block":
        t = prune(model, BlockPruneConfig(sparsity=sparsity, block=block), pruner="block", graph=g)
    else:
        t = prune_dependent_norms(g, prune(model, NNIPruneConfig(sparsity=sparsity), pruner=how, graph=g))
    if bits is not None:
        weight_bits, act_bits = (bits, bits) if isinstance(bits, int) else bits
        q = quantize(model, UniformQuantConfig(weight_bits=weight_bits, activation_bits=act_bits,
                                               op_types=("Linear", "Conv2d")), "uniform", graph=g)
        t = t.merge(q)
    return g, t, se.propagate(g, t)


def run_case(name: str, model: nn.Module, x: tuple, how: str, sparsity: float, block=(32, 32), bits=None,
             runs: int = 10, device: DeviceProfile | None = None, stages=STAGES) -> list[dict]:
    model.eval()
    _, raw, propagated = tables(model, x, how, sparsity, block, bits)
    dense = measure(model, x, runs=runs)
    rows = [{"case": name, "stage": "dense fp32", "ms": dense.median_ms, "p10": dense.p10_ms, "p90": dense.p90_ms,
             "x_dense": 1.0, "eff_gflop": dense.effective_flops / 1e9, "compile_s": 0.0, "choices": ""}]
    masked = se.masked_copy(model, propagated)
    if any(isinstance(m, nn.Linear) for m in model.modules()):
        dyn = measure(dynamic_int8(masked), x, runs=runs)
        rows.append({"case": name, "stage": "torch dynamic int8", "ms": dyn.median_ms, "p10": dyn.p10_ms,
                     "p90": dyn.p90_ms, "x_dense": dense.median_ms / dyn.median_ms, "eff_gflop": float("nan"),
                     "compile_s": 0.0, "choices": ""})
    for stage, opts in stages.items():
        table = propagated if opts["propagate"] else raw
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cm = compile(model, table, x, device=device, choose=opts["choose"], tune=opts["tune"],
                         kernels=opts["kernels"])
        seconds = time.perf_counter() - t0
        # the ratio comes from dense and compiled timed call by call, alternately, so load bursts hit both
        base, m = interleaved_measure([model, cm], x, runs=runs)
        choices = cm.report.choice.value_counts().to_dict()
        rows.append({"case": name, "stage": stage, "ms": m.median_ms, "p10": m.p10_ms, "p90": m.p90_ms,
                     "x_dense": base.median_ms / m.median_ms, "eff_gflop": count_flops(cm, x)[1] / 1e9,
                     "compile_s": seconds, "choices": " ".join(f"{k}:{v}" for k, v in sorted(choices.items()))})
        if stage == "+specialization":
            print(cm.report[["op", "shape", "m", "density", "choice", "parts", "pred_ms", "meas_ms",
                             "dense_ms"]].to_string(index=False))
    return rows


def print_rows(rows: list[dict]) -> None:
    head = f"{'case':34s} {'stage':20s} {'ms':>9s} {'p10':>8s} {'p90':>8s} {'x_dense':>8s} {'GFLOP':>7s} " \
           f"{'build_s':>7s}  choices"
    print(head)
    for r in rows:
        print(f"{r['case']:34s} {r['stage']:20s} {r['ms']:9.2f} {r['p10']:8.2f} {r['p90']:8.2f} "
              f"{r['x_dense']:8.2f} {r['eff_gflop']:7.2f} {r['compile_s']:7.1f}  {r['choices']}")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller batches, fewer runs")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--only", nargs="*", default=None, help="case name prefixes to run")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = DeviceProfile.load_or_measure()
    print(f"device: {device.cpu}, {device.threads} threads, bits {device.bits}, profile measured in "
          f"{device.seconds:.1f} s; torch {torch.__version__}\n")
    batch = 8 if args.quick else 32
    bert_x = (torch.randn(batch, 128, 768),)
    ffn = FeedForward(BertConfig.base())
    cases = [
        ("bert-layer 90% 32x32 fp32", lambda: build_model("bert-base"), bert_x, "block", 0.9, (32, 32), None),
        ("bert-layer 90% 32x32 int8", lambda: build_model("bert-base"), bert_x, "block", 0.9, (32, 32), 8),
        ("bert-layer 90% 32x32 w4a8", lambda: build_model("bert-base"), bert_x, "block", 0.9, (32, 32), (4, 8)),
        ("bert-layer 90% 1x32 fp32", lambda: build_model("bert-base"), bert_x, "block", 0.9, (1, 32), None),
        ("bert-ffn 90% unstructured fp32", lambda: ffn, bert_x, "block", 0.9, (1, 1), None),
        ("bert-ffn 90% unstructured int8", lambda: ffn, bert_x, "block", 0.9, (1, 1), 8),
        ("bert-ffn 50% unstructured fp32", lambda: ffn, bert_x, "block", 0.5, (1, 1), None),
        ("bert-ffn 50% unstructured int8", lambda: ffn, bert_x, "block", 0.5, (1, 1), 8),
        ("digits-cnn l1norm 50%", lambda: build_model("digits-cnn"), example_inputs("digits-cnn", batch=256),
         "l1norm", 0.5, (1, 1), None),
        ("mobilenet-32 l1norm 50%", lambda: build_model("mobilenet-32"), example_inputs("mobilenet-32", batch=batch),
         "l1norm", 0.5, (1, 1), None),
        ("resnet-32 90% unstructured fp32", lambda: build_model("resnet-32"), example_inputs("resnet-32", batch=batch),
         "block", 0.9, (1, 1), None),
        ("resnet-32 90% unstructured int8", lambda: build_model("resnet-32"), example_inputs("resnet-32", batch=batch),
         "block", 0.9, (1, 1), 8),
    ]
    for name, build, x, how, sparsity, block, bits in cases:
        if args.only and not any(name.startswith(p) for p in args.only):
            continue
        print(f"== {name}", flush=True)
        print_rows(run_case(name, build(), x, how, sparsity, block, bits, runs=args.runs, device=device))


if __name__ == "__main__":
    main()
