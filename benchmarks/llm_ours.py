"""Our rows of the LLM benchmark (`llm.py`): each compressor recipe run on a fresh copy of the dense model,
the in-place compiled copies, and the interleaved prefill / decode timing of all of them.

Example:
    >>> recipes(("model.layers.0.mlp.up_proj",))["dense"]   # doctest: +SKIP
    ()
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import torch
from llm_report import (  # this script's folder is on sys.path
    COMPILED,
    DENSE,
    GPTQ_4,
    GPTQ_8,
    GPTQ_GROUP,
    SPARSEGPT_24,
    SPARSEGPT_50,
    WANDA_24,
    WANDA_50,
    LinearWeights,
    decode_tok_s,
    weights_bytes,
)
from torch import nn

import sparta_explore as se
from sparta_explore.compile.config import CompileConfig
from sparta_explore.compile.decoder import CompiledDecoder
from sparta_explore.pruners import SparseGPTConfig, WandaConfig, masks_to_table, prune, wanda_keep
from sparta_explore.quantizers import GPTQConfig, quantize
from sparta_explore.tesa_table import TeSATable

MAGNITUDE_50, SPARSEGPT_50_GPTQ_4 = "magnitude-50%", f"sparsegpt-50%+gptq-w4g{GPTQ_GROUP}"
LATE_MLP_GPTQ_4 = f"late-mlp-gptq-w4g{GPTQ_GROUP}"  # the LLM search's pick: MLPs of the last third, the rest as given
START = time.monotonic()


def log(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S} +{time.monotonic() - START:5.0f}s] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Step:
    """One compressor run on the model: "magnitude" (config: the sparsity), "wanda", "sparsegpt" or "gptq"."""

    kind: str
    config: Any


def recipes(linears: tuple[str, ...]) -> dict[str, tuple[Step, ...]]:
    """Each of our rows as the compressors it runs, in order, on a fresh copy of the dense model."""
    ops = {"op_names": linears, "samples": None}  # every calibration window given
    sparsegpt_50 = Step("sparsegpt", SparseGPTConfig(0.5, **ops))
    gptq = {"group_size": GPTQ_GROUP, "act_order": True, "mse": True, **ops}  # GPTQ's own best settings
    gptq_4 = Step("gptq", GPTQConfig(4, **gptq))
    layers = len({name.split(".")[2] for name in linears})
    late_mlp = tuple(n for n in linears if ".mlp." in n and int(n.split(".")[2]) >= layers - layers // 3)
    return {DENSE: (), MAGNITUDE_50: (Step("magnitude", 0.5),), WANDA_50: (Step("wanda", WandaConfig(0.5, **ops)),),
            SPARSEGPT_50: (sparsegpt_50,), WANDA_24: (Step("wanda", WandaConfig(nm=(2, 4), **ops)),),
            SPARSEGPT_24: (Step("sparsegpt", SparseGPTConfig(nm=(2, 4), **ops)),),
            GPTQ_8: (Step("gptq", GPTQConfig(8, **gptq)),), GPTQ_4: (gptq_4,),
            SPARSEGPT_50_GPTQ_4: (sparsegpt_50, gptq_4),
            LATE_MLP_GPTQ_4: (Step("gptq", GPTQConfig(4, **{**gptq, "op_names": late_mlp})),)}


@dataclass
class Row:
    """One line of the table; `model` is ours (None for llama.cpp), timed after every row is compressed."""

    name: str
    runtime: str
    ppl: float = math.nan
    calib_s: float = math.nan
    weights_mb: float = math.nan
    prefill_ms: float = math.nan
    decode_tok_s: float = math.nan
    notes: list[str] = field(default_factory=list)
    model: nn.Module | None = None
    table: TeSATable | None = None
    decoder: CompiledDecoder | None = None  # a decode-step row's (its model is the compressed row's)
    mb_token: float = math.nan  # weight MB one decode token reads


def magnitude_masks(model: nn.Module, sparsity: float, linears: tuple[str, ...]) -> dict[str, dict[str, torch.Tensor]]:
    """Keep the largest |W| of each output row: the baseline before calibration-based pruners."""
    return {name: {"weight": wanda_keep(model.get_submodule(name).weight.detach().abs(), sparsity).float()}
            for name in linears}


@contextmanager
def block_progress(model: nn.Module, label: str, every_s: float = 20.0) -> Iterator[None]:
    """Log the decoder layer a compressor has reached (block by block calibration), at most every `every_s`."""
    layers = model.model.layers
    last = {"index": -1, "at": time.monotonic()}

    def reached(index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            if index > last["index"] and time.monotonic() - last["at"] >= every_s:
                log(f"{label}: block {index + 1}/{len(layers)}")
                last["at"] = time.monotonic()
            last["index"] = max(last["index"], index)
        return hook

    handles = [layer.register_forward_pre_hook(reached(i)) for i, layer in enumerate(layers)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def compress(dense: nn.Module, steps: tuple[Step, ...], calib: torch.Tensor, linears: tuple[str, ...]) -> Row:
    """A fresh copy of `dense` through `steps`: the model, its table (pruned rows), calib_s and weights_MB."""
    model, table, bits, group = copy.deepcopy(dense) if steps else dense, None, 32, None
    start = time.perf_counter()
    for step in steps:
        with block_progress(model, step.kind):
            if step.kind == "gptq":  # its table says 4-bit grids of 128 (`TeSA.group`): the model holds their values
                bits_table = quantize(model, step.config, "gptq", evaluator=calib)
                table = bits_table if table is None else table.merge(bits_table)
                bits, group = step.config.bits, step.config.group_size
            else:
                table = (masks_to_table(model, magnitude_masks(model, step.config, linears))
                         if step.kind == "magnitude" else prune(model, step.config, pruner=step.kind, evaluator=calib))
                se.apply_table(model, table)  # Wanda and magnitude leave the weights as they were; SparseGPT zeroed
    row = Row("", "torch-eager", calib_s=time.perf_counter() - start if steps else math.nan, model=model, table=table)
    weights = [model.get_submodule(name).weight for name in linears]
    in_table = [table is not None and f"{name}.weight" in table for name in linears]  # GPTQ may take some only
    kept = [int(table[f"{name}.weight"].kept.sum()) if there else w.numel()
            for name, w, there in zip(linears, weights, in_table)]
    names = set(linears)
    others = sum(p.numel() for n, p in model.named_parameters() if n.removesuffix(".weight") not in names)
    shapes = [LinearWeights(*w.shape, k) for w, k in zip(weights, kept)]
    quantized = [bits < 32 and there for there in in_table]  # the others stay float32
    row.weights_mb = 1e-6 * (weights_bytes([w for w, q in zip(shapes, quantized) if q], others, bits, group)
                             + weights_bytes([w for w, q in zip(shapes, quantized) if not q], 0))
    return row


def compile_row(row: Row, prompt: torch.Tensor) -> Row:
    """A copy of the pruned `row` compiled in place on the prompt (the table propagated first)."""
    model, inputs = copy.deepcopy(row.model), {"input_ids": prompt}
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        se.compile(model, se.run_propagation(se.capture(model, inputs), row.table), inputs,
                   config=CompileConfig(inplace=True))
    report = model.sparta_compiled
    runs = (report.guard or {}).get("runs", "compiled")
    notes = [f"compiled in {time.perf_counter() - start:.0f} s: {len(report.swapped)} linears hold kernels",
             f"guard runs {runs}" if runs != "compiled" else "guard kept the kernels"]
    return Row(row.name + COMPILED, "torch+kernels", calib_s=row.calib_s, weights_mb=row.weights_mb, notes=notes,
               model=model)


# the decode-step rows of a compressed row: suffix -> (act_bits, pack); float rows only for the dense model
STEP_F32, STEP, STEP_A8 = ":step-f32", ":step", ":step-a8"
STEPS = {STEP_F32: (32, False), STEP: (32, True), STEP_A8: (8, True)}


def step_rows(row: Row, max_len: int, suffixes: tuple[str, ...] = tuple(STEPS)) -> list[Row]:
    """The compressed `row`'s model behind the compiled decode step (`CompiledDecoder`): its weights packed
    in the narrowest layout they fit, with float or int8 activations; the dense row also with float32 rows.
    A row compiled in place packs its kernels' weights (`as_linear`)."""
    out, packed = [], None  # the packed weights of the first packing decoder serve the next
    for suffix, (act_bits, pack) in STEPS.items():
        if suffix not in suffixes or (suffix == STEP_F32 and row.name != DENSE):
            continue
        start = time.perf_counter()
        decoder = CompiledDecoder(row.model, max_len, act_bits=act_bits, pack=pack, packed=packed if pack else None)
        packed = decoder.packed if pack else packed
        layouts = decoder.formats().groupby("fmt").size().to_dict()
        note = f"decoder built in {time.perf_counter() - start:.0f} s: " + ", ".join(
            f"{n} {fmt}" for fmt, n in sorted(layouts.items()))
        out.append(Row(row.name + suffix, f"step a{act_bits}", ppl=row.ppl if act_bits == 32 else math.nan,
                       calib_s=row.calib_s, weights_mb=row.weights_mb, notes=[note], model=row.model,
                       decoder=decoder, mb_token=decoder.bytes_per_token / 1e6))
    return out


def step_generate(decoder: CompiledDecoder, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy tokens through the step: the prompt through the model's modules, then n - 1 one-token steps."""
    decoder.reset(prompt.shape[0])
    token = decoder.prefill(prompt).argmax(-1)
    for position in range(prompt.shape[1], prompt.shape[1] + n - 1):
        token = decoder.step(token, position).argmax(-1)
    return token


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def time_ours(rows: list[Row], prompt: torch.Tensor, new: int, repeats: int, pad: int) -> None:
    """prefill_ms and decode_tok_s of every row with a model, the rows interleaved in each of `repeats` rounds."""
    mask = torch.ones_like(prompt)

    def generate(m: nn.Module, n: int) -> Any:
        return m.generate(prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          pad_token_id=pad)

    times: dict[str, dict[str, list[float]]] = {r.name: {"prefill": [], "n": [], "1": []} for r in rows}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in rows:  # warm-up: first calls fault pages in and size buffers
            if row.decoder is not None:
                step_generate(row.decoder, prompt, 2)
                continue
            row.model(prompt, use_cache=True, logits_to_keep=1)
            generate(row.model, 2)
        for turn in range(repeats):
            log(f"timing round {turn + 1}/{repeats}: prefill and generate of {len(rows)} models")
            for row in rows:
                m, d, t = row.model, row.decoder, times[row.name]
                if d is not None:  # the step's own prefill (d.reset: fresh caches)
                    t["prefill"].append(_timed(lambda d=d: (d.reset(1), d.prefill(prompt))))
                    t["n"].append(_timed(lambda d=d: step_generate(d, prompt, new)))
                    t["1"].append(_timed(lambda d=d: step_generate(d, prompt, 1)))
                    continue
                t["prefill"].append(_timed(lambda m=m: m(prompt, use_cache=True, logits_to_keep=1)))
                t["n"].append(_timed(lambda m=m: generate(m, new)))
                t["1"].append(_timed(lambda m=m: generate(m, 1)))
    for row in rows:
        t = times[row.name]
        row.prefill_ms = 1e3 * statistics.median(t["prefill"])
        row.decode_tok_s = decode_tok_s(statistics.median(t["n"]), statistics.median(t["1"]), new)
