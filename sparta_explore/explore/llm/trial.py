"""One LLM search trial: compress a decoder LLM as an `LLMPoint` says, score its perplexity, time its decode.

Stages, in order, on a copy of the workload's dense model:

1. `compress_llm`: one calibration pass, each linear pruned and quantized by its group's choice;
   the head rounded to `head_bits`; with a `CalibrationCache`, from the longest prefix of depth
   bands an earlier trial compressed the same way (``blocks_reused`` says how many blocks);
2. perplexity with the point's weights as the step reads them (`packed_for_decode`) and its
   activations (`rounded_inputs` for int8): what the step computes;
3. the compiled decode step (`CompiledDecoder`, weights packed from their grids) timed on the
   workload's first prompt: tokens/s over `new` greedy tokens, medians of `repeats` rounds taking
   turns with the dense model (as given), so ``latency_ratio`` = trial over dense decode
   milliseconds holds through the machine's slow spells; the prompt's prefill (own modules);
4. the cost models the FLOPs- and bytes-guided searches rank by: FLOPs a token (2 x kept weights,
   head included) and bytes a token (kept weights at their bits, a bit a weight of mask where
   pruned), each over the dense model's.

Rows are JSON-ready dicts (`quality` = dense perplexity / perplexity). `TrialLog` keeps them in
a JSON-lines file by the point's key, so a search resumes where it stopped and a repeated point
is read, not run again.

Example:
    >>> row = run_llm_trial(LLMPoint.from_dict({"bits@mlp.0": 4}, layers=2, bands=1),
    ...                     smollm2_tiny_workload())                           # doctest: +SKIP
    >>> row["decode_tok_s"], row["perplexity"]                                  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sparta_explore.compile.decoder import CompiledDecoder, rounded_inputs
from sparta_explore.compile.package.decoder_form import packed_for_decode
from sparta_explore.errors import ConfigError
from sparta_explore.explore.llm.compress import compress_llm
from sparta_explore.explore.llm.prefix import CalibrationCache
from sparta_explore.explore.llm.space import LLMPoint
from sparta_explore.machine import this_machine
from sparta_explore.workload import Workload


@dataclass(frozen=True)
class TrialBudget:
    """How much a trial measures: `new` decode tokens after the workload's first prompt, `repeats` times, on
    `threads` (None: torch's); `act_order` / `mse` go to GPTQ.

    Example:
        >>> TrialBudget(new=8).new
        8
    """

    new: int = 16
    repeats: int = 7
    threads: int | None = None
    act_order: bool = True
    mse: bool = False

    def __post_init__(self) -> None:
        if self.new < 2 or self.repeats < 1:
            raise ConfigError(f"TrialBudget: new >= 2 and repeats >= 1, got new={self.new}, repeats={self.repeats}")

    @property
    def machine(self) -> str:
        """The `Machine.key` its trials are timed on: rows are written under it and a `TrialLog` reads them back by it.

        Example:
            >>> TrialBudget(threads=1).machine == this_machine(1).key
            True
        """
        return this_machine(self.threads or None).key


def perplexity_of(workload: Workload, model: nn.Module, act_bits: int) -> float:
    """The workload's metric of `model` with projection inputs as the decode step rounds them."""
    if act_bits == 8:
        with rounded_inputs(model):
            return workload.evaluate(model)
    return workload.evaluate(model)


PREFILLS = 2  # timed prefills a model (after one untimed): the prompt runs through the model's own modules


def paired_timing(models: list[tuple], prompt: torch.Tensor, budget: TrialBudget) -> list[dict[str, float]]:
    """Per (model, act_bits[, packed weights]): decode tokens/s, ms a token, prefill ms and the weight MB a token
    reads.

    Each model's step decodes `budget.new` tokens after the prompt, `budget.repeats` rounds (one
    untimed first), the models taking turns round by round: a slow spell of the machine lands on
    all of them, so their ratio holds where their absolute speeds drift. Medians.

    Example:
        >>> trial, dense = paired_timing([(model, 8), (dense_model, 32)], prompt, TrialBudget())  # doctest: +SKIP
    """
    prompt = prompt[:1]
    start = prompt.shape[1]
    runs = []
    for model, act_bits, *packed in models:
        decoder = CompiledDecoder(model, start + budget.new + 1, threads=budget.threads, act_bits=act_bits,
                                  packed=packed[0] if packed else None)
        decoder.reset(1)
        prefills = []
        for _ in range(PREFILLS + 1):
            t0 = time.perf_counter()
            first = decoder.prefill(prompt).argmax(-1)
            prefills.append(time.perf_counter() - t0)
        runs.append((decoder, first, statistics.median(prefills[1:]), []))
    for _ in range(budget.repeats + 1):
        for decoder, first, _, steps in runs:  # the cache past the prompt is rewritten each round
            token, t0 = first, time.perf_counter()
            for position in range(start, start + budget.new):
                token = decoder.step(token, position).argmax(-1)
            steps.append((time.perf_counter() - t0) / budget.new)
    out = []
    for decoder, _, prefill_s, steps in runs:
        step_s = statistics.median(steps[1:])
        out.append({"decode_tok_s": 1.0 / step_s, "decode_ms": step_s * 1e3, "prefill_ms": prefill_s * 1e3,
                    "mb_token": decoder.bytes_per_token / 1e6})
    return out


def decode_timing(model: nn.Module, prompt: torch.Tensor, act_bits: int, budget: TrialBudget,
                  packed: dict | None = None) -> dict[str, float]:
    """`paired_timing` of one model (`packed`: its weights already packed, `packed_for_decode`'s).

    Example:
        >>> decode_timing(model, prompt, 8, TrialBudget())["decode_tok_s"]  # doctest: +SKIP
    """
    return paired_timing([(model, act_bits, packed)], prompt, budget)[0]


def cost_models(model: nn.Module, point: LLMPoint | None) -> dict[str, float]:
    """FLOPs and bytes a decode token costs by count: every decoder linear's kept weights (2 FLOPs, `bits`
    / 8 bytes each, and a mask bit a weight where pruned) and the head's. `point` None: all float32.

    Example:
        >>> from sparta_explore.zoo.llm.workloads import tiny_llama
        >>> cost_models(tiny_llama(layers=1), None)  # q, o 64 x 64; k, v 32 x 64; gate, up, down 128 x 64; head
        {'flops_token': 106496.0, 'bytes_token': 212992.0}
    """
    point = point or LLMPoint(bands=1, head_bits=32)  # no group named: every linear Choice() (dense, float)
    flops = bytes_ = 0.0
    for name, choice in point.assignment(len(model.model.layers)).items():
        weight = model.get_submodule(name).weight
        pruned = choice.sparsity > 0
        kept = int((weight != 0).sum()) if pruned else weight.numel()
        flops += 2.0 * kept
        bytes_ += kept * choice.bits / 8 + (weight.numel() / 8 if pruned else 0.0)
    head = model.lm_head.weight.numel()
    return {"flops_token": flops + 2.0 * head, "bytes_token": bytes_ + head * point.head_bits / 8}


def run_llm_trial(point: LLMPoint, workload: Workload, budget: TrialBudget = TrialBudget(), *,
                  dense_perplexity: float | None = None, cache: CalibrationCache | None = None) -> dict[str, Any]:
    """One trial's row (see the module docstring). `dense_perplexity`: the dense model's, scored earlier
    (else scored here); the dense decode is timed again in every trial, so the ratio is same-run;
    `cache`: calibration prefixes shared with other trials.

    Example:
        >>> run_llm_trial(point, smollm2_tiny_workload())["latency_ratio"]  # doctest: +SKIP
    """
    started = time.perf_counter()
    dense = workload.dense_model()
    model = copy.deepcopy(dense)
    reused = cache.blocks_reused if cache is not None else 0
    compress_llm(model, point, workload.calibration_inputs[0], act_order=budget.act_order, mse=budget.mse,
                 cache=cache)
    reused = cache.blocks_reused - reused if cache is not None else 0
    packed = packed_for_decode(model)  # what the step reads is what is scored
    compress_s = time.perf_counter() - started
    ppl = perplexity_of(workload, model, point.act_bits)
    prompt = workload.timing_inputs(1)[0]
    timing, dense_timing = paired_timing([(model, point.act_bits, packed), (dense, 32)], prompt, budget)
    dense_ms = dense_timing["decode_ms"]
    base_ppl = workload.evaluate(dense) if dense_perplexity is None else float(dense_perplexity)
    costs, base = cost_models(model, point), cost_models(dense, None)
    return {"key": point.key(), **point.canonical().to_dict(), "bands": point.bands, "workload": workload.name,
            "metric_name": workload.metric_name, "higher_is_better": False, "perplexity": ppl,
            "accuracy": ppl, "dense_accuracy": base_ppl, "quality": base_ppl / ppl, **timing,
            "dense_decode_ms": dense_ms, "latency_ratio": timing["decode_ms"] / dense_ms, **costs,
            "flops_ratio": costs["flops_token"] / base["flops_token"],
            "bytes_ratio": costs["bytes_token"] / base["bytes_token"], "compress_s": compress_s,
            "blocks_reused": reused, "calibration_windows": int(workload.calibration_inputs[0].shape[0]),
            "wall_s": time.perf_counter() - started, "threads": budget.threads or torch.get_num_threads(),
            "machine": budget.machine}


class TrialLog:
    """Trial rows in a JSON-lines file, by point key: `get` a finished point, `add` a new row.

    A row is found by the key it was written under, else by its canonical key (`LLMPoint.key`): a point asked
    again with parameters that do not change the model reads the row of the model it makes, while a log whose
    rows carry every parameter as asked replays each search exactly. `machine` (a `Machine.key`): `get` reads
    back only rows measured there, and failed points (latency is the machine's; a log moved to another CPU or
    thread count measures again, and keeps both); None: any row.

    Example:
        >>> log = TrialLog("results/llm/trials.jsonl", machine=TrialBudget(threads=2).machine)  # doctest: +SKIP
        >>> log.get(point) or log.add(run_llm_trial(point, workload))  # doctest: +SKIP
    """

    def __init__(self, path: str | Path, machine: str | None = None) -> None:
        self.path = Path(path)
        self.machine = machine
        self.rows: dict[str, dict[str, Any]] = {}  # key as written -> the row (the last, if several machines ran it)
        self._found: dict[tuple[str, str], dict[str, Any]] = {}  # ("asked" | "model", key) -> first row found so
        if self.path.exists():
            for n, line in enumerate(self.path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self._index(row)
                except (json.JSONDecodeError, KeyError, TypeError, ConfigError):
                    raise ConfigError(f"{self.path}:{n} is not a trial row (JSON with a point's 'key')") from None

    def _index(self, row: dict[str, Any]) -> None:
        canonical = LLMPoint.from_key(row["key"]).key()
        self.rows[row["key"]] = row
        # a point the compressors could not make (an error, no measures) fails on every machine
        if self.machine is None or row.get("machine") == self.machine or row.get("error"):
            self._found.setdefault(("asked", row["key"]), row)
            self._found.setdefault(("model", canonical), row)

    def get(self, point: LLMPoint) -> dict[str, Any] | None:
        """The row of `point` if it, or a point making the same model, ran before (on `machine`, if given)."""
        return self._found.get(("asked", point.asked_key())) or self._found.get(("model", point.key()))

    def measured(self) -> list[dict[str, Any]]:
        """The rows timed on `machine` (every machine's when None), the first of each key, in log order.

        Example:
            >>> len(TrialLog("results/llm/trials.jsonl", machine=TrialBudget().machine).measured())  # doctest: +SKIP
            48
        """
        return [row for (kind, _), row in self._found.items() if kind == "asked"]

    def add(self, row: dict[str, Any]) -> dict[str, Any]:
        """Append `row` (one line, flushed before returning) and return it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        self._index(row)
        return row
