"""`save`: a compiled model as one package file that `load` rebuilds without tuning, timing or the original model.

The package (`archive.py`) holds:

* ``manifest.json``: format and version, the library, torch and Python versions, the machine
  (CPU, kernel ISA flags, threads), the compiler and build flags, notes, and the caller's
  `metadata` (an exported trial's parameters and metrics);
* ``model.json``: the module tree that runs (classes by name, attributes, the fx graph), the
  size guard's fallback, the kernel library records, the per-op plan with each kernel's
  tiling, the pass report, checks and whole-model timing;
* ``tensors.safetensors``: every weight and packed kernel array (safetensors: never pickle);
* ``kernels/<name>-<key>.c``: each kernel's C source;
* ``example.safetensors``: the example inputs and the outputs of what was saved;
* ``table.npz`` (and ``input_table.npz``): the TeSA tables compile used.

A model compiled in place is saved by `inplace_form.save_inplace` (its own module tree
cannot be written as a graph); a Llama-pattern causal LM as it is (compressed, not compiled) by
`decoder_form.save_decoder`: its weights as the decode step reads them. A model the guard left
running eagerly (the user's own masked module) is saved as the masked captured graph, which
computes the same; the manifest says so.

Example:
    >>> save(cm, "bert.sparta")   # doctest: +SKIP
    PosixPath('bert.sparta')
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from sparta_explore.compile.inplace import ATTRIBUTE
from sparta_explore.compile.llama_step import why_not_llama
from sparta_explore.compile.package.archive import write_package
from sparta_explore.compile.package.decoder_form import save_decoder
from sparta_explore.compile.package.inplace_form import save_inplace
from sparta_explore.compile.package.kernels import LibraryCollector
from sparta_explore.compile.package.modules import encode_module
from sparta_explore.compile.package.parts import (
    example_record,
    manifest,
    package_parts,
    report_record,
)
from sparta_explore.compile.package.tensors import TensorStore
from sparta_explore.compile.package.values import Encoder
from sparta_explore.compile.record import CompileRecord
from sparta_explore.errors import PackageError


def _runnable(cm: Any, module: nn.Module, what: str) -> tuple[fx.GraphModule, str | None]:
    """`module` if it is a graph; else the masked captured graph (the same function), and a note saying so."""
    if isinstance(module, fx.GraphModule):
        return module, None
    from sparta_explore.compile.table_reference import table_reference

    if cm.record.graph is None or cm.record.table is None:
        raise PackageError(f"the {what} is an eager module and this CompiledModel keeps no captured graph to save "
                           "in its place")
    graph, _ = table_reference(cm.record.graph, cm.record.table)
    return graph, (f"the {what} ran the model as given, masked (faster than the kernels here); the package holds "
                   "the masked captured graph, which computes the same")


def save(model: nn.Module, path: str | os.PathLike, *, metadata: Mapping[str, Any] | None = None,
         allow: Collection[str] = (), act_bits: int | None = None, example_ids: torch.Tensor | None = None) -> Path:
    """Write a compiled model (or one compiled in place, or a Llama for the decode step) to the package file
    `path`; returns the path.

    `metadata` (JSON-able) goes into the manifest; `allow` names packages of your own whose
    module classes the model holds (they must be importable where it is loaded, with the same
    `allow`). A Llama's package decodes with `act_bits` (32, or 8: int8 activations) and checks
    `example_ids` (a prompt) at load.

    Example:
        >>> save(cm, "model.sparta", metadata={"trial": "a1b2"})   # doctest: +SKIP
    """
    compiled = isinstance(getattr(model, "record", None), CompileRecord)  # a CompiledModel (from compile or load)
    inplace = isinstance(model, nn.Module) and getattr(model, ATTRIBUTE, None) is not None
    if (compiled or inplace) and (act_bits is not None or example_ids is not None):
        raise PackageError("act_bits / example_ids describe a Llama saved for the decode step, not a compiled model")
    if compiled:
        return _save_compiled(model, Path(path), metadata, allow)
    if inplace:
        return save_inplace(model, Path(path), metadata=metadata, allow=allow)
    if isinstance(model, nn.Module) and why_not_llama(model) is None:
        return save_decoder(model, Path(path), act_bits=32 if act_bits is None else act_bits,
                            example_ids=example_ids, metadata=metadata)
    raise PackageError(f"save takes a CompiledModel, a model compiled in place or a Llama-pattern causal LM, got "
                       f"{type(model).__name__}")


def _save_compiled(cm: Any, path: Path, metadata: Mapping[str, Any] | None, allow: Collection[str]
                   ) -> Path:
    if cm.record.example is None:
        raise PackageError("this CompiledModel keeps no example inputs: compile it with se.compile to save it")
    started = time.perf_counter()
    store, libraries = TensorStore(), LibraryCollector()
    enc = Encoder(store, libraries.add, allow)
    module, note = _runnable(cm, cm.module, "compiled model")
    notes = [note] if note else []
    size_guard = None
    if cm.size_guard is not None:
        fallback, _ = _runnable(cm, cm.size_guard.fallback, "size guard's fallback")
        size_guard = {"shapes": enc.encode(cm.size_guard.shapes, "size guard"),
                      "fallback": encode_module(enc, fallback, "size_guard")}
    model = encode_module(enc, module)
    example, example_arrays = example_record(module, cm.record.example)
    arrays, meta = store.arrays()
    report = report_record(cm.report, cm.passes, cm.checks, cm.guard, cm.seconds, enc, module)
    data = {"kind": "compiled", "model": model, "size_guard": size_guard, "tensors": meta,
            "input_dtypes": enc.encode(dict(cm.input_dtypes), "input dtypes"), "libraries": libraries.records,
            "example": {**example, "tolerance": cm.record.tolerance}, "notes": notes,
            "report": {**report, "unread": list(cm.unread), "fp32_error": enc.encode(float(cm.fp32_error), "fp32")}}
    parts = package_parts(data, arrays, example_arrays, libraries.sources, cm.record)
    return write_package(path, parts, manifest("compiled", started, len(libraries.records), notes, metadata))
