"""An LLM search trial the user picked, compressed again and saved as a decoder package that `se.load` loads.

`export_llm_trial(row, out, workload)`:

1. the row's point (`LLMPoint`) compresses a copy of the workload's model, as the trial did (same
   calibration windows, same GPTQ options);
2. its weights are put on the layouts the decode step reads (`packed_for_decode`): what is measured
   is what is saved;
3. perplexity on the workload's windows (inputs rounded as the point's activations say) and decode
   timed through the compiled step in turns with the model as given, as the trial was
   (`paired_timing`);
4. the package is written (`save_decoder`: 4-bit weights as 4-bit codes), its manifest holding
   the trial's point, the row's figures and these.

The export is said to reproduce its row when the perplexity is within `PERPLEXITY_TOLERANCE`
(relative; the same windows on the same machine give the same value up to float summation) and
the decode latency over the dense model's is within a factor `SPEED_CLASS` of the row's (decode
timings drift on a shared machine; a ratio measured in turns drifts less). Each difference is
named with its likely cause.

Example:
    >>> result = export_llm_trial(row, "pick.sparta", llm_workload("smollm2-135m", eval_windows=4,
    ...                           calibration_windows=8))                      # doctest: +SKIP
    >>> model = se.load("pick.sparta"); se.generate(model, ids, 32)             # doctest: +SKIP
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sparta_explore.compile.package.decoder_form import packed_for_decode, save_decoder
from sparta_explore.errors import ConfigError
from sparta_explore.explore.llm.compress import compress_llm
from sparta_explore.explore.llm.space import GLOBAL_KEYS, LLMPoint
from sparta_explore.explore.llm.trial import TrialBudget, TrialLog, paired_timing, perplexity_of
from sparta_explore.workload import Workload

PERPLEXITY_TOLERANCE = 1e-3
SPEED_CLASS = 1.25


def _number(row: Mapping[str, Any], column: str) -> float:
    try:
        return float(row.get(column))
    except (TypeError, ValueError):
        return math.nan


def point_of_row(row: Mapping[str, Any], layers: int) -> LLMPoint:
    """The `LLMPoint` a trial row ran (its parameter columns and `bands`).

    Example:
        >>> point_of_row({"bands": 1, "bits@mlp.0": 4, "act_bits": 8, "perplexity": 15.2}, layers=2).act_bits
        8
    """
    bands = int(_number(row, "bands")) if math.isfinite(_number(row, "bands")) else 0
    if bands < 1:
        raise ConfigError(f"trial {row.get('key')}: its row has no 'bands' (not an LLM search row)")
    names = set(LLMPoint.from_dict({}, layers=layers, bands=bands).to_dict())
    return LLMPoint.from_dict({k: v for k, v in row.items() if k in names}, layers=layers, bands=bands)


def trial_id(point_key: str) -> str:
    """A short id of a logged point (12 hex digits of its key's SHA-1): what `sparta-explore export --trial` takes.

    Example:
        >>> trial_id('{"act_bits": 8}')
        '420c19dc5892'
    """
    return hashlib.sha1(point_key.encode()).hexdigest()[:12]


def llm_trials(path: str | os.PathLike, machine: str | None = None) -> pd.DataFrame:
    """The rows of an LLM trial log (JSON lines) in the columns `pick_trial` reads: ``key`` a short id of the point
    (`trial_id`; the log's own key, the point as JSON, is ``point_key``), ``latency_ms`` the decode ms a token,
    ``accuracy`` the perplexity (lower is better), ``params_json`` the point; no ``score``, so ``--best`` alone
    picks the fastest and ``--min-accuracy`` is a perplexity ceiling. Where the log holds rows timed on `machine`
    (a `Machine.key`; default this one), only those: milliseconds of different CPUs do not compare; where it holds
    none, the rows of the machine that timed the most (with a `UserWarning` when several did).

    Example:
        >>> llm_trials("results/llm/trials.jsonl")[["key", "accuracy", "latency_ms"]]   # doctest: +SKIP
    """
    log = TrialLog(path, machine=machine or TrialBudget().machine)
    rows = log.measured() or _one_machines_rows(path, list(log.rows.values()))
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    params = [json.dumps({k: v for k, v in r.items() if "@" in k or k in GLOBAL_KEYS}, sort_keys=True) for r in rows]
    return df.assign(point_key=df["key"], key=[trial_id(str(k)) for k in df["key"]],
                     latency_ms=pd.to_numeric(df.get("decode_ms"), errors="coerce"),
                     dense_latency_ms=pd.to_numeric(df.get("dense_decode_ms"), errors="coerce"),
                     params_json=params, score=math.nan, higher_is_better=False, metric_name="perplexity")


def _one_machines_rows(path: str | os.PathLike, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` of the machine that timed the most of them (and failed rows): one machine's milliseconds."""
    timed = Counter(r.get("machine") for r in rows if not r.get("error"))
    if len(timed) <= 1:
        return rows
    most, count = timed.most_common(1)[0]
    warnings.warn(f"{path}: no row was timed on this machine; picking among the {count} rows timed on {most} "
                  f"(the log holds rows of {len(timed)} machines, whose milliseconds do not compare)", stacklevel=3)
    return [r for r in rows if r.get("machine") == most or r.get("error")]


@dataclass(frozen=True)
class LLMExport:
    """What `export_llm_trial` wrote and measured, beside the row's figures; `differences` names each way the
    export differs from its row (empty when it reproduced)."""

    path: Path
    key: str
    point: LLMPoint
    perplexity: float
    row_perplexity: float
    decode_tok_s: float
    latency_ratio: float
    row_latency_ratio: float
    mb_token: float
    file_mb: float
    differences: tuple[str, ...]

    @property
    def reproduced(self) -> bool:
        """Whether the perplexity and the speed class both match the row's (see the module docstring)."""
        return not self.differences

    def lines(self) -> list[str]:
        """What the command line prints.

        Example:
            >>> print("\\n".join(result.lines()))   # doctest: +SKIP
        """
        return [f"wrote {self.path} (trial {self.key}, {self.file_mb:.1f} MB; the step reads {self.mb_token:.1f} MB "
                f"a token)",
                f"perplexity {self.perplexity:.4f} (row: {self.row_perplexity:.4f})",
                f"decode {self.decode_tok_s:.1f} tok/s, {self.latency_ratio:.3f} x the model as given "
                f"(row: {self.row_latency_ratio:.3f})",
                "reproduced its row" if self.reproduced else "differs from its row:",
                *(f"difference: {d}" for d in self.differences)]


def _differences(row: Mapping[str, Any], perplexity: float, ratio: float, machine: str) -> list[str]:
    said = []
    row_machine = str(row.get("machine") or "")
    elsewhere = bool(row_machine) and row_machine != machine
    row_ppl, row_ratio = _number(row, "perplexity"), _number(row, "latency_ratio")
    if not abs(perplexity - row_ppl) <= PERPLEXITY_TOLERANCE * row_ppl:
        why = ("another machine's float rounding in the calibration pass" if elsewhere else
               "other evaluation or calibration windows than the search's (--eval-windows / --calibration-windows), "
               "the calibration pass rounding differently at another thread count, or a row that scored the "
               "compressed model's own values, not the step's packed ones (within 1e-4 of them; int8 activations "
               "can amplify that)")
        said.append(f"perplexity {perplexity:.4f}, the row {row_ppl:.4f}: {why}")
    if not (row_ratio / SPEED_CLASS <= ratio <= row_ratio * SPEED_CLASS):
        said.append(f"decode at {ratio:.3f} x the model as given, the row {row_ratio:.3f}: "
                    + ("another machine" if elsewhere else "the machine's speed drifted between the two timings "
                       "(run the export again on an idle machine)"))
    return said


def export_llm_trial(row: Mapping[str, Any], out: str | os.PathLike, workload: Workload, *,
                     budget: TrialBudget = TrialBudget(), echo: Callable[[str], None] | None = None) -> LLMExport:
    """Compress, measure and save the trial of `row` (see the module docstring).

    Example:
        >>> export_llm_trial(row, "pick.sparta", workload).lines()   # doctest: +SKIP
    """
    if not math.isfinite(_number(row, "perplexity")) or not math.isfinite(_number(row, "latency_ratio")):
        raise ConfigError(f"trial {row.get('key')} did not finish (its row has no perplexity or latency): "
                          f"nothing to export ({row.get('error') or 'no error recorded'})")
    say = echo or (lambda _: None)
    dense = workload.dense_model()
    point = point_of_row(row, len(dense.model.layers))
    if row.get("workload") not in (None, workload.name):
        raise ConfigError(f"trial {row.get('key')} ran on workload {row.get('workload')!r}, not {workload.name!r}")
    started = time.perf_counter()
    model = copy.deepcopy(dense)
    say(f"compressing as trial {row.get('key')}: {point.compress_key()}")
    compress_llm(model, point, workload.calibration_inputs[0], act_order=budget.act_order, mse=budget.mse)
    packed = packed_for_decode(model)
    say("scoring perplexity and timing decode beside the model as given")
    perplexity = perplexity_of(workload, model, point.act_bits)
    prompt = workload.timing_inputs(1)[0][:1]
    timing, dense_timing = paired_timing([(model, point.act_bits, packed), (dense, 32)], prompt, budget)
    ratio = timing["decode_ms"] / dense_timing["decode_ms"]
    machine = budget.machine
    differences = tuple(_differences(row, perplexity, ratio, machine))
    figures = {"perplexity": perplexity, "decode_tok_s": timing["decode_tok_s"], "prefill_ms": timing["prefill_ms"],
               "latency_ratio": ratio, "dense_decode_tok_s": dense_timing["decode_tok_s"],
               "mb_token": timing["mb_token"], "export_s": time.perf_counter() - started}
    row_figures = {k: _number(row, k) for k in ("perplexity", "decode_tok_s", "latency_ratio", "mb_token")}
    metadata = {"trial": {"key": str(row.get("key")), "point_key": point.key(), "point": point.to_dict(),
                          "bands": point.bands, "workload": workload.name,
                          "row": {k: v for k, v in row_figures.items() if math.isfinite(v)}},
                "export": figures, "machine": machine, "differences": list(differences)}
    path = save_decoder(model, Path(out), act_bits=point.act_bits, example_ids=prompt, metadata=metadata,
                        packed=packed)
    return LLMExport(path, str(row.get("key")), point, perplexity, row_figures["perplexity"],
                     timing["decode_tok_s"], ratio, row_figures["latency_ratio"], timing["mb_token"],
                     path.stat().st_size / 1e6, differences)
