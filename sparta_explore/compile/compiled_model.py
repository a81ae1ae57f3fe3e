"""CompiledModel: what `compile` returns, an nn.Module called like the model, with everything compile did on record.

Example:
    >>> cm = compile(model, table, (x,))     # doctest: +SKIP
    >>> print(cm.summary())                  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.fx as fx
from torch import nn
from torch.nn.modules import module as _module

from sparta_explore.compile.choose import CompileWarning
from sparta_explore.compile.compile_times import op_frame, stage_frame, times_text
from sparta_explore.compile.record import CompileRecord, summary_text
from sparta_explore.errors import InputDtypeError
from sparta_explore.plan import ExecutionPlan
from sparta_explore.tracing.inputs import set_mode


@dataclass(frozen=True)
class SizeGuard:
    """The input sizes a compiled model was specialized to (all but the batch dim), and the module for any other size.

    Graph passes may bake the example's spatial size into the model (a constant channel's
    map through a padded conv). A call with other sizes runs `fallback` (the model masked
    with the table) with one `CompileWarning`, never a wrong answer or a broadcast error.
    """

    shapes: tuple[tuple[int, ...] | None, ...]
    fallback: nn.Module

    def fits(self, args: Sequence[Any]) -> bool:
        if len(args) != len(self.shapes):
            return False
        for a, want in zip(args, self.shapes):
            if want is None:
                continue
            if not isinstance(a, torch.Tensor) or tuple(a.shape[1:]) != want:
                return False
        return True


def floating_dtypes(args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[int | str, torch.dtype]:
    """The dtype of each floating-point tensor input, by position or keyword: what a compiled model accepts.

    Example:
        >>> floating_dtypes((torch.zeros(2), torch.zeros(2, dtype=torch.long)), {"y": torch.zeros(1)})
        {0: torch.float32, 'y': torch.float32}
    """
    given = [*enumerate(args), *kwargs.items()]
    return {k: x.dtype for k, x in given if isinstance(x, torch.Tensor) and x.is_floating_point()}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class CompiledModel(nn.Module):
    """The model after graph passes, with planned ops swapped for kernels; `report` says what each op runs.

    Attributes: `plan` (the ExecutionPlan with measured times and choices: compile's own copy),
    `report` (DataFrame, one row per planned op), `passes` (DataFrame, one row per pass: what it
    changed and how long it took), `checks` (DataFrame: check, error, tolerance, passed, on),
    `guard` (the whole-model timing against the dense model, or None), `max_error` (vs the
    reference ops, or the table where that check did not run), `table_error` (vs the model
    masked with the table, weights on their grids), `fp32_error` (vs the masked model in fp32:
    quantization's own error), `unread` (table names the forward never reads), `seconds`,
    `input_dtypes` (the example inputs' floating dtypes), `record` (a `CompileRecord`: graph,
    tables, example call, tolerance; for a loaded model its saved report and how it was loaded).
    Called like the model; a floating input of another dtype that an op rejects is one
    `InputDtypeError` naming the input and the dtype it was compiled for. `save(path)` writes it
    as one package file that `se.load` rebuilds (`compile/package/`).

    Example:
        >>> cm = compile(model, table, (x,)); y = cm(x)  # doctest: +SKIP
    """

    def __init__(self, module: fx.GraphModule, plan: ExecutionPlan | None, checks: pd.DataFrame, seconds: float,
                 unread: list[str], fp32_error: float | Callable[[], float], passes: pd.DataFrame | None = None,
                 guard: dict | None = None, size_guard: SizeGuard | None = None,
                 input_dtypes: Mapping[int | str, torch.dtype] | None = None, *, record: CompileRecord | None = None,
                 compile_times: pd.DataFrame | None = None) -> None:
        super().__init__()
        self.module = module
        self.plan = plan
        self.record = record or CompileRecord()
        self.checks = checks
        self.seconds = seconds
        # where `seconds` went, per stage (compile/compile_times.py); per op: `op_compile_times`
        self.compile_times = compile_times if compile_times is not None else stage_frame({}, [], seconds)
        self.unread = unread
        self._fp32_error = fp32_error  # a callable: measured when first read (a reference copy and a model run)
        self.passes = passes if passes is not None else pd.DataFrame(columns=["pass", "changed", "seconds", "notes"])
        self.guard = guard
        self.size_guard = size_guard
        self.input_dtypes = dict(input_dtypes or {})
        self._warned_size = False

    @property
    def max_error(self) -> float:
        """Relative error against the graph with each compiled op running its reference; where that check did not run
        (quantized ops whose model passed the table checks: see `compile/verify.py`), `table_error`."""
        ops = float(self.checks.set_index("check").loc["ops", "error"])
        return self.table_error if math.isnan(ops) else ops

    @property
    def table_error(self) -> float:
        """Relative error against the model masked with the table (weights on their grids); where that check did not
        run (propagation pruned further, and the model matched the input table: see `compile/verify.py`), against
        the input table."""
        checks = self.checks.set_index("check")
        error = float(checks.loc["table", "error"])
        return float(checks.loc["input table", "error"]) if math.isnan(error) and "input table" in checks.index \
            else error

    @property
    def report(self) -> pd.DataFrame:
        """One row per planned op: its shape, candidates, choice, measured and dense times, notes."""
        return self.plan.table() if self.plan is not None else self.record.report

    @property
    def fp32_error(self) -> float:
        """Relative error against the model masked with the table in fp32 (no grids): quantization's own error."""
        if callable(self._fp32_error):
            self._fp32_error = float(self._fp32_error())
        return self._fp32_error

    @property
    def capped(self) -> int:
        """How many ops were chosen by the device profile's prediction because compile reached its time cap
        (`CompileConfig.max_seconds`).

        Example:
            >>> compile(model, table, x, max_seconds=0).capped  # doctest: +SKIP
            3
        """
        return sum(op.capped for op in self.plan.ops.values()) if self.plan is not None else 0

    @property
    def op_compile_times(self) -> pd.DataFrame:
        """One row per planned op: compile's seconds on it by step (tile search, codegen, gcc + load, checks, timing).

        Example:
            >>> cm.op_compile_times.sort_values("total").tail(1)  # doctest: +SKIP
        """
        return op_frame(self.plan.ops.values() if self.plan is not None else [])

    def save(self, path: str | os.PathLike, **options: Any) -> Path:
        """Write this model as one package file (`sparta_explore.compile.package.save`); returns its path.

        Example:
            >>> cm.save("bert.sparta"); cm2 = se.load("bert.sparta")   # doctest: +SKIP
        """
        from sparta_explore.compile.package.save import save

        return save(self, path, **options)

    def summary(self) -> str:
        """Passes, per-op choices and checks as plain text (every column shown, whatever pandas' display width).

        Example:
            >>> print(cm.summary())   # doctest: +SKIP
        """
        return summary_text(self.report, self.passes, self.checks, self.guard, self.record.notes) + \
            f"\ncompile time: {times_text(self.compile_times)}"

    def train(self, mode: bool = True) -> CompiledModel:
        # an exported module refuses train()/eval(): its dropout mode was fixed at export
        self.training = mode
        set_mode(self.module, mode)
        return self

    def __call__(self, *args, **kwargs):
        # no hooks on the wrapper: straight to the module's own call (a tiny model's latency is a few such calls);
        # dtypes are looked at only once a call has failed (a try costs nothing until something raises)
        try:
            if self._forward_hooks or self._forward_pre_hooks or _module._global_forward_hooks \
                    or _module._global_forward_pre_hooks or self.size_guard is not None:
                return super().__call__(*args, **kwargs)
            return self._run(*args, **kwargs)
        except RuntimeError as e:
            wrong = self._wrong_dtypes(args, kwargs)
            if not wrong:
                raise
            # compiled ops run any float dtype (float32 fast, others their reference), but ops left to PyTorch
            # (dense, or the user's masked model) raise "mat1 and mat2 must have the same dtype" and the like
            raise InputDtypeError(f"{'; '.join(wrong)} (its example inputs' dtype), and an op it leaves to PyTorch "
                                  "takes no other: convert the input (e.g. x.float()) or compile with example inputs "
                                  f"of that dtype (PyTorch: {str(e).splitlines()[0]})") from e

    def _wrong_dtypes(self, args: tuple, kwargs: dict) -> list[str]:
        """'argument 0 is float64, but this model was compiled for float32', per floating input of another dtype."""
        accepted = set(self.input_dtypes.values())
        wrong = []
        for key, dtype in floating_dtypes(args, kwargs).items():
            want = {self.input_dtypes[key]} if key in self.input_dtypes else accepted  # a keyword fx flattened
            if want and dtype not in want:
                label = f"argument {key}" if isinstance(key, int) else f"input {key!r}"
                names = " or ".join(sorted(_dtype_name(d) for d in want))
                wrong.append(f"{label} is {_dtype_name(dtype)}, but this model was compiled for {names}")
        return wrong

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "module":  # the bound call, kept where attribute lookup is cheapest
            self.__dict__["_run"] = value.__call__

    def forward(self, *args, **kwargs):
        if self.size_guard is not None and not kwargs and not self.size_guard.fits(args):
            if not self._warned_size:
                self._warned_size = True
                warnings.warn("this compiled model was specialized to its example inputs' sizes "
                              f"{[s for s in self.size_guard.shapes]} (batch free); other sizes run the masked "
                              "reference model: compile again with inputs of this size for speed", CompileWarning,
                              stacklevel=2)
            return self.size_guard.fallback(*args)
        return self.module(*args, **kwargs)
