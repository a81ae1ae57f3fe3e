# %% [markdown]
# # Does latency-guided search beat FLOPs-guided search? Seeds, error bars, one command.
#
# Per workload and seed, four searches with the same budget and the same random start:
# our Pareto TPE guided by measured latency, the same guided by FLOPs, and NNI's built-in
# TPE on a MnasNet-style reward under each cost (`sparta_explore.explore.search.searches`). Every
# trial is real (prune, fine-tune, compile, measure against dense PyTorch in the same
# trial) and records both costs; each search sees only its own. The report judges all of
# them on measured latency (`protocol_judge`): hypervolume, the pick under the target, and
# the speedup at equal accuracy over the FLOPs-guided pick.
#
#   .venv/bin/python experiments/latency_vs_flops.py                       # digits-ffn and digits-cnn-wide, 24 x 3
#   .venv/bin/python experiments/latency_vs_flops.py --workload my_pkg.models:workload --budget 16 --seeds 2
#
# Resumable: rerun the same command after a kill and finished trials are read from disk.
# Results: results/latency_vs_flops/<workload>/<machine>/{rows/,visits.csv,report.md,fronts.png}
# and results/latency_vs_flops/report.md (every workload run on this machine).

# %%
import argparse
import json
import logging
import time
import warnings
from pathlib import Path

from sparta_explore.explore.protocol.report import write_protocol_report
from sparta_explore.explore.protocol.run import ProtocolConfig, default_out, run_protocol
from sparta_explore.explore.search.family_space import FamilySpaceConfig
from sparta_explore.explore.search.searches import SEARCHES

DEFAULT_WORKLOADS = ["digits-ffn", "digits-cnn-wide,target=0.5"]


def workload_arg(text: str) -> tuple[str, dict]:
    """``name[,key=value...]``: a workload, the trial params fixed for it (e.g. batch=64) and its own target=."""
    name, *pairs = text.split(",")
    fixed = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"{pair!r} in --workload {text!r} is not key=value")
        try:
            fixed[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            fixed[key.strip()] = value.strip()  # a bare word such as block=32x32
    return name, fixed


parser = argparse.ArgumentParser(description="latency-guided vs FLOPs-guided search, with seeds")
parser.add_argument("--workload", action="append", type=workload_arg, default=None,
                    help=f"name[,key=value...]; repeatable (default: {' and '.join(DEFAULT_WORKLOADS)})")
parser.add_argument("--budget", type=int, default=24, help="trials per search (default 24)")
parser.add_argument("--seeds", type=int, default=3, help="seeds 0..S-1 (default 3)")
parser.add_argument("--startup", type=int, default=8, help="shared random start, in trials (default 8)")
parser.add_argument("--target", type=float, default=0.25, help="latency target, a fraction of dense (0.25)")
parser.add_argument("--searches", nargs="+", default=list(SEARCHES), choices=list(SEARCHES))
parser.add_argument("--runs", type=int, default=20, help="timed calls per latency measurement (20)")
parser.add_argument("--tune", action="store_true", help="let compile search kernel tiles (~4x compile time)")
parser.add_argument("--patterns", nargs="+", default=None, help="pruning families (default: all)")
parser.add_argument("--precisions", nargs="+", default=None, help="precisions (default: fp32 w8a8 w4a8)")
parser.add_argument("--tag", default="", help="folder suffix for a run over another space (e.g. fp32)")
parser.add_argument("--root", type=Path, default=Path("results/latency_vs_flops"))
args = parser.parse_args()
warnings.filterwarnings("ignore", category=UserWarning)
logging.getLogger("nni").setLevel(logging.WARNING)  # NNI's TPE logs every replayed trial at INFO

# %%
sections, started = [], time.perf_counter()
for name, fixed in args.workload or [workload_arg(w) for w in DEFAULT_WORKLOADS]:
    space = FamilySpaceConfig(workload=name, **({"patterns": tuple(args.patterns)} if args.patterns else {}),
                              **({"precisions": tuple(args.precisions)} if args.precisions else {}))
    target = float(fixed.pop("target", args.target))  # a workload's own target: "digits-cnn-wide,target=0.5"
    config = ProtocolConfig(workload=name, budget=args.budget, seeds=tuple(range(args.seeds)), startup=args.startup,
                            target=target, searches=tuple(args.searches), space=space, fixed=fixed,
                            runs=args.runs, tune=args.tune)
    out = default_out(name, args.root, args.tag)
    print(f"== {name} -> {out}", flush=True)
    run_protocol(config, out, echo=lambda line: print(line, flush=True))
    text = write_protocol_report(out)
    sections.append(text.replace("](fronts.png)", f"]({out.relative_to(args.root) / 'fronts.png'})"))
    print(text, flush=True)

# %%
summary = args.root / "report.md"
summary.write_text("\n\n".join(sections))
print(f"wrote {summary} ({(time.perf_counter() - started) / 60:.1f} min)")
