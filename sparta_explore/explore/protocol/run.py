"""The latency-vs-FLOPs protocol: per seed, every registered search with the same budget and random start.

`run_protocol(ProtocolConfig(workload="digits-ffn", budget=24, seeds=(0, 1, 2)), out)`:

1. builds the workload's family search space (`family_space`);
2. per seed, draws `startup` distinct random points (the shared random start), measures
   them, and tells every search; then each search proposes points until it has `budget`.
   The Pareto searches get an accuracy floor, the judge's reference accuracy (dense minus
   `floor_drop`, from the start trials), so fast models at chance accuracy are not what
   they model as good;
3. every point is one real trial (`run_trial`: prune, fine-tune, compile, measure latency
   against dense and count FLOPs) with the trial seed = the protocol seed. Each search
   *sees* only its own cost (`searches`), but every row has both;
4. writes ``visits.csv`` (seed, search, step, point, key: which trial each search made).

Resumable: trials are stored in ``out/rows`` as a sweep stores them (`sweep.sweep`, keyed
by the trial's params), and the searches are deterministic given their seed and what they
were told, so a rerun replays them, reading every finished trial from disk instead of
running it again. Two searches that propose the same point share its one measurement.
A trial that raises is stored as a failed row (its error kept) and told to the searches
as a failure, so a rerun does not retry it.

Rows are measured on this machine: ``out`` is per machine (`default_out`), so a folder
never mixes latencies from two machines.

Example:
    >>> cfg = ProtocolConfig(workload="digits-mlp", budget=4, seeds=(0,), startup=2)
    >>> visits = run_protocol(cfg, "results/lvf-doc")  # doctest: +SKIP
    >>> visits.groupby("search").size().tolist()       # doctest: +SKIP
    [4, 4, 4, 4]
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sparta_explore.cache import atomic_write
from sparta_explore.errors import ConfigError
from sparta_explore.explore.protocol.judge import REF_ACCURACY_DROP
from sparta_explore.explore.search.dimensions import Space
from sparta_explore.explore.search.family_space import FamilySpaceConfig, family_search_space
from sparta_explore.explore.search.searches import SEARCHES, make_search
from sparta_explore.explore.sweep.folder import load_results, write_csv
from sparta_explore.explore.sweep.run import sweep
from sparta_explore.explore.trial.params import TrialParams, format_layer_sparsity
from sparta_explore.explore.trial.result import ROW_COLUMNS
from sparta_explore.explore.trial.run import run_trial
from sparta_explore.quality import row_quality

VISITS_CSV = "visits.csv"
CONFIG_JSON = "protocol.json"
TrialFn = Callable[[TrialParams], Mapping[str, Any]]


@dataclass(frozen=True)
class ProtocolConfig:
    """One protocol run: the workload, its space, the searches, budget, seeds and trial settings.

    `fixed`: TrialParams fields every trial shares (e.g. ``{"batch": 256}``); `runs`: timed
    calls per latency measurement; `tune`: compile's tile search (off by default: it
    multiplies compile time by ~4 for ~10% latency, the same for every search);
    `compile_cap`: seconds each trial's compile may take before the remaining ops take the
    device profile's favourite untimed (`CompileConfig.max_seconds`; None: no cap);
    `floor_drop`: the searches' accuracy floor below dense (None: no floor).

    Example:
        >>> ProtocolConfig(budget=4, startup=8)
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: startup (8) must be below the budget (4): every search needs proposals
    """

    workload: str = "digits-ffn"
    budget: int = 24
    seeds: tuple[int, ...] = (0, 1, 2)
    startup: int = 8
    target: float = 0.25
    searches: tuple[str, ...] = tuple(SEARCHES)
    space: FamilySpaceConfig | None = None
    fixed: Mapping[str, Any] = field(default_factory=dict)
    runs: int = 20
    tune: bool = False
    compile_cap: float | None = None
    floor_drop: float | None = REF_ACCURACY_DROP

    def __post_init__(self) -> None:
        if self.startup < 1 or self.startup >= self.budget:
            raise ConfigError(f"startup ({self.startup}) must be below the budget ({self.budget}): every search "
                              "needs proposals")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {list(self.seeds)}")
        for name in self.searches:
            if name not in SEARCHES:
                raise ConfigError(f"unknown search {name!r}; registered: {', '.join(SEARCHES)}")
        bad = sorted(set(self.fixed) & {"workload", "seed", "pattern", "precision"})
        if bad:
            raise ConfigError(f"fixed params {bad} are set by the protocol itself")
        self.params({}, self.seeds[0])  # fixed keys are validated now, not in trial 17

    @property
    def family_space(self) -> FamilySpaceConfig:
        """The space config (the workload's default one unless given)."""
        return self.space or FamilySpaceConfig(workload=self.workload)

    def params(self, point: Mapping[str, Any], seed: int) -> TrialParams:
        """The trial a search point stands for (the objective column is the latency one for every search)."""
        return TrialParams.from_dict({**self.fixed, **point, "workload": self.workload, "seed": seed,
                                      "objective": "latency", "target": self.target})

    def to_json(self) -> str:
        """What the run was, for the report and for a rerun to check it continues the same protocol."""
        out = asdict(self)
        out["space"] = asdict(self.family_space)
        return json.dumps(out, sort_keys=True, default=list)


def start_points(space: Mapping[str, Any], seed: int, count: int) -> list[dict[str, Any]]:
    """`count` distinct random points of `space`: the random start every search of `seed` shares.

    Example:
        >>> sp = {"a": {"_type": "choice", "_value": [1, 2, 3]}}
        >>> sorted(p["a"] for p in start_points(sp, 0, 3))
        [1, 2, 3]
    """
    dims = Space.from_nni(space)
    if count > dims.size:
        raise ConfigError(f"the space has {dims.size:g} points, fewer than the {count} start points")
    rng, points, seen = random.Random(f"start-{seed}"), [], set()
    while len(points) < count:
        p = dims.sample(rng)
        if dims.key_of(p) not in seen:
            seen.add(dims.key_of(p))
            points.append(p)
    return points


def failed_row(params: TrialParams, error: BaseException) -> dict[str, Any]:
    """A results row for a trial that raised: the params, no metrics, the error's last line.

    Example:
        >>> failed_row(TrialParams(), ValueError("boom"))["error"]
        'ValueError: boom'
    """
    row: dict[str, Any] = dict.fromkeys(ROW_COLUMNS)
    row.update({k: v for k, v in params.to_dict().items() if k in row})
    row["layer_sparsity"] = format_layer_sparsity(params.layer_sparsity)
    row["error"] = f"{type(error).__name__}: {error}"
    return row


def _safe_trial(fn: TrialFn) -> Callable[[TrialParams], Mapping[str, Any]]:
    def trial(params: TrialParams) -> Mapping[str, Any]:
        try:
            result = fn(params)
        except Exception as e:  # noqa: BLE001 - a failed trial is a result; the searches are told it failed
            traceback.print_exc()
            return failed_row(params, e)
        return result.as_row() if hasattr(result, "as_row") else result
    return trial


def default_out(workload: str, root: str | os.PathLike = "results/latency_vs_flops", tag: str = "") -> Path:
    """``root/<workload>[-<tag>]/<machine key>``: one folder per workload (and space tag) and measuring machine.

    Example:
        >>> default_out("digits-ffn").parts[:3], default_out("digits-ffn", tag="fp32").parts[2]
        (('results', 'latency_vs_flops', 'digits-ffn'), 'digits-ffn-fp32')
    """
    from sparta_explore.machine import this_machine

    slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in workload + (f"-{tag}" if tag else ""))
    return Path(root) / slug / this_machine().key


def run_protocol(config: ProtocolConfig, out: str | os.PathLike, *, trial_fn: TrialFn | None = None,
                 echo: Callable[[str], None] = print) -> pd.DataFrame:
    """Run (or resume) the protocol into `out`; returns the visits (one row per search step).

    Example:
        >>> cfg = ProtocolConfig("digits-mlp", budget=4, seeds=(0,), startup=2)
        >>> visits = run_protocol(cfg, "/tmp/lvf")  # doctest: +SKIP
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    saved = folder / CONFIG_JSON
    if saved.exists() and json.loads(saved.read_text()) != json.loads(config.to_json()):
        raise ConfigError(f"{folder} holds a run of another protocol ({saved}); use a fresh --out folder")
    atomic_write(saved, lambda f: f.write(config.to_json().encode()))
    space = family_search_space(config.family_space)
    compile_kwargs = {"tune": config.tune, "max_seconds": config.compile_cap}
    run = _safe_trial(trial_fn or (lambda p: run_trial(p, runs=config.runs, compile_kwargs=compile_kwargs)))
    visits: list[dict[str, Any]] = []
    started = time.perf_counter()

    def measure(point: Mapping[str, Any], seed: int) -> dict[str, Any]:
        return sweep([config.params(point, seed)], folder, trial_fn=run, progress=False).iloc[0].to_dict()

    for seed in config.seeds:
        start = start_points(space, seed, config.startup)
        start_rows = [measure(p, seed) for p in start]
        floor = accuracy_floor(start_rows, config.floor_drop)
        for name in config.searches:
            search = make_search(name, space, seed=seed, startup=config.startup, target=config.target, floor=floor)
            for step, (point, row) in enumerate(zip(start, start_rows)):
                search.observe(point, row)
                visits.append(_visit(seed, name, step, point, row))
            for step in range(config.startup, config.budget):
                point = search.propose()
                row = measure(point, seed)
                search.observe(point, row)
                visits.append(_visit(seed, name, step, point, row))
                write_csv(pd.DataFrame(visits), folder / VISITS_CSV)
            echo(f"seed {seed} {name}: {config.budget} trials ({time.perf_counter() - started:.0f} s so far)")
    write_csv(pd.DataFrame(visits), folder / VISITS_CSV)
    return pd.DataFrame(visits)


def accuracy_floor(rows: list[Mapping[str, Any]], drop: float | None) -> float | None:
    """Median dense quality of `rows` minus `drop` (None without a drop or a finished row).

    The dense quality is the dense accuracy, or 1.0 for a metric to minimize (`sparta_explore.quality`).

    Example:
        >>> accuracy_floor([{"dense_accuracy": 0.98}, {"dense_accuracy": None}], 0.1)
        0.88
    """
    dense = [row_quality({**r, "accuracy": float(r["dense_accuracy"]), "quality": None}) for r in rows
             if r.get("dense_accuracy") is not None and math.isfinite(float(r["dense_accuracy"]))]
    if drop is None or not dense:
        return None
    return round(float(statistics.median(dense)) - drop, 4)


def _visit(seed: int, search: str, step: int, point: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, Any]:
    return {"seed": seed, "search": search, "step": step, "point": json.dumps(dict(point), sort_keys=True),
            "key": row["key"]}


def load_protocol(out: str | os.PathLike) -> pd.DataFrame:
    """Every visit of a protocol folder joined with its trial's row (one row per search step).

    Example:
        >>> df = load_protocol("results/latency_vs_flops/digits-ffn/<machine>")  # doctest: +SKIP
        >>> df.groupby(["seed", "search"]).size()                                  # doctest: +SKIP
    """
    folder = Path(out)
    if not (folder / VISITS_CSV).exists():
        raise ConfigError(f"{folder} has no {VISITS_CSV}: run the protocol into it first")
    visits = pd.read_csv(folder / VISITS_CSV)
    rows = load_results(folder).drop(columns=["seed"], errors="ignore")
    return visits.merge(rows, on="key", how="left", validate="many_to_one")
