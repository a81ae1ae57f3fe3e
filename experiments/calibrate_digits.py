# %% [markdown]
# # Distillation-based bit calibration on the digits CNN and MLP
#
# For each model: start from 32 bits everywhere (or from a pruning table with
# `--sparsity`), run `calibrate` with a calibration batch from the train split and the
# accuracy it steers by measured on validation data (`--val-sources`: "train" = the rest
# of the train split, which the model trained on; "test" = half the test split), then
# check the accuracy on held-out data calibration never saw (the whole test split, or
# its other half). Prints the width found per tensor, the accuracies before and after
# (validation and held-out), and the calibration time, per tuning mode.
# Run with `python experiments/calibrate_digits.py [--bits 16 8 4] [--threshold 0.01]`.

# %%
import argparse
import os
import platform

import pandas as pd
import torch
from torch import nn

from sparta_explore import capture, masked_copy
from sparta_explore.quantizers import CalibrationConfig, calibrate_on_split, calibration_data
from sparta_explore.zoo import evaluate, load_digits_split, pretrained

parser = argparse.ArgumentParser(description="distillation-based bit calibration on the digits models")
parser.add_argument("--models", nargs="*", default=["digits-cnn", "digits-mlp"])
parser.add_argument("--bits", nargs="*", type=int, default=[16, 8, 4])
parser.add_argument("--threshold", type=float, default=0.01)
parser.add_argument("--calib-size", type=int, default=256)
parser.add_argument("--val-sources", nargs="*", default=["train", "test"], choices=["train", "test"])
parser.add_argument("--modes", nargs="*", default=["plain", "clip"], choices=["plain", "clip", "clip+rounding"],
                    help="plain: the kernels' max/qmax scales, nothing tuned; clip: learned per-row clip; "
                         "clip+rounding: also learned weight rounding and bias correction")
parser.add_argument("--sparsity", type=float, default=0.0, help="prune Linear/Conv weights first (NNI Level pruner)")
parser.add_argument("--threads", type=int, default=1, help="torch threads (these small ops run fastest on one)")
args, _ = parser.parse_known_args()
torch.set_num_threads(args.threads)
data = load_digits_split()
MODES = {"plain": {"tune_scales": False}, "clip": {"tune_scales": True},
         "clip+rounding": {"tune_scales": True, "tune_weights": True}}
print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} cores, "
      f"{platform.processor() or platform.machine()}; bits {args.bits}, threshold {args.threshold}, "
      f"sparsity {args.sparsity}, calibration batch {args.calib_size} train images")


def start_table(model: nn.Module, graph):
    """None (32 bits everywhere), or an NNI Level pruning of every Linear/Conv but the classifier head."""
    if not args.sparsity:
        return None
    from sparta_explore.pruners import NNIPruneConfig, prune

    head = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]
    return prune(model, NNIPruneConfig(args.sparsity, exclude_op_names=(head,)), "level", graph=graph)


# %%
rows = []
for name in args.models:
    model, _ = pretrained(name, data=data)
    graph = capture(model, (data.test_x[:1],))
    table = start_table(model, graph)
    for source in args.val_sources:
        cd = calibration_data(data, calib_size=args.calib_size, val_source=source)
        held_before = evaluate(masked_copy(model, table or {}), cd.held_x, cd.held_y)
        for mode in args.modes:
            config = CalibrationConfig(bits=tuple(args.bits), threshold=args.threshold, progress=False, **MODES[mode])
            r = calibrate_on_split(model, table, cd, config, graph=graph)
            held_after = evaluate(r.model, cd.held_x, cd.held_y)
            print(f"\n== {name}, validation on {source}, {mode}: width found per tensor ==")
            for tensor, bits in r.assignment().items():
                why = next((s.note for s in r.log if s.tensor == tensor and s.bits == s.from_bits), "")
                print(f"  {tensor:16s} {bits:>2d} bits  {why}")
            widths = list(r.assignment().values())
            rows.append({"model": name, "val": f"{source}({len(cd.val_x)})", "mode": mode,
                         "at<=8": f"{sum(b <= 8 for b in widths)}/{len(widths)}",
                         "mean_bits": round(sum(widths) / len(widths), 2),
                         "val_before": round(r.accuracy_before, 4), "val_after": round(r.accuracy_after, 4),
                         "held": len(cd.held_x), "held_before": round(held_before, 4),
                         "held_after": round(held_after, 4), "held_drop": round(held_before - held_after, 4),
                         "trials": sum(s.bits != s.from_bits for s in r.log), "seconds": round(r.seconds, 2)})

# %%
print("\n" + pd.DataFrame(rows).to_string(index=False))
