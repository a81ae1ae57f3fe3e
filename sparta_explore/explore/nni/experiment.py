"""Run an NNI experiment from its YAML config to a results table: start, wait, stop, export.

`run_experiment("experiments/latency_guided.yml")` loads the config the way nnictl does
(relative paths are relative to the YAML file), starts NNI's manager on a free port
through NNI's Python API, waits until the configured number of trials has finished (or
the experiment ends, fails, or times out), always stops it, and exports the trials.

`export_trials(experiment_dir)` reads the experiment's own database
(``<dir>/db/nni.sqlite``), so it works as well on an experiment started with plain
``nnictl create`` and long stopped. Each row is the trial's echoed results row (see
`nni_trial`): the params are the ones the trial *ran*, which NNI's own record may get wrong
when trials run concurrently (NNI issue 5726); ``nni_params_matched`` says whether NNI's
record agreed. The columns are the sweep's (`trial.ROW_COLUMNS`) followed by `NNI_COLUMNS`,
so `sweep.load_results`, `pareto` and `report` read the CSV as they read a sweep's.

Example:
    >>> outcome = run_experiment("experiments/latency_guided.yml")  # doctest: +SKIP
    >>> outcome.counts, outcome.csv                                 # doctest: +SKIP
    ({'SUCCEEDED': 8}, PosixPath('results/nni/k3j5x9qz/results.csv'))
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sparta_explore.errors import ConfigError, FileFormatError, SpartaError

NNI_COLUMNS = ("nni_experiment", "nni_trial", "nni_sequence", "nni_parameter_id", "nni_status",
               "nni_params_matched", "nni_params")
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "USER_CANCELED", "SYS_CANCELED", "EARLY_STOPPED"})
ENDED = frozenset({"DONE", "STOPPED", "ERROR"})  # experiment states after which nothing more runs
RESULTS_CSV = "results.csv"


class ExperimentError(SpartaError, RuntimeError):
    """An NNI experiment failed to start or ended in NNI's ERROR state."""


@dataclass(frozen=True)
class ExperimentRun:
    """How to run one experiment config: overrides of its YAML and how long to wait.

    `max_trials` / `concurrency` override maxTrialNumber / trialConcurrency; `port` None
    picks a free port; `timeout_s` None waits as long as the experiment runs; `stall_s`:
    how long to wait with no trial running before concluding NNI's tuner has died.

    Example:
        >>> ExperimentRun("experiments/latency_guided.yml", max_trials=0)
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: max_trials must be >= 1, got 0
    """

    config: str | os.PathLike
    max_trials: int | None = None
    concurrency: int | None = None
    port: int | None = None
    timeout_s: float | None = None
    poll_s: float = 2.0
    stall_s: float = 120.0
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_trials", "concurrency"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise ConfigError(f"port must be in 1..65535, got {self.port}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.poll_s <= 0 or self.stall_s <= 0:
            raise ConfigError(f"poll_s and stall_s must be > 0, got {self.poll_s} and {self.stall_s}")


@dataclass(frozen=True)
class ExperimentOutcome:
    """What an experiment run left: its id and folder, NNI's last state, trial counts and the table.

    Example:
        >>> ExperimentOutcome("abc", Path("r/abc"), "DONE", {"SUCCEEDED": 2}, pd.DataFrame(), None, 1.0).finished
        2
    """

    id: str
    directory: Path
    status: str
    counts: dict[str, int]
    trials: pd.DataFrame
    csv: Path | None
    wall_s: float

    @property
    def finished(self) -> int:
        """Trials that reached a final state."""
        return sum(n for status, n in self.counts.items() if status in TERMINAL)


def free_port() -> int:
    """A TCP port nobody listens on right now (for one experiment's manager and web UI).

    Example:
        >>> 1024 <= free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_config_file(path: str | os.PathLike) -> Any:
    """NNI's ExperimentConfig of the YAML at `path`, validated; one clear error naming the file otherwise.

    Refuses what is not an NNI experiment config (binary, empty, invalid YAML, not a mapping,
    unknown fields, a config NNI's own validation rejects) with `FileFormatError` /
    `ConfigError`, before anything is started.

    Example:
        >>> check_config_file("experiments/latency_guided.yml").trial_concurrency  # doctest: +SKIP
        2
    """
    import yaml
    from nni.experiment.config import ExperimentConfig

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no experiment config at {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise FileFormatError(f"{path} is not an NNI experiment config: not UTF-8 text") from None
    try:
        content = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise FileFormatError(f"{path} is not valid YAML: {where}{getattr(e, 'problem', None) or e}") from None
    if not isinstance(content, dict) or not content:
        raise FileFormatError(f"{path} is not an NNI experiment config: expected a mapping of fields, "
                              f"got {'nothing' if content is None else type(content).__name__}")
    try:
        config = ExperimentConfig.load(str(path))
        config.canonical_copy()  # NNI validates types and required fields here
    except Exception as e:  # NNI raises AttributeError, TypeError, ValueError... for bad configs
        raise ConfigError(f"{path} is not a valid NNI experiment config: {type(e).__name__}: "
                          f"{' '.join(str(e).split())}") from None
    return config


def port_is_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:`port` right now (checked before NNI starts).

    Example:
        >>> port_is_free(free_port())
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def load_config(run: ExperimentRun) -> Any:
    """The NNI ExperimentConfig of `run.config` (paths resolved against the YAML's folder), overridden.

    Example:
        >>> cfg = load_config(ExperimentRun("experiments/latency_guided.yml", max_trials=2))  # doctest: +SKIP
        >>> cfg.max_trial_number, cfg.trial_concurrency  # doctest: +SKIP
        (2, 2)
    """
    path = Path(run.config)
    config = check_config_file(path)
    if run.max_trials is not None:
        config.max_trial_number = run.max_trials
    if run.concurrency is not None:
        config.trial_concurrency = run.concurrency
    for key, value in run.overrides.items():
        if not hasattr(config, key):
            raise ConfigError(f"NNI's ExperimentConfig has no field {key!r}")
        setattr(config, key, value)
    return config


def run_experiment(run: ExperimentRun | str | os.PathLike, *, out: str | os.PathLike | None = None,
                   echo: Callable[[str], None] | None = print) -> ExperimentOutcome:
    """Start the experiment of `run`, wait for its trials, stop it, export them to `out` (a CSV).

    `out` defaults to ``<experiment folder>/results.csv``. The manager is stopped however
    the wait ends (done, error, timeout, Ctrl-C). An experiment in NNI's ERROR state
    still exports what finished, then raises `ExperimentError` naming its logs.

    Example:
        >>> run_experiment(ExperimentRun("experiments/latency_guided.yml", max_trials=2))  # doctest: +SKIP
    """
    from nni.experiment import Experiment

    run = run if isinstance(run, ExperimentRun) else ExperimentRun(run)
    say = echo or (lambda line: None)
    config = load_config(run)
    if run.port is not None and not port_is_free(run.port):
        raise ConfigError(f"port {run.port} is in use; choose another --port or leave it out for a free one")
    target = config.max_trial_number
    experiment = Experiment(config)
    directory = Path(config.canonical_copy().experiment_working_directory) / experiment.id
    port = run.port or free_port()
    start = time.monotonic()
    status = "INITIALIZED"
    experiment.start(port)
    say(f"experiment {experiment.id} on http://127.0.0.1:{port} ({directory})")
    try:
        status = _wait(experiment, target, run, start, say)
    finally:
        experiment.stop()
    wall = time.monotonic() - start
    trials = export_trials(directory)
    csv = Path(out) if out is not None else directory / RESULTS_CSV
    from sparta_explore.explore.sweep.folder import write_csv

    write_csv(trials, csv)
    counts = trial_counts(directory)
    say(f"experiment {experiment.id}: {status}, trials {dict(counts)}, {len(trials)} rows -> {csv} ({wall:.0f} s)")
    if status in ("ERROR", "STALLED"):
        raise ExperimentError(f"experiment {experiment.id} ended {status}; see {directory / 'log'} "
                              "(nnimanager.log, dispatcher.log) and the trials' trial.log")
    return ExperimentOutcome(experiment.id, directory, status, dict(counts), trials, csv, wall)


def _wait(experiment: Any, target: int | None, run: ExperimentRun, start: float,
          say: Callable[[str], None]) -> str:
    seen: tuple[int, int] | None = None
    changed = time.monotonic()
    while True:
        status = experiment.get_status()
        jobs = experiment.list_trial_jobs()
        done = sum(job.status in TERMINAL for job in jobs)
        if (done, len(jobs)) != seen:
            if seen is None or done != seen[0]:
                say(f"  {status}: {done}/{target or '?'} trials finished")
            seen, changed = (done, len(jobs)), time.monotonic()
        if status in ENDED:
            return status
        if target is not None and done >= target:
            return "DONE"
        if done == len(jobs) and time.monotonic() - changed > run.stall_s:
            # nothing running and nothing new: NNI's tuner process died (it stays RUNNING then)
            say(f"  no trial started for {run.stall_s:.0f} s with none running; stopping")
            return "STALLED"
        if run.timeout_s is not None and time.monotonic() - start > run.timeout_s:
            say(f"  timed out after {run.timeout_s:.0f} s; stopping")
            return "TIMEOUT"
        time.sleep(run.poll_s)


def _database(directory: Path) -> Path:
    db = Path(directory) / "db" / "nni.sqlite"
    if not db.is_file():
        raise FileNotFoundError(f"no NNI database at {db} (expected an experiment folder: <working dir>/<id>)")
    return db


def _decode(data: str | None) -> Any:
    # NNI stores a metric as JSON text of the JSON text the trial sent: decode until it is not text
    value: Any = data
    for _ in range(3):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            break
    return value


def trial_counts(directory: str | os.PathLike) -> Counter[str]:
    """How many trials of an experiment folder are in each state (their last recorded event).

    Example:
        >>> trial_counts("results/nni/k3j5x9qz")  # doctest: +SKIP
        Counter({'SUCCEEDED': 8})
    """
    with sqlite3.connect(f"file:{_database(Path(directory))}?mode=ro", uri=True) as db:
        events = db.execute("SELECT trialJobId, event FROM TrialJobEvent ORDER BY timestamp").fetchall()
    last = {trial: event for trial, event in events}
    return Counter(last.values())


def export_trials(directory: str | os.PathLike) -> pd.DataFrame:
    """One row per trial of the experiment folder that reported a final result, by sequence number.

    Example:
        >>> export_trials("results/nni/k3j5x9qz")[["nni_trial", "sparsity", "accuracy"]]  # doctest: +SKIP
    """
    from sparta_explore.explore.trial.result import ROW_COLUMNS
    from sparta_explore.quality import as_bool, row_quality

    directory = Path(directory)
    database = _database(directory)
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            events = db.execute("SELECT trialJobId, event, data, sequenceId FROM TrialJobEvent "
                                "ORDER BY timestamp").fetchall()
            finals = db.execute("SELECT trialJobId, parameterId, data FROM MetricData WHERE type = 'FINAL' "
                                "ORDER BY timestamp").fetchall()
    except sqlite3.DatabaseError as e:
        raise FileFormatError(f"{database} is not a readable NNI database: {e}") from None
    status: dict[str, str] = {}
    recorded: dict[str, Any] = {}
    sequence: dict[str, int] = {}
    for trial, event, data, seq in events:
        status[trial] = event
        if seq is not None:
            sequence[trial] = int(seq)
        if data and trial not in recorded:
            recorded[trial] = (_decode(data) or {}).get("parameters")
    rows, extra = [], {}
    for trial, parameter_id, data in finals:
        result = _decode(data)
        if not isinstance(result, Mapping):
            result = {"score": result}  # a trial that reported a bare number (not nni_trial)
        row = {c: result.get(c) for c in ROW_COLUMNS}
        for key in result:  # columns of other trial kinds (the LLM search's), after the usual ones
            if key not in row and key not in NNI_COLUMNS and key not in ("default", "params"):
                extra[key] = None
                row[key] = result[key]
        if row["accuracy"] is not None:  # trials from before these columns measured accuracies
            row["higher_is_better"] = as_bool(row["higher_is_better"])
            row["quality"] = row_quality(row)
        echoed = result.get("nni_params")
        row.update(nni_experiment=directory.name, nni_trial=trial, nni_sequence=sequence.get(trial),
                   nni_parameter_id=int(parameter_id) if str(parameter_id).isdigit() else None,
                   nni_status=status.get(trial), nni_params_matched=_same_params(recorded.get(trial), echoed),
                   nni_params=json.dumps(echoed, sort_keys=True) if echoed is not None else None)
        rows.append(row)
    columns = list(ROW_COLUMNS) + list(extra) + list(NNI_COLUMNS)
    df = pd.DataFrame(rows, columns=columns)
    return df.sort_values("nni_sequence", kind="stable").reset_index(drop=True) if len(df) else df


def _same_params(recorded: Any, echoed: Any) -> bool | None:
    if recorded is None or echoed is None:
        return None
    return json.dumps(recorded, sort_keys=True) == json.dumps(echoed, sort_keys=True)
