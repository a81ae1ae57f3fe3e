"""Latency-guided search on SmolLM2-135M, its front re-scored, against llama.cpp's quantization ladder in one run.

1. `llm_search` (sparta_explore.explore.llm): `--trials` points per guide and seed, each compressed in
   one calibration pass (`--calib-windows`), scored on `--eval-windows` windows, decode timed through
   the compiled step; rows go to the shared `--log` (a rerun reads them back instead of running again).
2. The front of each guide over its seeds (perplexity against decode speed relative to the model as given,
   timed beside each trial) is compressed again and scored on `--final-windows` windows of 512 tokens, and
   its decode timed again, beside the dense model.
3. llama.cpp (`--peer-python`, its own venv) re-quantizes the same GGUF to each `--peer-types` type and
   scores the same windows, then prefill and decode of the same 128-token prompt at the same threads.

Prints every trial, the re-scored fronts, the ladder, and for each llama.cpp type whether a front point
dominates it (perplexity at most the type's and decode tokens/s at least the type's); writes the rows
as CSV and the Pareto plot as PNG (`--out`).

    .venv/bin/python benchmarks/llm_search.py --peer-python .venv-llm-peer/bin/python \
        [--trials 24] [--guides latency] [--seeds 0] [--startup 8] [--bands 3] [--eval-windows 4] [--calib-windows 8] \
        [--final-windows 16] [--new 16] [--repeats 7] [--threads 2] [--log results/llm/trials.jsonl] \
        [--out docs/benchmarks/llm_search]
"""

from __future__ import annotations

import argparse
import copy
import math
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from llm import peer_rows  # this script's folder is on sys.path
from llm_ours import log
from llm_peer import QUANT_TYPES

from sparta_explore.compile.package.decoder_form import packed_for_decode
from sparta_explore.explore.llm.compress import compress_llm
from sparta_explore.explore.llm.prefix import CalibrationCache
from sparta_explore.explore.llm.search import GUIDES, llm_search
from sparta_explore.explore.llm.space import LLMPoint
from sparta_explore.explore.llm.trial import TrialBudget, decode_timing, perplexity_of
from sparta_explore.zoo.llm import cut_windows, load_smollm2_tokenizer, smollm2_workload, token_stream

SEQ_LEN, PROMPT_LEN = 512, 128


def front(rows: pd.DataFrame, speed: str = "decode_tok_s") -> pd.DataFrame:
    """The rows no other row beats on both perplexity (lower) and `speed` (higher), fastest first.

    Example:
        >>> front(pd.DataFrame({"perplexity": [15, 16, 17], "decode_tok_s": [90, 100, 95]})).perplexity.tolist()
        [16, 15]
    """
    ok = rows.dropna(subset=["perplexity", speed]).sort_values([speed, "perplexity"], ascending=[False, True])
    best, keep = math.inf, []
    for index, row in ok.iterrows():
        if row["perplexity"] < best:
            keep.append(index)
            best = row["perplexity"]
    return ok.loc[keep]


def dominated_types(ours: pd.DataFrame, ladder: pd.DataFrame) -> list[str]:
    """One line per llama.cpp type: which of our rows dominates it, if any.

    Example:
        >>> dominated_types(pd.DataFrame({"name": ["a"], "perplexity": [15.0], "decode_tok_s": [120.0]}),
        ...                 pd.DataFrame({"name": ["Q8_0"], "perplexity": [15.1], "decode_tok_s": [100.0]}))
        ['Q8_0 (ppl 15.100, 100.0 tok/s): dominated by a (ppl 15.000, 120.0 tok/s)']
    """
    lines = []
    for _, t in ladder.iterrows():
        by = ours[(ours.perplexity <= t.perplexity) & (ours.decode_tok_s >= t.decode_tok_s)]
        head = f"{t['name']} (ppl {t.perplexity:.3f}, {t.decode_tok_s:.1f} tok/s): "
        if len(by):
            b = by.sort_values("decode_tok_s", ascending=False).iloc[0]
            lines.append(head + f"dominated by {b['name']} (ppl {b.perplexity:.3f}, {b.decode_tok_s:.1f} tok/s)")
        else:
            lines.append(head + "not dominated")
    return lines


def rescore(params: dict[str, Any], final: Any, calib: torch.Tensor, budget: TrialBudget, bands: int,
            cache: CalibrationCache) -> dict:
    """A front point compressed again (from the search's kept calibration), scored on the final windows and its
    decode timed again."""
    point = LLMPoint.from_dict(params, layers=len(final.dense_model().model.layers), bands=bands)
    model = copy.deepcopy(final.dense_model())
    compress_llm(model, point, calib, act_order=budget.act_order, mse=budget.mse, cache=cache)
    packed = packed_for_decode(model)  # scored as the step reads it, and packed once
    timing = decode_timing(model, final.timing_inputs(1)[0], point.act_bits, budget, packed)
    return {"perplexity": perplexity_of(final, model, point.act_bits), **timing}


def plot(trials: pd.DataFrame, fronts: pd.DataFrame, ladder: pd.DataFrame, dense: dict, path: Path) -> None:
    """Perplexity against decode tokens/s: every trial (search windows), the re-scored fronts, llama.cpp."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ok = trials.dropna(subset=["perplexity", "decode_tok_s"])
    ax.scatter(ok.decode_tok_s, ok.perplexity, s=12, c="0.7", label="trials (search windows)")
    for guide, f in fronts.groupby("search"):
        line = front(f).sort_values("decode_tok_s")
        drawn = ax.plot(line.decode_tok_s, line.perplexity, "o-", label=f"{guide}-guided front (final windows)")
        ax.scatter(f.decode_tok_s, f.perplexity, facecolors="none", edgecolors=drawn[0].get_color())
    ax.scatter(ladder.decode_tok_s, ladder.perplexity, marker="s", c="tab:red", label="llama.cpp")
    for _, t in ladder.iterrows():
        ax.annotate(t["name"], (t.decode_tok_s, t.perplexity), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.scatter([dense["decode_tok_s"]], [dense["perplexity"]], marker="*", s=80, c="k", label="dense (own grids)")
    ax.set_xlabel("decode tokens/s (higher is better)")
    ax.set_ylabel("perplexity (lower is better)")
    ax.set_ylim(0.95 * dense["perplexity"], min(ax.get_ylim()[1], 2.0 * dense["perplexity"]))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def search_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments every SmolLM2 search script takes: bands, windows, the decode timing, threads."""
    p.add_argument("--bands", type=int, default=3)
    p.add_argument("--eval-windows", type=int, default=4)
    p.add_argument("--calib-windows", type=int, default=8)
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)


def search_setup(args: argparse.Namespace) -> tuple[TrialBudget, Any]:
    """Threads set, warnings off; the trial budget and the search's workload from `search_arguments`."""
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    budget = TrialBudget(new=args.new, repeats=args.repeats, threads=args.threads)
    return budget, smollm2_workload(eval_windows=args.eval_windows, calibration_windows=args.calib_windows)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=24)
    p.add_argument("--guides", nargs="+", choices=list(GUIDES), default=["latency"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--startup", type=int, default=8, help="random points after the anchors (llm_protocol uses 6)")
    search_arguments(p)
    p.add_argument("--final-windows", type=int, default=16)
    p.add_argument("--log", type=Path, default=Path("results/llm/trials.jsonl"))
    p.add_argument("--out", type=Path, default=Path("results/llm/search"), help="CSV and PNG path (no suffix)")
    p.add_argument("--peer-python", type=Path, help="python of the llama.cpp venv (.venv-llm-peer/bin/python)")
    p.add_argument("--peer-types", nargs="+", choices=QUANT_TYPES, default=list(QUANT_TYPES))
    p.add_argument("--peer-cache", type=Path, default=Path(tempfile.gettempdir()) / "sparta-llm-peer")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    budget, search = search_setup(args)
    cache, trials = CalibrationCache(), []
    for guide in args.guides:
        for seed in args.seeds:
            log(f"{guide}-guided search, seed {seed}: {args.trials} trials")
            trials.append(llm_search(search, trials=args.trials, log=args.log, guide=guide, seed=seed,
                                     bands=args.bands, startup=args.startup, budget=budget, echo=log,
                                     cache=cache))
    trials = pd.concat(trials, ignore_index=True)
    final = smollm2_workload(eval_windows=args.final_windows, calibration_windows=args.calib_windows)
    calib = search.calibration_inputs[0]
    log(f"dense: perplexity on {args.final_windows} windows, decode")
    dense = {"name": "dense", "perplexity": final.evaluate(final.dense_model()),
             **decode_timing(final.dense_model(), final.timing_inputs(1)[0], 32, budget)}
    fronts, layers = [], len(search.dense_model().model.layers)
    # one front per guide over all its seeds' trials, by speed relative to the model as given timed beside each
    # trial (absolute tokens/s drift between trials run hours apart)
    for guide, rows in trials.groupby("search"):
        pooled = front(rows.assign(relative_speed=1 / rows["latency_ratio"]), speed="relative_speed")
        for _, row in pooled.drop_duplicates("key").iterrows():
            params = {k: row[k] for k in LLMPoint.from_dict({}, layers=layers, bands=args.bands).to_dict()}
            log(f"{guide} front: re-scoring seed {row['seed']} trial {row['trial']} ({row['perplexity']:.3f} on "
                f"{args.eval_windows}, latency ratio {row['latency_ratio']:.3f})")
            fronts.append({"name": f"{guide}/{row['seed']}/t{row['trial']}", "search": guide, "seed": row["seed"],
                           "trial": row["trial"], "search_perplexity": row["perplexity"],
                           "search_latency_ratio": row["latency_ratio"],
                           **rescore(params, final, calib, budget, args.bands, cache), **params})
    fronts = pd.DataFrame(fronts)
    ladder = pd.DataFrame()
    if args.peer_python is not None:
        tokenizer = load_smollm2_tokenizer()
        evaluation = token_stream(tokenizer, "evaluation")
        windows = cut_windows(evaluation, SEQ_LEN, args.final_windows, what="the evaluation split")
        prompt = cut_windows(evaluation, PROMPT_LEN, 1)[0].tolist()
        peers, failure, _ = peer_rows(args, args.peer_types, windows, prompt)
        if failure:
            log(f"llama.cpp did not run: {failure}")
        ladder = pd.DataFrame([{"name": r.name.removeprefix("llama.cpp-"), "perplexity": r.ppl,
                                "prefill_ms": r.prefill_ms, "decode_tok_s": r.decode_tok_s, "MB": r.weights_mb}
                               for r in peers])
    pd.set_option("display.width", 200)
    shown = ["search", "seed", "trial", "perplexity", "decode_tok_s", "latency_ratio", "flops_ratio", "bytes_ratio",
             "mb_token", "compress_s", "wall_s"]
    print(trials[[c for c in shown if c in trials]].round(3).to_string(index=False))
    print(f"\ndense: ppl {dense['perplexity']:.3f} on {args.final_windows} windows, "
          f"{dense['decode_tok_s']:.1f} tok/s, prefill {dense['prefill_ms']:.0f} ms")
    print(fronts[["name", "search_perplexity", "search_latency_ratio", "perplexity", "decode_tok_s", "prefill_ms",
                  "mb_token"]]
          .round(3).to_string(index=False))
    if len(ladder):
        print(ladder.round(3).to_string(index=False))
        for line in dominated_types(fronts, ladder):
            print(line)
        print(f"front points dominating llama.cpp types: "
              f"{sum('dominated by' in line for line in dominated_types(fronts, ladder))} of {len(ladder)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.concat([trials.assign(kind="trial"), fronts.assign(kind="front"), ladder.assign(kind="llama.cpp"),
               pd.DataFrame([dense]).assign(kind="dense")], ignore_index=True).to_csv(args.out.with_suffix(".csv"),
                                                                                    index=False)
    plot(trials, fronts, ladder if len(ladder) else pd.DataFrame(columns=["name", "perplexity", "decode_tok_s"]),
         dense, args.out.with_suffix(".png"))
    print(f"rows -> {args.out.with_suffix('.csv')}, plot -> {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
