# %% [markdown]
# # Latency-guided vs FLOPs-guided NNI search, judged on measured latency
#
# Reads the exported trials of one latency-guided and one FLOPs-guided experiment
# (`sparta-explore nni experiments/latency_guided.yml` and `.../flops_guided.yml`, or
# `sparta-explore nni results/nni/<id>` after `nnictl create`), and reports for each:
#
# * the hypervolume of its trials' front on (measured latency / dense latency, accuracy),
#   reference (1.0, 0): the area of trade-offs it found that beat dense PyTorch;
# * the same on milliseconds, of the front each search *keeps* (`pareto.front_hypervolume`:
#   non-dominated on measured latency for the latency-guided one, on effective FLOPs for
#   the FLOPs-guided one), against one reference for both (the median dense latency);
# * the best model under the latency target: the most accurate trial whose measured
#   latency is at most `target` x dense, and the trial the search's own objective ranks
#   first, with whether its measured latency meets the target.
#
# Run: `python experiments/nni_compare.py --latency results/nni/<id1> --flops results/nni/<id2>`.

# %%
import argparse
from pathlib import Path

import pandas as pd

from sparta_explore.explore.report.pareto import front_hypervolume, hypervolume, reference_point
from sparta_explore.explore.report.sweep_report import markdown_table
from sparta_explore.explore.sweep import load_results

parser = argparse.ArgumentParser(description="latency-guided vs FLOPs-guided NNI experiments")
parser.add_argument("--latency", type=Path, required=True, help="latency-guided experiment folder or results CSV")
parser.add_argument("--flops", type=Path, required=True, help="FLOPs-guided experiment folder or results CSV")
parser.add_argument("--target", type=float, default=0.5, help="latency target, as a fraction of dense latency")
parser.add_argument("--out", type=Path, default=None, help="also write the markdown here")
args, _ = parser.parse_known_args()

runs = {"latency-guided": load_results(args.latency), "FLOPs-guided": load_results(args.flops)}
for df in runs.values():
    df["latency_ratio"] = df["latency_ms"] / df["dense_latency_ms"]

# %%
ref_ms = reference_point(pd.concat(runs.values(), ignore_index=True))


def label(row: pd.Series) -> str:
    """One trial's setting: per-layer sparsities when it had them, else the one sparsity."""
    layers = row.get("layer_sparsity")
    sparsity = layers if isinstance(layers, str) and layers else f"{row['sparsity']:g}"
    return f"{sparsity} {row['block']} {int(row['bits'])}b {row['scope']}"


rows = []
for name, df in runs.items():
    guide = "latency" if name.startswith("latency") else "flops"
    feasible = df[df["latency_ratio"] <= args.target]
    best = feasible.loc[feasible["accuracy"].idxmax()] if len(feasible) else None
    pick = df.loc[df["score"].idxmax()]  # what the search's own objective hands you
    rows.append({
        "search": name, "trials": len(df),
        "hv_ratio": hypervolume(df["latency_ratio"], df["accuracy"], ref=(1.0, 0.0)),
        "hv_kept_front_ms": front_hypervolume(df, guide, ref_ms),
        "best_under_target": "none" if best is None else label(best),
        "best_acc": None if best is None else best["accuracy"],
        "best_ratio": None if best is None else best["latency_ratio"],
        "pick": label(pick),
        "pick_acc": pick["accuracy"], "pick_ratio": pick["latency_ratio"],
        "pick_meets_target": bool(pick["latency_ratio"] <= args.target),
    })
summary = pd.DataFrame(rows)
text = (f"Latency target: {args.target:g} x dense latency (measured in the same trial). "
        f"ms reference: {ref_ms[0]:.2f} ms.\n\n" + markdown_table(summary) + "\n")
print(text)

# %%
for name, df in runs.items():
    cols = ["nni_trial", "sparsity", "layer_sparsity", "block", "bits", "scope", "accuracy", "latency_ms",
            "dense_latency_ms", "latency_ratio", "flops_ratio", "score", "nni_params_matched"]
    text += f"\n### {name}\n\n" + markdown_table(df.sort_values("latency_ratio"), [c for c in cols if c in df]) + "\n"
if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
