"""NNI trial entry: take NNI's parameters, run one trial, report each stage and the final row.

Run by NNI as ``.venv/bin/python -m sparta_explore.explore.nni.trial --objective latency``
(see experiments/*.yml). NNI's parameters (the search-space keys) are merged over the
fixed values given on the command line; a key given both ways is an error, so a config
never silently overrides its own search space.

What it reports:

* one intermediate result per pipeline stage run_trial announces: ``{"default": <stage
  number>, "stage": <what happened>, "elapsed_s": ...}``; a progress counter, so no
  assessor should be configured on it;
* the final result: ``{"default": <the configured objective's score>, **<the trial's
  results row>, "params": <TrialParams as run>, "nni_params": <NNI's parameters as
  received>, "nni_trial": ..., "nni_sequence": ...}``. Non-finite numbers become null,
  which NNI's JSON can carry.

NNI issue 5726: NNI's local training service gives parameters to trials in the order the
trials *ask*, so two trials starting together may swap parameters and NNI files each
under the other's record (and TPE then crashes on the wrong parameter_id). On the local
platform each trial therefore asks only after the trial of the previous sequence number
has received its parameters (a marker file per sequence number in the experiment's
environment folder; a trial waits at most ``--order-timeout`` seconds). The echo in the
final result stays the ground truth either way.

Example:
    >>> merge_params({"sparsity": 0.9}, {"objective": "flops"})
    {'objective': 'flops', 'sparsity': 0.9}
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparta_explore.errors import ConfigError

ORDER_FOLDER = "sparta_parameter_order"


@dataclass(frozen=True)
class TrialContext:
    """What NNI tells a trial process about itself (its runtime contract is environment variables).

    Example:
        >>> ctx = TrialContext.from_env({"NNI_PLATFORM": "local", "NNI_TRIAL_SEQ_ID": "3",
        ...                              "NNI_OUTPUT_DIR": "/x/environments/local-env/trials/AbCdE"})
        >>> ctx.sequence, ctx.order_dir
        (3, PosixPath('/x/environments/local-env/sparta_parameter_order'))
    """

    platform: str | None = None
    experiment: str | None = None
    trial: str | None = None
    sequence: int | None = None
    output_dir: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TrialContext:
        """Read NNI's trial variables from `env` (os.environ in a real trial)."""
        seq = env.get("NNI_TRIAL_SEQ_ID")
        out = env.get("NNI_OUTPUT_DIR")
        return cls(platform=env.get("NNI_PLATFORM"), experiment=env.get("NNI_EXP_ID"),
                   trial=env.get("NNI_TRIAL_JOB_ID"), sequence=int(seq) if seq not in (None, "", "-1") else None,
                   output_dir=Path(out) if out else None)

    @property
    def order_dir(self) -> Path | None:
        """Where trials of one local experiment leave their "got my parameters" markers."""
        if self.platform != "local" or self.output_dir is None or self.sequence is None:
            return None
        return self.output_dir.parents[1] / ORDER_FOLDER


def receive_in_order(get_next: Callable[[], dict[str, Any]], ctx: TrialContext, *, timeout_s: float = 120.0,
                     poll_s: float = 0.05) -> tuple[dict[str, Any], float]:
    """Ask NNI for parameters only after sequence number `ctx.sequence - 1` has; returns (params, waited s).

    Outside NNI's local platform it asks at once. A predecessor that never asks (it crashed
    first) costs `timeout_s`, after which the trial asks anyway.

    Example:
        >>> receive_in_order(lambda: {"sparsity": 0.5}, TrialContext())
        ({'sparsity': 0.5}, 0.0)
    """
    folder = ctx.order_dir
    if folder is None:
        return dict(get_next()), 0.0
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    if ctx.sequence and ctx.sequence > 0:
        previous = folder / str(ctx.sequence - 1)
        while not previous.exists() and time.monotonic() - start < timeout_s:
            time.sleep(poll_s)
    waited = time.monotonic() - start
    params = dict(get_next())
    (folder / str(ctx.sequence)).touch()
    return params, waited


def merge_params(nni_params: Mapping[str, Any], fixed: Mapping[str, Any]) -> dict[str, Any]:
    """NNI's parameters over the command line's fixed values; a key in both is a `ConfigError`.

    Example:
        >>> merge_params({"bits": 8}, {"bits": 32})
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: trial parameter(s) bits come from both the search space and the command line
    """
    both = sorted(set(nni_params) & set(fixed))
    if both:
        raise ConfigError(f"trial parameter(s) {', '.join(both)} come from both the search space and the command line")
    return {**fixed, **nni_params}


def json_safe(value: Any) -> Any:
    """`value` with NaN/inf as None and numpy/torch scalars as Python numbers (NNI's JSON has no NaN).

    Example:
        >>> json_safe({"a": float("nan"), "b": [1.5, float("inf")], "c": "x"})
        {'a': None, 'b': [1.5, None], 'c': 'x'}
    """
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def final_result(row: Mapping[str, Any], score: float, params: Mapping[str, Any], nni_params: Mapping[str, Any],
                 ctx: TrialContext) -> dict[str, Any]:
    """The dict a trial reports as its final result (see the module docstring).

    Example:
        >>> r = final_result({"accuracy": 0.9, "score": 0.9}, 0.9, {"bits": 8}, {"bits": 8}, TrialContext())
        >>> r["default"], r["nni_params"], r["params"]
        (0.9, {'bits': 8}, {'bits': 8})
    """
    out = {"default": score, **row, "params": dict(params), "nni_params": dict(nni_params),
           "nni_trial": ctx.trial, "nni_sequence": ctx.sequence}
    return json_safe(out)


def _kv(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set wants KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw  # a bare word such as block=32x32 or pruner=l1norm


def build_parser() -> argparse.ArgumentParser:
    """Arguments of the trial entry.

    Example:
        >>> build_parser().parse_args(["--objective", "flops", "--set", "finetune_epochs=0"]).set
        [('finetune_epochs', 0)]
    """
    p = argparse.ArgumentParser(prog="python -m sparta_explore.explore.nni.trial", description=__doc__.splitlines()[0])
    p.add_argument("--objective", default=None, help="objective whose score is the result's default")
    p.add_argument("--target", type=float, default=None, help="cost target as a fraction of the dense cost")
    p.add_argument("--workload", "--model", dest="workload", default=None,
                   help="built-in workload or 'module:attr' / 'file.py:attr' (default: TrialParams' default)")
    p.add_argument("--finetune-epochs", type=int, default=None, help="epochs of mask-respecting fine-tuning")
    p.add_argument("--set", type=_kv, action="append", default=[], metavar="KEY=VALUE",
                   help="any other fixed TrialParams field (JSON value), repeatable")
    p.add_argument("--runs", type=int, default=20, help="timed forward calls per latency measurement")
    p.add_argument("--warmup", type=int, default=3, help="untimed forward calls first")
    p.add_argument("--cache-dir", type=Path, default=None, help="trained weights, kernels and device profile")
    p.add_argument("--quick-profile", action="store_true",
                   help="use (or measure) the small device profile instead of the full one")
    p.add_argument("--compile", type=_kv, action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument of `compile` (JSON value), e.g. tune=false; repeatable")
    p.add_argument("--order-timeout", type=float, default=120.0,
                   help="seconds to wait for the previous trial to get its parameters (NNI issue 5726)")
    return p


def fixed_params(args: argparse.Namespace) -> dict[str, Any]:
    """The TrialParams fields the command line fixes.

    Example:
        >>> fixed_params(build_parser().parse_args(["--target", "0.4", "--set", "block=1x32"]))
        {'target': 0.4, 'block': '1x32'}
    """
    named = {"objective": args.objective, "target": args.target, "workload": args.workload,
             "finetune_epochs": args.finetune_epochs}
    out = {k: v for k, v in named.items() if v is not None}
    for key, value in args.set:
        if key in out:
            raise ConfigError(f"trial parameter {key} is given twice on the command line")
        out[key] = value
    return out


def compile_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for `compile` from ``--compile`` and ``--quick-profile``.

    Example:
        >>> compile_kwargs(build_parser().parse_args(["--compile", "tune=false", "--compile", "choose=predicted"]))
        {'tune': False, 'choose': 'predicted'}
    """
    out = dict(args.compile)
    if args.quick_profile:
        if "device" in out:
            raise ConfigError("--quick-profile and --compile device=... both choose the device profile")
        from sparta_explore.device import DeviceProfile

        out["device"] = DeviceProfile.load_or_measure(quick=True, cache_dir=args.cache_dir)
    return out


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one NNI trial (the module's entry point); returns the exit status.

    Example:
        >>> main(["--workload", "digits-mlp", "--set", "finetune_epochs=0"])  # doctest: +SKIP
    """
    import os

    import nni  # the trial side of NNI only; the heavy pipeline loads after the parameters arrive

    args = build_parser().parse_args(argv)
    fixed = fixed_params(args)
    ctx = TrialContext.from_env(os.environ if env is None else env)
    nni_params, waited = receive_in_order(nni.get_next_parameter, ctx, timeout_s=args.order_timeout)
    print(f"trial {ctx.trial} (sequence {ctx.sequence}) got {nni_params} after waiting {waited:.1f} s", flush=True)

    from sparta_explore.explore.trial.params import TrialParams
    from sparta_explore.explore.trial.run import run_trial

    params = TrialParams.from_dict(merge_params(nni_params, fixed))
    start = time.perf_counter()
    stages = 0

    def report_stage(line: str) -> None:
        nonlocal stages
        stages += 1
        print(line, flush=True)
        nni.report_intermediate_result({"default": float(stages), "stage": line,
                                        "elapsed_s": round(time.perf_counter() - start, 3)})

    result = run_trial(params, cache_dir=args.cache_dir, runs=args.runs, warmup=args.warmup,
                       compile_kwargs=compile_kwargs(args), echo=report_stage)
    final = final_result(result.as_row(), result.score, params.to_dict(), nni_params, ctx)
    nni.report_final_result(final)
    print(f"final: score {final['default']}, accuracy {final.get('accuracy')}, "
          f"latency {final.get('latency_ms')} ms (dense {final.get('dense_latency_ms')} ms)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
