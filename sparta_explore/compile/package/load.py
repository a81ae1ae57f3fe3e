"""`load`: a package file back to a model that runs, without tuning, timing or the original model.

1. The whole file is read and checked first (`archive.PackageReader`: zip, manifest, format
   version, every part's hash): a damaged package is one `PackageError`, nothing half-built.
2. Kernel libraries are built from the package's C sources, in parallel, or taken from the
   kernel cache (same source, flags and CPU: same key); on a machine whose instruction set
   differs, kernels are generated again for it; with no compiler they run their PyTorch
   reference ops (`kernels.py`, one warning).
3. The module tree is rebuilt from its records (`modules.py`), weights from safetensors.
4. The stored example runs and its outputs are compared with the saved ones: bit-identical
   is expected where the kernels were built from the saved sources on the same machine;
   elsewhere within the compile tolerance. Outputs beyond it switch every kernel to its
   reference and check again; if even that fails, loading fails.

A package of a model compiled in place loads into a model (`inplace_form.load_inplace`); a decoder
package (a compressed Llama as the decode step reads it) into a Hugging Face model that
`generate` decodes through the step (`decoder_form.load_decoder`).

Example:
    >>> cm = load("bert.sparta")   # doctest: +SKIP
    >>> print(cm.summary())        # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection

import pandas as pd
from torch import nn

from sparta_explore.compile.compiled_model import CompiledModel, CompileRecord, SizeGuard
from sparta_explore.compile.package.archive import PackageReader
from sparta_explore.compile.package.decoder_form import load_decoder
from sparta_explore.compile.package.inplace_form import load_inplace
from sparta_explore.compile.package.modules import decode_module
from sparta_explore.compile.package.parts import INPUT_TABLE, TABLE, example_call, frame_from, read_table
from sparta_explore.compile.package.reading import (
    OpenedPackage,
    checked_example,
    load_notes,
    open_package,
    package_kind,
)
from sparta_explore.errors import PackageError


def load(path: str | os.PathLike, *, model: nn.Module | None = None, cache_dir: str | os.PathLike | None = None,
         allow: Collection[str] = ()) -> CompiledModel | nn.Module:
    """The model saved at `path` (see the module docstring): a `CompiledModel`, or, for a package of a model
    compiled in place or of a decoder, that model with its kernels (`model`: a fresh instance of the same
    architecture to load into; Hugging Face models are rebuilt from their saved config when it is None).

    `cache_dir`: where kernel libraries are built and cached (None: the default cache);
    `allow`: packages of your own whose module classes the model holds (as given to `save`).

    Example:
        >>> cm = load("model.sparta"); y = cm(x)   # doctest: +SKIP
    """
    started = time.perf_counter()
    reader = PackageReader(path)
    kind = package_kind(reader)
    opened = open_package(reader, cache_dir, allow)
    try:
        if kind == "inplace":
            return load_inplace(opened, model, started)
        if kind == "decoder":
            return load_decoder(opened, model, started)
        return _load_compiled(opened, model, started)
    except BaseException:
        opened.libraries.abort()  # builds not started yet never start; a finished load changes nothing here
        raise


def _load_compiled(opened: OpenedPackage, model: nn.Module | None, started: float) -> CompiledModel:
    reader, data, dec = opened.reader, opened.data, opened.decoder
    if model is not None:
        raise PackageError(f"{reader.path}: holds a compiled model (a graph of its own): load it without model=")
    module = decode_module(dec, data.get("model"), "", opened.libraries.finish)
    guard = data.get("size_guard")
    size_guard = None if guard is None else SizeGuard(
        dec.decode(guard.get("shapes"), "size guard"), decode_module(dec, guard.get("fallback"), "size_guard"))
    opened.libraries.close()
    opened.libraries.warn(reader.path)
    check = checked_example(opened, module, module)
    report = data.get("report") or {}
    checks = pd.concat([frame_from(report.get("checks"), "checks", dec),
                        pd.DataFrame([{"check": "load (saved outputs)", "error": check["error"],
                                       "tolerance": check["tolerance"], "passed": True}])], ignore_index=True)
    loaded = load_notes(opened, check, time.perf_counter() - started)
    record = CompileRecord(table=read_table(reader, TABLE), input_table=read_table(reader, INPUT_TABLE),
                           example=example_call(data.get("example") or {}, reader), tolerance=check["tolerance"],
                           report=frame_from(report.get("plan"), "plan", dec),
                           notes=(("loaded", loaded["note"]), *(("saved", n) for n in data.get("notes", ()))),
                           loaded=loaded)
    return CompiledModel(module, None, checks, float(report.get("seconds") or 0.0), list(report.get("unread", [])),
                         float(dec.decode(report.get("fp32_error", 0.0), "fp32 error")),
                         passes=frame_from(report.get("passes"), "passes", dec),
                         guard=dec.decode(report.get("guard"), "guard"), size_guard=size_guard,
                         input_dtypes=dec.decode(data.get("input_dtypes", {}), "input dtypes"), record=record)
