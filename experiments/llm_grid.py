# %% [markdown]
# # Where 4-bit MLPs pay off on SmolLM2-135M, judged by measured decode latency
#
# A grid over the LLM space (`sparta_explore.explore.llm`): GPTQ 4-bit on the MLPs of the
# last k depth bands (k = 0 .. bands), groups of 128 or 32, the activations' width (int8 or
# float). Every trial compresses in one calibration pass, scores perplexity and times decode
# through the compiled step in turns with the model as given. Trials that share their first
# bands share calibration (`CalibrationCache`: `blocks_reused` in the rows), and rows go to a
# JSON-lines log by point, so a rerun reads them back.
#
# Run with `python experiments/llm_grid.py [--log results/llm/grid.jsonl]`; `--quick` runs a
# 4-trial corner on the tiny random Llama (seconds). Each `# %%` cell also runs on its own in
# an editor with cell support.

# %%
import argparse
import itertools
import warnings
from pathlib import Path

import pandas as pd
import torch

from sparta_explore.explore.llm.judge import front_hypervolume, guided_front
from sparta_explore.explore.llm.nni_trial import llm_workload
from sparta_explore.explore.llm.prefix import CalibrationCache
from sparta_explore.explore.llm.space import LLMPoint
from sparta_explore.explore.llm.trial import TrialBudget, TrialLog, run_llm_trial

parser = argparse.ArgumentParser(description="4-bit MLPs by depth band x group x activation width")
parser.add_argument("--log", type=Path, default=Path("results/llm/grid.jsonl"))
parser.add_argument("--quick", action="store_true", help="a 4-trial corner on the tiny random Llama")
parser.add_argument("--bands", type=int, default=3)
parser.add_argument("--threads", type=int, default=2)
args, _ = parser.parse_known_args()
warnings.simplefilter("ignore")
torch.set_num_threads(args.threads)
pd.set_option("display.width", 160)

# %% The grid: how many of the last bands' MLPs go to 4 bits, their groups, the activations
if args.quick:
    workload, bands, budget = llm_workload("smollm2-tiny", eval_windows=4, calibration_windows=4), 1, \
        TrialBudget(new=4, repeats=1, threads=args.threads)
    grid = list(itertools.product([0, 1], [128], [8, 32]))
else:
    workload, bands, budget = llm_workload("smollm2-135m", eval_windows=4, calibration_windows=8), args.bands, \
        TrialBudget(threads=args.threads)
    grid = list(itertools.product(range(bands + 1), [128, 32], [8, 32]))
layers = len(workload.dense_model().model.layers)


def point(last: int, group: int, act_bits: int) -> LLMPoint:
    params = {"act_bits": act_bits}
    for band in range(bands - last, bands):
        params.update({f"bits@mlp.{band}": 4, f"group@mlp.{band}": group})
    return LLMPoint.from_dict(params, layers=layers, bands=bands)


# %% Run (or read back) every point; the cache carries calibration across points sharing bands
log, cache, rows = TrialLog(args.log, machine=budget.machine), CalibrationCache(), []
dense_ppl = workload.evaluate(workload.dense_model())
for last, group, act_bits in grid:
    p = point(last, group, act_bits)
    row = log.get(p) or log.add(run_llm_trial(p, workload, budget, dense_perplexity=dense_ppl, cache=cache))
    rows.append({"mlp_bands_4bit": last, "group": group, **row})
df = pd.DataFrame(rows)
print(df[["mlp_bands_4bit", "group", "act_bits", "perplexity", "decode_tok_s", "latency_ratio", "bytes_ratio",
          "mb_token", "blocks_reused", "compress_s"]].round(3).to_string(index=False))
print(f"calibration cache: {cache.stats()}")

# %% Fronts by each cost, judged on measured latency
for guide in ("latency", "bytes", "flops"):
    front = guided_front(df, guide)
    print(f"{guide}-guided front: hypervolume {front_hypervolume(front):.4f}, trials "
          f"{list(zip(front.mlp_bands_4bit, front.group, front.act_bits))}")
