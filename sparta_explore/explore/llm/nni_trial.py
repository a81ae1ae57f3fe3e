"""NNI trial entry for the LLM search: NNI's parameters are an `LLMPoint`; the final result is its row.

Run by NNI as ``.venv/bin/python -m sparta_explore.explore.llm.nni_trial --workload smollm2-135m``
(experiments/llm_latency_guided.yml). The point's row comes from the shared `TrialLog` (``--log``)
when it ran before (a resumed or repeated experiment), else from `run_llm_trial`, and is appended
there. Trials share calibration prefixes through files (``--prefix-cache``, default a folder
beside the log; `PrefixStore`): a trial starts after the depth bands an earlier trial, in any
process, compressed the same way. The final result:
``{"default": quality, **row, "nni_params": <as received>, ...}``; the tuner (`ParetoTuner`,
``cost: latency_ratio``) reads ``quality`` and the ratio from it, and files it under the echoed
parameters (NNI issue 5726).

Example:
    >>> build_parser().parse_args(["--workload", "smollm2-tiny", "--bands", "1"]).bands
    1
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sparta_explore.errors import ConfigError
from sparta_explore.explore.nni.trial import TrialContext, final_result, receive_in_order
from sparta_explore.workload import Workload

DEFAULT_LOG = Path("results/llm/trials.jsonl")


def llm_workload(name: str, *, eval_windows: int, calibration_windows: int) -> Workload:
    """The built-in LLM workloads at a search's window counts: "smollm2-135m" or "smollm2-tiny".

    Example:
        >>> llm_workload("smollm2-tiny", eval_windows=2, calibration_windows=2).name
        'smollm2-tiny'
    """
    from sparta_explore.zoo.llm.workloads import smollm2_tiny_workload, smollm2_workload

    makers = {"smollm2-135m": smollm2_workload, "smollm2-tiny": smollm2_tiny_workload}
    if name not in makers:
        raise ConfigError(f"--workload must be one of {', '.join(makers)}, got {name!r}")
    return makers[name](eval_windows=eval_windows, calibration_windows=calibration_windows)


def build_parser() -> argparse.ArgumentParser:
    """Arguments of the LLM trial entry."""
    p = argparse.ArgumentParser(prog="python -m sparta_explore.explore.llm.nni_trial",
                                description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="smollm2-135m", help="smollm2-135m or smollm2-tiny")
    p.add_argument("--bands", type=int, default=3, help="depth bands of the search space (its groups)")
    p.add_argument("--eval-windows", type=int, default=4, help="perplexity windows of 512 tokens")
    p.add_argument("--calibration-windows", type=int, default=8, help="calibration windows of 512 tokens")
    p.add_argument("--new", type=int, default=16, help="decode tokens timed after the prompt")
    p.add_argument("--repeats", type=int, default=7, help="timed decode rounds (median)")
    p.add_argument("--log", type=Path, default=DEFAULT_LOG, help="the shared trial log (JSON lines)")
    p.add_argument("--prefix-cache", type=Path, help="folder of calibration prefixes shared by trials "
                   "(default: prefix-cache beside the log)")
    p.add_argument("--prefix-cache-gb", type=float, default=8.0, help="the folder's size limit (0: no sharing)")
    p.add_argument("--order-timeout", type=float, default=120.0,
                   help="seconds to wait for the previous trial to get its parameters (NNI issue 5726)")
    return p


def run(args: argparse.Namespace, nni_params: Mapping[str, object]) -> dict[str, object]:
    """The row of NNI's parameters `nni_params`: logged, or run and logged.

    Example:
        >>> run(build_parser().parse_args(["--workload", "smollm2-tiny"]), {"bits@mlp.0": 4})  # doctest: +SKIP
    """
    from sparta_explore.explore.llm.prefix import CalibrationCache
    from sparta_explore.explore.llm.prefix_store import PrefixStore
    from sparta_explore.explore.llm.space import LLMPoint
    from sparta_explore.explore.llm.trial import TrialBudget, TrialLog, run_llm_trial

    workload = llm_workload(args.workload, eval_windows=args.eval_windows,
                            calibration_windows=args.calibration_windows)
    point = LLMPoint.from_dict(nni_params, layers=len(workload.dense_model().model.layers), bands=args.bands)
    budget = TrialBudget(new=args.new, repeats=args.repeats)
    log = TrialLog(args.log, machine=budget.machine)  # a row timed on another machine is measured again
    row = log.get(point)
    if row is None:
        if args.prefix_cache_gb < 0:
            raise ConfigError(f"--prefix-cache-gb must be >= 0, got {args.prefix_cache_gb}")
        folder = args.prefix_cache or args.log.parent / "prefix-cache"
        store = PrefixStore(folder, int(args.prefix_cache_gb * 2**30)) if args.prefix_cache_gb > 0 else None
        row = log.add(run_llm_trial(point, workload, budget, cache=CalibrationCache(store=store)))
    return row


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one NNI trial of the LLM search; returns the exit status."""
    import nni

    args = build_parser().parse_args(argv)
    ctx = TrialContext.from_env(os.environ if env is None else env)
    nni_params, waited = receive_in_order(nni.get_next_parameter, ctx, timeout_s=args.order_timeout)
    print(f"trial {ctx.trial} (sequence {ctx.sequence}) got {nni_params} after waiting {waited:.1f} s", flush=True)
    row = run(args, nni_params)
    final = final_result(row, float(row["quality"]), nni_params, nni_params, ctx)
    nni.report_final_result(final)
    print(f"final: perplexity {final.get('perplexity')}, {final.get('decode_tok_s')} tok/s, "
          f"latency ratio {final.get('latency_ratio')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
