"""The steps every load shares, whatever model it holds.

First: the package read and checked, its kernel libraries made here, a decoder over it
(`open_package`). Last: the stored example run against the saved outputs, kernels switched to
their references if they disagree (`checked_example`), and the record of how it went
(`load_notes`). `load.py` and `inplace_form.py` do what lies between.

Example:
    >>> opened = open_package(PackageReader("model.sparta"), cache_dir=None, allow=())   # doctest: +SKIP
    >>> opened.libraries.plan.mode                                                        # doctest: +SKIP
    'native'
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from torch import nn

from sparta_explore.compile.choose import CompileWarning
from sparta_explore.compile.package.archive import PackageReader
from sparta_explore.compile.package.kernels import LoadedLibraries, checked_records, library_plan, to_reference
from sparta_explore.compile.package.parts import MODEL, TENSORS, arrays, example_check, isa_record, machine_record
from sparta_explore.compile.package.tensors import TensorTable
from sparta_explore.compile.package.values import Decoder
from sparta_explore.errors import PackageError

# a CompiledModel's graph; a model compiled in place (its kernels by path); a Llama as the decode step reads it
KINDS = ("compiled", "inplace", "decoder")


@dataclass(frozen=True)
class OpenedPackage:
    """A checked package (`reader`), its model part (`data`), its libraries made here, and a decoder over both."""

    reader: PackageReader
    data: dict[str, Any]
    libraries: LoadedLibraries
    decoder: Decoder


def package_kind(reader: PackageReader) -> str:
    """The kind of model the package holds (one of `KINDS`)."""
    kind = reader.manifest.get("kind")
    if kind not in KINDS:
        raise PackageError(f"{reader.path}: holds a model of unknown kind {kind!r}")
    return kind


def open_package(reader: PackageReader, cache_dir: str | os.PathLike | None, allow: Collection[str]
                 ) -> OpenedPackage:
    """Steps 1-2 of a load (see `load.py`): the model part, the libraries built (or planned), a decoder."""
    data = reader.json(MODEL)
    if not isinstance(data, dict) or data.get("kind") != package_kind(reader):
        raise PackageError(f"{reader.path}: its {MODEL} does not match its manifest")
    plan = library_plan(reader.manifest.get("isa") or {}, isa_record())
    records = checked_records(data.get("libraries", {}), reader.files, reader.path)
    sources = {r["file"]: reader.read(r["file"]).decode("utf-8", errors="replace") for r in records.values()}
    libraries = LoadedLibraries(records, sources, plan, cache_dir)  # builds start: the tensors are read meanwhile
    try:
        tensors = TensorTable(arrays(reader, TENSORS), data.get("tensors") or {}, str(reader.path))
    except BaseException:
        libraries.abort()
        raise
    return OpenedPackage(reader, data, libraries, Decoder(tensors, allow=allow, library=libraries.get))


def checked_example(opened: OpenedPackage, run: Callable[..., Any], kernels: nn.Module) -> dict[str, Any]:
    """Run the stored example through `run`; outputs beyond the tolerance switch the kernels under `kernels` to their
    references and check again (a `PackageError` if even they differ).

    Example:
        >>> checked_example(opened, cm.module, cm.module)["bit_identical"]   # doctest: +SKIP
        True
    """
    example, path = opened.data.get("example") or {}, opened.reader.path
    check = example_check(run, example, opened.reader)
    if not check["error"] <= check["tolerance"]:
        to_reference(kernels, f"load check failed ({check['error']:.2e} > {check['tolerance']:g} against the saved "
                              "outputs)")
        check = example_check(run, example, opened.reader)
        if not check["error"] <= check["tolerance"]:
            raise PackageError(f"{path}: the loaded model's outputs differ from the saved ones by {check['error']:.3g} "
                               f"(> {check['tolerance']:g}), even with reference ops")
        warnings.warn(f"{path}: the kernels' outputs differed from the saved ones; every op runs its reference "
                      "instead", CompileWarning, stacklevel=3)
    same_machine = opened.libraries.plan.mode == "native" and \
        opened.reader.manifest.get("machine", {}).get("key") == machine_record()["key"]
    return {**check, "same_machine": same_machine}


def load_notes(opened: OpenedPackage, check: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The `loaded` record: path, mode, seconds, libraries, the check's figures and the manifest."""
    lib = opened.libraries
    said = ("bit-identical" if check["bit_identical"] else f"max rel err {check['error']:.2e}") + \
        (" (same machine, same sources)" if check["same_machine"] else "")
    note = (f"{opened.reader.path} in {seconds:.2f} s; {lib.count} kernel libraries ({lib.seconds:.2f} s to build, "
            f"take from the cache or generate again); {lib.plan.note}; outputs vs saved: {said}")
    return {"path": str(opened.reader.path), "mode": lib.plan.mode, "seconds": seconds,
            "build_seconds": lib.seconds, "libraries": lib.count, "manifest": opened.reader.manifest,
            "note": note, **check}
