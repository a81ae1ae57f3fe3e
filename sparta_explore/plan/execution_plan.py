"""ExecutionPlan: per op, the candidate decompositions into sub-operators and the one chosen.

A sub-operator runs one kernel family over one part of the weight (one bit width, one
block shape); a candidate is a list of sub-operators whose outputs are summed (bias and
activation applied once, after the sum). The plan stage predicts each candidate's time
from the DeviceProfile; compile measures the built candidates and records the choice
here (the latency feedback).

Example:
    >>> print(plan(graph, table, device))  # doctest: +SKIP
    op        kind    choice            parts               bits  pred_ms  meas_ms  dense_ms
    fc1       linear  sparse            1x[32x32]... (fp32)  32     0.41     0.45     2.10
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

Block = tuple[int, int]
FP32 = 32
# `OpPlan.chosen` when the op's own (masked) module stays: no candidate could run, or compile left it
# as is (a module called more than once: its calls share the module, so no kernel replaces one call)
ORIGINAL = "original"
# the columns of `ExecutionPlan.table()`: a plan with no ops still has them
REPORT_COLUMNS = ("op", "kind", "shape", "m", "density", "choice", "parts", "bits", "pred_ms", "meas_ms", "dense_ms",
                  "dense_pred_ms", "fused", "candidates", "fallback", "notes")


@dataclass(frozen=True)
class SubOp:
    """One kernel over one part of a weight.

    `kernel` is a family name ("dense", "shrink", "sparse", "int8"); `block` the block shape
    whose height the kernel groups rows by; `weight_bits` / `act_bits` the quantization grids
    (32 = fp32, not quantized); `mask` the part's kept elements in the 2-D (out, in) view.
    """

    kernel: str
    block: Block
    weight_bits: int
    act_bits: int
    n_blocks: int
    mask: torch.Tensor = field(hash=False, compare=False, repr=False)

    def describe(self) -> str:
        grid = "fp32" if self.weight_bits == FP32 else f"w{self.weight_bits}a{self.act_bits}"
        if self.kernel in ("dense", "shrink"):
            return f"{self.kernel} ({grid})"
        return f"{self.n_blocks}x[{self.block[0]}x{self.block[1]}] {self.kernel} ({grid})"


@dataclass(frozen=True)
class Candidate:
    """One way to run an op: sub-operators summed, with the time the profile predicts."""

    name: str
    parts: tuple[SubOp, ...]
    predicted_ms: float

    def describe(self) -> str:
        return " + ".join(p.describe() for p in self.parts)

    @property
    def bits(self) -> str:
        return "/".join(sorted({str(p.weight_bits) for p in self.parts}, key=int))


@dataclass
class OpPlan:
    """What the planner knows and decided about one weighted op.

    `target` is the module FQN of a call_module op ("" for a functional one);
    `m` is the number of activation rows the op sees per call (batch x tokens / pixels);
    `activation` the elementwise op fused into it ("none", "relu", "gelu") and
    `activation_node` the graph node the fusion removes.
    """

    op: str
    target: str
    kind: str
    weight: str
    shape: tuple[int, ...]
    m: int
    density: float
    weight_bits: int
    act_bits: int
    activation: str
    activation_node: str | None
    candidates: list[Candidate]
    dense_predicted_ms: float
    chosen: str | None = None
    measured_ms: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # compile's time on this op, by step (`choose.STEPS`)
    capped: bool = False  # chosen by prediction because compile reached `CompileConfig.max_seconds`
    site: Any = None  # the plan.sites.WeightSite this op was planned from
    fallback: bool = False  # compile rejected a kernel for this op (build or check failed) or left it as is

    def fell_back(self, why: str) -> None:
        """Note that compile rejected a kernel for this op or left it as is (the report's ``fallback``)."""
        self.notes.append(why)
        self.fallback = True

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(f"op {self.op!r} has no candidate {name!r}; it has {[c.name for c in self.candidates]}")

    def best_predicted(self) -> Candidate:
        return min(self.candidates, key=lambda c: c.predicted_ms)


@dataclass
class ExecutionPlan:
    """Every planned op by graph node name, plus the device profile key the predictions used."""

    ops: dict[str, OpPlan]
    device_key: str

    def table(self) -> pd.DataFrame:
        """One row per op: choice, parts, bits, predicted / measured ms, dense ms (`REPORT_COLUMNS`).

        Measured times are the fastest of compile's interleaved timing rounds on the op's input.
        A plan with no ops gives no rows, with the same columns.

        Example:
            >>> plan(graph, table, device).table().columns.tolist()[:3]  # doctest: +SKIP
            ['op', 'kind', 'choice']
        """
        rows = []
        for p in self.ops.values():
            if p.chosen == ORIGINAL:
                choice = Candidate(ORIGINAL, (), p.dense_predicted_ms)
                parts, bits, fused = "the op's own module, masked", "32", "none"  # its activation runs apart
            else:
                choice = p.candidate(p.chosen) if p.chosen else p.best_predicted()
                parts, bits, fused = choice.describe(), choice.bits, p.activation
            rows.append({
                "op": p.op, "kind": p.kind, "shape": "x".join(map(str, p.shape)), "m": p.m,
                "density": round(p.density, 4), "choice": choice.name, "parts": parts,
                "bits": bits, "pred_ms": round(choice.predicted_ms, 4),
                "meas_ms": round(p.measured_ms[choice.name], 4) if choice.name in p.measured_ms else None,
                "dense_ms": round(p.measured_ms["dense"], 4) if "dense" in p.measured_ms else None,
                "dense_pred_ms": round(p.dense_predicted_ms, 4), "fused": fused,
                "candidates": len(p.candidates), "fallback": p.fallback, "notes": "; ".join(p.notes)})
        return pd.DataFrame(rows, columns=list(REPORT_COLUMNS))

    def __str__(self) -> str:
        if not self.ops:
            return "ExecutionPlan: no pruned or quantized weighted ops"
        cols = ["op", "kind", "shape", "choice", "parts", "bits", "pred_ms", "meas_ms", "dense_ms"]
        return self.table()[cols].to_string(index=False)
