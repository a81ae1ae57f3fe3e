"""sparta-explore: make sparsity and quantization pay off in measured speed.

Importing the package is cheap: it loads the core types only. NNI is imported by
`sparta_explore.pruners` and `sparta_explore.quantizers` when they are first used.

Example:
    >>> import sparta_explore as se
    >>> g = se.capture(model, (x,))                       # doctest: +SKIP
    >>> table = se.pruners.prune(model, cfg, pruner="l1norm", graph=g)  # doctest: +SKIP
    >>> print(table.summary())                            # doctest: +SKIP
    >>> cm = se.compile(model, se.propagate(g, table), (x,))  # doctest: +SKIP
    >>> print(se.measure(cm, (x,)).median_ms)             # doctest: +SKIP
    >>> cm.save("model.sparta"); cm = se.load("model.sparta")  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

from sparta_explore.errors import CaptureError, ConfigError, SpartaError, TeSABitsError, TeSANameError, TeSAShapeError
from sparta_explore.graph import Graph, TensorInfo, capture
from sparta_explore.masking import apply_table, masked_copy
from sparta_explore.propagation import propagate, run_propagation
from sparta_explore.tesa import MAX_BITS, NumberFormat, TeSA
from sparta_explore.tesa_table import TeSATable

__version__ = "0.1.0"

# Submodules loaded on first attribute access, so `import sparta_explore` stays lean. The stage
# modules compile, measure and plan are callable: se.compile(model, table, x) runs compile.compile.
_LAZY_SUBMODULES = ("pruners", "quantizers", "kernels", "zoo", "cli", "compile", "measure", "plan", "device",
                    "explore")


# Functions of stages loaded on first use: se.load("model.sparta"), se.save(cm, "model.sparta"),
# se.quantized_copy(model, table, x) (the model a table with bits describes), se.generate(llama, ids, n)
_LAZY_FUNCTIONS = {"load": "sparta_explore.compile.package.load", "save": "sparta_explore.compile.package.save",
                   "quantized_copy": "sparta_explore.compile.quantized_copy",
                   "generate": "sparta_explore.compile.generate"}


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"sparta_explore.{name}")
    if name in _LAZY_FUNCTIONS:
        return getattr(importlib.import_module(_LAZY_FUNCTIONS[name]), name)
    raise AttributeError(f"module 'sparta_explore' has no attribute {name!r}")


__all__ = ["MAX_BITS", "CaptureError", "ConfigError", "Graph", "NumberFormat", "SpartaError", "TeSA",
           "TeSABitsError", "TeSANameError", "TeSAShapeError", "TeSATable", "TensorInfo", "apply_table",
           "capture", "masked_copy", "propagate", "run_propagation"]
