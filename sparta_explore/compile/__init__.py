"""The compile stage: graph passes, kernel choice and verification turn a model and its TeSAs into a CompiledModel.

`se.compile(model, table, x)` is callable on the package. The stage runs, in order: the
graph passes (`compile/passes/`: simplify, fold BatchNorm, constant channels, shrink,
attention, memory format), the plan, the measured kernel choice (`choose.py`,
`lowering.py`), the kernel passes (`kernel_pairs.py`, `epilogue.py`), the checks against the
user's table (`verify.py`, `table_reference.py`) and the whole-model guard (`guard.py`).

Importing the package loads `CompileConfig` only (the exploration stage imports it on its
own start-up path); `compile`, `CompiledModel` and `CompileWarning` load the stage on
first use.

Example:
    >>> import sparta_explore as se
    >>> cm = se.compile(model, table, (x,))   # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

from sparta_explore.callable_module import make_callable
from sparta_explore.compile.config import CompileConfig

_LAZY = {"compile": "pipeline", "CompiledModel": "compiled_model", "CompileWarning": "choose",
         "quantized_copy": "quantized_copy"}

__all__ = ["CompileConfig", "CompileWarning", "CompiledModel", "compile", "quantized_copy"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"sparta_explore.compile.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'sparta_explore.compile' has no attribute {name!r}")


make_callable(__name__, "compile")
