# %% [markdown]
# # Sparsity x pattern x bits on the embedded default, judged by measured latency
#
# Sweeps digits-ffn (the digits' accuracy with BERT-base FFN shapes, 768 -> 3072 -> 768,
# latency batch 256) over sparsity, block pattern (32x32 blocks, 1x32 row vectors,
# unstructured 1x1, and NNI's L1-norm row pruning) and bits (fp32, int8). Every trial is
# pruned, quantized, propagated, fine-tuned for one epoch, compiled to specialized kernels,
# verified, and timed against dense PyTorch on this machine.
#
# The sweep is resumable: results land in `results/sweep/rows/` one file per trial, so a
# rerun (or a run after a crash) only does the trials that are missing. Run with
# `python experiments/sweep.py [--out results/sweep] [--quick]`; each `# %%` cell also runs
# on its own in an editor with cell support. `--quick` sweeps a 4-trial corner of the grid.

# %%
import argparse
from pathlib import Path

import pandas as pd

from sparta_explore.explore.report.pareto import front_hypervolume, guided_front, reference_point
from sparta_explore.explore.report.plots import plot_results
from sparta_explore.explore.report.sweep_report import objective_picks, write_report
from sparta_explore.explore.sweep import sweep

parser = argparse.ArgumentParser(description="sparsity x pattern x bits sweep on digits-ffn")
parser.add_argument("--out", type=Path, default=Path("results/sweep"))
parser.add_argument("--quick", action="store_true", help="a 4-trial corner of the grid")
parser.add_argument("--runs", type=int, default=20, help="timed calls per latency measurement")
args, _ = parser.parse_known_args()
pd.set_option("display.width", 160)
pd.set_option("display.max_columns", 20)

# %% The grid: one axis per question
patterns = [{"pruner": "block", "block": "32x32"}, {"pruner": "block", "block": "1x32"},
            {"pruner": "block", "block": "1x1"}, {"pruner": "l1norm", "block": None}]
grid = {"model": "digits-ffn", "pattern": patterns, "sparsity": [0.5, 0.75, 0.9], "bits": [32, 8]}
if args.quick:
    grid = {"model": "digits-ffn", "pattern": patterns[:1] + patterns[2:3], "sparsity": [0.9], "bits": [32, 8]}

# %% Run (or resume) the sweep
df = sweep(grid, args.out, trial_kwargs={"runs": args.runs})
df["pattern"] = df["pruner"] + " " + df["block"].fillna("").astype(str)
print(df[["pattern", "sparsity", "bits", "accuracy", "latency_ms", "dense_latency_ms", "speedup", "flops_ratio",
          "sparsity_propagated", "kernel_choices"]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))

# %% Speedup by pattern and sparsity: where sparsity pays off in time, and where only in FLOPs
speedup = df.pivot_table(index=["pattern", "bits"], columns="sparsity", values="speedup")
flops = df.pivot_table(index=["pattern", "bits"], columns="sparsity", values="flops_ratio")
print("measured speedup over dense PyTorch:\n", speedup.round(2), "\n")
print("effective FLOPs / dense FLOPs:\n", flops.round(3))

# %% Fronts: latency-guided vs FLOPs-guided, both judged on measured latency
ref = reference_point(df)
for guide in ("latency", "flops"):
    front = guided_front(df, guide)
    print(f"{guide}-guided front ({len(front)} trials), hypervolume {front_hypervolume(df, guide, ref):.4g}:")
    print(front[["pattern", "sparsity", "bits", "accuracy", "latency_ms", "flops_ratio"]].to_string(index=False))
print(objective_picks(df, target=0.5).to_string(index=False, float_format=lambda v: f"{v:.4g}"))

# %% Figures and the report
images = plot_results(df, args.out)
report = write_report(df, args.out / "report.md", images=images)
print("wrote", *images, report, sep="\n  ")  # in a notebook front end, open the PNGs beside the report
