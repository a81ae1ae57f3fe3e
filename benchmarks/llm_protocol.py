"""Latency-guided against FLOPs-guided LLM search on SmolLM2-135M, per seed, judged on measured decode latency.

For each seed, one search per guide (`llm_search`: `--trials` points, the first `--startup` after the
anchors random and so shared between guides of one seed), every trial's row in the shared `--log`
(a rerun reads rows back: the protocol resumes where it stopped). Calibration prefixes are shared
between all trials of the run (`CalibrationCache`).

Each search's front is what its own cost keeps (`guided_front`); every front is judged on the
decode latency measured in its trials, against the model as given (`judge.py`):

* hypervolume in (latency ratio, quality) up to (1.0, 0): the latency-guided one above the
  other guide's in every seed?
* at a perplexity at most 2% above one of the other front's points, the best speed-up of ours.

Prints the rows, per seed and guide the front and its hypervolume, the verdicts; writes rows as CSV
and a plot of each seed's fronts (`--out`).

    .venv/bin/python benchmarks/llm_protocol.py [--seeds 0 1 2] [--guides latency flops] [--trials 16] \
        [--startup 6] [--log results/llm/protocol.jsonl] [--out docs/benchmarks/llm_protocol]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from llm_ours import log  # this script's folder is on sys.path
from llm_search import search_arguments, search_setup

from sparta_explore.explore.llm.judge import front_hypervolume, guided_front, speedup_at_equal_perplexity
from sparta_explore.explore.llm.prefix import CalibrationCache
from sparta_explore.explore.llm.search import GUIDES, llm_search

SHOWN = ["search", "seed", "trial", "perplexity", "latency_ratio", "flops_ratio", "bytes_ratio", "decode_tok_s",
         "blocks_reused", "wall_s"]


def plot(fronts: dict[tuple[str, int], pd.DataFrame], trials: pd.DataFrame, path: Path) -> None:
    """One panel per seed: its trials and each guide's front, perplexity against measured latency ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(trials["seed"].unique())
    fig, axes = plt.subplots(1, len(seeds), figsize=(4.2 * len(seeds), 4), squeeze=False, sharey=True)
    for ax, seed in zip(axes[0], seeds):
        mine = trials[trials["seed"] == seed].dropna(subset=["perplexity", "latency_ratio"])
        ax.scatter(mine.latency_ratio, mine.perplexity, s=10, c="0.75", label="trials")
        for (guide, s), front in fronts.items():
            if s == seed and len(front):
                ax.step(front.latency_ratio, front.perplexity, "o-", where="post", label=f"{guide}-guided front")
        ax.axvline(1.0, c="k", lw=0.6, ls=":")
        ax.set_title(f"seed {seed}")
        ax.set_xlabel("decode latency / model as given")
        ax.set_ylim(0.97 * mine.perplexity.min(), 1.6 * mine.perplexity.min())
    axes[0][0].set_ylabel("perplexity (4 windows)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--startup", type=int, default=6, help="random points after the anchors (shared by a seed)")
    p.add_argument("--guides", nargs="+", choices=list(GUIDES), default=["latency", "flops"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    search_arguments(p)
    p.add_argument("--tolerance", type=float, default=0.02, help="perplexity tolerance of 'equal perplexity'")
    p.add_argument("--log", type=Path, default=Path("results/llm/protocol.jsonl"))
    p.add_argument("--out", type=Path, default=Path("results/llm/protocol"), help="CSV and PNG path (no suffix)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    budget, workload = search_setup(args)
    cache, runs = CalibrationCache(), []
    for seed in args.seeds:  # seed by seed: a stopped run leaves whole seeds
        for guide in args.guides:
            log(f"{guide}-guided search, seed {seed}: {args.trials} trials")
            runs.append(llm_search(workload, trials=args.trials, log=args.log, guide=guide, seed=seed,
                                   bands=args.bands, startup=args.startup, budget=budget, echo=log, cache=cache))
    trials = pd.concat(runs, ignore_index=True)
    log(f"calibration cache: {cache.stats()}")
    pd.set_option("display.width", 200)
    print(trials[[c for c in SHOWN if c in trials]].round(3).to_string(index=False))
    fronts = {(guide, seed): guided_front(rows, guide) for (guide, seed), rows in trials.groupby(["search", "seed"])}
    summary, wins = [], {g: 0 for g in args.guides if g != "latency"}
    for seed in args.seeds:
        hv = {g: front_hypervolume(fronts[(g, seed)]) for g in args.guides}
        for guide in args.guides:
            front = fronts[(guide, seed)]
            print(f"\nseed {seed}, {guide}-guided front (hypervolume {hv[guide]:.4f}):")
            print(front[["trial", "perplexity", "latency_ratio", "flops_ratio", "bytes_ratio"]].round(3)
                  .to_string(index=False))
        for other in (g for g in args.guides if g != "latency"):
            speedup, ours, theirs = speedup_at_equal_perplexity(fronts[("latency", seed)], fronts[(other, seed)],
                                                                args.tolerance)
            wins[other] += hv["latency"] > hv[other]
            pair = "" if ours is None else (f" (trial {ours['trial']}: ppl {ours['perplexity']:.3f}, ratio "
                                            f"{ours['latency_ratio']:.3f} vs {other} trial {theirs['trial']}: ppl "
                                            f"{theirs['perplexity']:.3f}, ratio {theirs['latency_ratio']:.3f})")
            summary.append({"seed": seed, "versus": other, "hv_latency": hv["latency"], "hv_other": hv[other],
                            "latency_higher": hv["latency"] > hv[other], "speedup": speedup})
            print(f"seed {seed}: hypervolume latency {hv['latency']:.4f} vs {other} {hv[other]:.4f}; "
                  f"speed-up at equal perplexity (<= {args.tolerance:.0%}): {speedup:.3f}x{pair}")
    summary = pd.DataFrame(summary)
    print("\n" + summary.round(4).to_string(index=False))
    for other, n in wins.items():
        speedups = summary[summary.versus == other].speedup
        print(f"latency-guided hypervolume above {other}-guided in {n} of {len(args.seeds)} seeds; "
              f"speed-up >= 1.3x at equal perplexity in {int((speedups >= 1.3).sum())} of {len(args.seeds)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    trials.to_csv(args.out.with_suffix(".csv"), index=False)
    plot(fronts, trials, args.out.with_suffix(".png"))
    print(f"rows -> {args.out.with_suffix('.csv')}, plot -> {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
