"""Which trial to export: every finished trial of a results location, and the one the user asked for.

A results location is a sweep folder or a protocol folder (``rows/``), an NNI experiment
folder (``db/nni.sqlite``), a results CSV, or an LLM search's trial log (``.jsonl``: its
perplexity is the metric, decode ms a token the latency). A trial is named by its key, its NNI trial id
or its NNI sequence number (in that order), or a unique prefix of its key; or picked as the
best one:

* with a latency target (`max_latency_ms`, or `max_latency_ratio` of its dense latency):
  the most accurate trial within it (the faster of equals);
* with only an accuracy floor (`min_accuracy`, in the metric's units; for a metric to
  minimize, a perplexity, it is a ceiling): the fastest trial at or above it;
* with neither: the highest ``score`` (the objective the trials ran with).

"Most accurate" ranks by quality (`sparta_explore.quality`), so the lowest perplexity wins.

Failed trials (no metric or latency) are never picked.

Example:
    >>> pick_trial(load_trials("results/sweep"), best=True, max_latency_ms=1.0)["key"]   # doctest: +SKIP
    '3f2a9c1d0b7e'
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from sparta_explore.errors import ConfigError
from sparta_explore.quality import as_bool, quality_column


def load_trials(path: str | os.PathLike) -> pd.DataFrame:
    """The finished trials of a sweep or protocol folder, an NNI experiment folder, a results CSV or an LLM trial log.

    Example:
        >>> load_trials("results/demo")[["key", "accuracy", "latency_ms"]]   # doctest: +SKIP
    """
    from sparta_explore.explore.sweep import load_results

    path = Path(path)
    if path.suffix == ".jsonl":
        from sparta_explore.explore.llm.export import llm_trials

        if not path.is_file():
            raise ConfigError(f"{path}: no such LLM trial log")
        df = llm_trials(path)
    elif path.is_dir() and (path / "db" / "nni.sqlite").is_file():
        from sparta_explore.explore.nni.experiment import export_trials

        df = export_trials(path)
    else:
        df = load_results(path)
    if df.empty:
        raise ConfigError(f"{path} holds no finished trials to export")
    return df.reset_index(drop=True)


def _finished(df: pd.DataFrame) -> pd.DataFrame:
    ok = pd.to_numeric(df["accuracy"], errors="coerce").notna() & pd.to_numeric(df["latency_ms"], errors="coerce") \
        .notna() & df["params_json"].notna()
    return df[ok]


def _by_id(df: pd.DataFrame, trial: str) -> pd.Series:
    text = str(trial).strip()
    hits = df.iloc[0:0]
    # exact names first (a sequence number "12" is also the prefix of some key), then a key's prefix
    for column in ("key", "nni_trial", "nni_sequence"):
        if hits.empty and column in df.columns:
            values = df[column]
            if column == "nni_sequence":
                values = pd.to_numeric(values, errors="coerce").astype("Int64")
            hits = df[values.astype(str) == text]
    if hits.empty:
        hits = df[df["key"].astype(str).str.startswith(text)]
    if hits.empty:
        raise ConfigError(f"no trial {text!r}: give a key (or a unique prefix of one: {', '.join(df['key'][:3])}, "
                          "...), an NNI trial id or sequence number")
    if hits["key"].nunique() > 1:
        raise ConfigError(f"trial {text!r} is ambiguous: {', '.join(hits['key'])}")
    return hits.iloc[0]


def pick_trial(df: pd.DataFrame, *, trial: str | None = None, best: bool = False, min_accuracy: float | None = None,
               max_latency_ms: float | None = None, max_latency_ratio: float | None = None) -> pd.Series:
    """The row of the trial named `trial`, or of the best trial (see the module docstring).

    Example:
        >>> pick_trial(pd.DataFrame({"key": ["ab"], "accuracy": [0.9], "latency_ms": [1.0],
        ...                          "dense_latency_ms": [2.0], "params_json": ["{}"], "score": [1.0]}),
        ...            best=True)["key"]
        'ab'
    """
    if (trial is None) == (not best):
        raise ConfigError("name one trial (--trial ID) or ask for the best one (--best), not both")
    if trial is not None:
        return _by_id(df, trial)
    rows = _finished(df)
    metric = pd.to_numeric(rows["accuracy"])
    accuracy = quality_column(rows)
    higher = rows.get("higher_is_better", pd.Series(True, index=rows.index)).map(as_bool)
    latency = pd.to_numeric(rows["latency_ms"])
    keep = pd.Series(True, index=rows.index)
    if min_accuracy is not None:
        keep &= (metric >= min_accuracy).where(higher, metric <= min_accuracy)
    if max_latency_ms is not None:
        keep &= latency <= max_latency_ms
    if max_latency_ratio is not None:
        keep &= latency <= max_latency_ratio * pd.to_numeric(rows["dense_latency_ms"])
    rows = rows[keep]
    if rows.empty:
        bound = ">=" if higher.all() else "<=" if not higher.any() else "at least / at most"
        names = df["metric_name"].dropna() if "metric_name" in df.columns else pd.Series([], dtype=object)
        name = str(names.iloc[0]) if len(names) else "accuracy"
        wants = [f"{name} {bound} {min_accuracy:g}" if min_accuracy is not None else "",
                 f"latency <= {max_latency_ms:g} ms" if max_latency_ms is not None else "",
                 f"latency <= {max_latency_ratio:g} x dense" if max_latency_ratio is not None else ""]
        raise ConfigError(f"no finished trial has {' and '.join(w for w in wants if w) or 'a metric'}")
    if max_latency_ms is not None or max_latency_ratio is not None:
        order = rows.assign(_a=-accuracy, _l=latency).sort_values(["_a", "_l"], kind="stable")
    elif min_accuracy is not None:
        order = rows.assign(_l=latency, _a=-accuracy).sort_values(["_l", "_a"], kind="stable")
    else:
        scores = pd.to_numeric(rows.get("score"), errors="coerce").fillna(-math.inf)
        order = rows.assign(_s=-scores, _l=latency).sort_values(["_s", "_l"], kind="stable")
    return order.iloc[0][list(df.columns)]
