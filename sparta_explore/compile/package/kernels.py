"""Kernel libraries in a package: their C sources are written beside the model, and built again when it is read.

Saving keeps each library's source (deduplicated by its cache key) and how it was built.
Loading decides once, for the whole package (`library_plan`), then makes the libraries
(`LoadedLibraries`):

* **native**: this machine has the saved kernels' instruction set and a compiler; every
  source is built (or taken from the kernel cache: same source, flags and CPU, same
  key) in parallel, and each kernel binds the library built from its own source.
* **rebuild**: the instruction set differs (an AVX-512 package on an AVX2 machine): sources
  that hold vector code cannot run here, so each such kernel is generated again for this
  machine from its pattern, weights and chosen tiling (`KernelLinear.rebuilt`); portable
  sources (the fused pair's driver) are built as they are.
* **reference**: no C compiler; every kernel runs its PyTorch reference (one warning).

Example:
    >>> library_plan({"flags": ["avx2", "fma"]}, {"flags": ["avx2", "avx512f", "fma"]}).mode  # doctest: +SKIP
    'rebuild'
"""

from __future__ import annotations

import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from sparta_explore.errors import PackageError
from sparta_explore.kernels.build import (
    FLAGS,
    ISA_CEILINGS,
    BuiltLibrary,
    KernelBuildError,
    build,
    compiler_available,
    compiler_version,
    target_isa,
)
from sparta_explore.kernels.fused_ffn import DRIVER_NAME, FusedPair
from sparta_explore.kernels.sparse_linear import KernelFallbackWarning, KernelLinear

PORTABLE = frozenset({DRIVER_NAME})  # plain C with no vector code: builds for any x86-64 machine


def source_file(name: str, key: str) -> str:
    """Where a library's source lies inside the package.

    Example:
        >>> source_file("sparse_linear", "ab12")
        'kernels/sparse_linear-ab12.c'
    """
    return f"kernels/{name}-{key}.c"


@dataclass
class LibraryCollector:
    """Collects the libraries a model being saved uses: `add(built, where)` is the encoder's library callback."""

    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def add(self, built: BuiltLibrary, where: str) -> str:
        """The key of `built`, its source read from the kernel cache on first sight."""
        if built.key in self.records:
            return built.key
        name = built.path.name[:-len(f"-{built.key}.so")] if built.path.name.endswith(f"-{built.key}.so") \
            else built.path.stem
        try:
            source = built.source_path.read_text()
        except OSError as e:
            raise PackageError(f"{where}: its kernel source {built.source_path} is not readable ({e}); compile the "
                               "model again, then save it") from None
        file = source_file(name, built.key)
        self.sources[file] = source
        self.records[built.key] = {"name": name, "file": file, "portable": name in PORTABLE,
                                   "flags": list(FLAGS + ISA_CEILINGS[target_isa()][1]),
                                   "compiler": compiler_version()}
        return built.key


@dataclass(frozen=True)
class LibraryPlan:
    """How a package's libraries are made on this machine (see the module docstring) and why."""

    mode: str  # "native", "rebuild" or "reference"
    note: str


def library_plan(saved_isa: dict[str, Any], this_isa: dict[str, Any]) -> LibraryPlan:
    """native, rebuild or reference for a package built for `saved_isa` loaded on a machine with `this_isa`.

    Example:
        >>> library_plan({"flags": ["avx2"]}, {"flags": ["avx2"]}).mode in ("native", "reference")
        True
    """
    if not compiler_available():
        return LibraryPlan("reference", "no C compiler on this machine: every kernel runs its PyTorch reference op")
    saved, here = sorted(saved_isa.get("flags", ())), sorted(this_isa.get("flags", ()))
    if saved != here:
        return LibraryPlan("rebuild", f"kernels generated again for this machine (saved for {' '.join(saved) or '-'}; "
                                      f"this machine: {' '.join(here) or '-'})")
    return LibraryPlan("native", "kernels built from the package's sources")


def checked_records(data: Any, files: set[str], package: Path) -> dict[str, dict[str, Any]]:
    """The package's library records, each naming a source file the package holds.

    Example:
        >>> checked_records({}, set(), Path("m.sparta"))
        {}
    """
    if not isinstance(data, dict):
        raise PackageError(f"{package}: malformed kernel library table")
    for key, record in data.items():
        if not isinstance(record, dict) or not isinstance(record.get("name"), str) or \
                not isinstance(record.get("file"), str):
            raise PackageError(f"{package}: malformed record of kernel library {key!r}")
        if record["file"] not in files:
            raise PackageError(f"{package}: kernel source {record['file']!r} is missing from the package")
    return data


class LoadedLibraries:
    """A package's libraries made on this machine (`library_plan`), handed to kernels by key as they are built.

    Builds start at once, in parallel (gcc runs in its own processes: one thread per core),
    largest source first so the last ones are short, while the rest of the package is read;
    `get` (the decoder's library callback) waits for the one a kernel needs. `finish` runs
    after each module is read: kernels point at this machine's kernel cache, are generated
    again (rebuild mode), or note why they run their reference. `fell_back` lists the ops that
    run references against the plan (a build failed here); `seconds` is the time until the
    last library was ready (`close`).
    """

    def __init__(self, records: dict[str, dict[str, Any]], sources: dict[str, str], plan: LibraryPlan,
                 cache_dir: str | os.PathLike | None) -> None:
        self._started = time.perf_counter()
        self.plan, self.cache_dir, self.count = plan, cache_dir, len(records)
        self.built: dict[str, BuiltLibrary | None] = {key: None for key in records}
        todo = {key: r for key, r in records.items()
                if plan.mode == "native" or (plan.mode == "rebuild" and r.get("portable"))}
        self.why: dict[str, str] = {key: plan.note for key in records if key not in todo}
        self.fell_back: list[str] = []
        self.seconds = 0.0
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1)))
        order = sorted(todo, key=lambda key: -len(sources[todo[key]["file"]]))
        self._pending = {key: self._pool.submit(self._make, sources[todo[key]["file"]], str(todo[key]["name"]))
                         for key in order}

    def _make(self, source: str, name: str) -> tuple[BuiltLibrary | None, str | None]:
        try:
            return build(source, name, cache_dir=self.cache_dir), None
        except (KernelBuildError, OSError) as e:
            return None, f"its kernel failed to build ({str(e).splitlines()[0]})"

    def _collect(self, key: str) -> None:
        library, problem = self._pending.pop(key).result()
        self.built[key] = library
        if problem is not None:
            self.why[key] = problem

    def abort(self) -> None:
        """Stop: builds not yet started never start (a load that failed part way)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Wait for every build (a package may hold libraries no module read) and note when the last was ready."""
        for key in list(self._pending):
            self._collect(key)
        self._pool.shutdown()
        self.seconds += time.perf_counter() - self._started

    def get(self, key: Any, where: str) -> BuiltLibrary | None:
        """The library saved under `key` as made here (None: not built here; `finish` says why)."""
        if key not in self.built:
            raise PackageError(f"{where}: refers to kernel library {key!r}, which the package does not hold")
        if key in self._pending:
            self._collect(key)
        return self.built[key]

    def finish(self, module: nn.Module, record: dict, path: str) -> nn.Module:
        """After each module is read: see the class docstring. Returns the module to use."""
        if not isinstance(module, KernelLinear):
            return module
        module.cache_dir = self.cache_dir
        library = record["state"].get("built")
        key = library.get("$library") if isinstance(library, dict) else None
        if key is None or module.built is not None:
            return module
        if self.plan.mode == "rebuild":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", KernelFallbackWarning)  # said once, for all ops, by `warn`
                rebuilt = module.rebuilt(self.cache_dir)
            if rebuilt.fallback_reason is not None:
                self.fell_back.append(f"{module.label or path} ({rebuilt.fallback_reason})")
            return rebuilt
        if module.fallback_reason is None:
            module.fallback_reason = self.why.get(key, self.plan.note)
            if self.plan.mode == "native":
                self.fell_back.append(f"{module.label or path} ({module.fallback_reason})")
        return module

    def warn(self, package: Path) -> None:
        """One warning when kernels run their references: no compiler here, or builds that failed."""
        from sparta_explore.kernels.build import CompilerMissingWarning

        if self.plan.mode == "reference" and self.count:
            warnings.warn(f"{package}: no C compiler on this machine, so its {self.count} kernel libraries run as "
                          "their PyTorch reference ops (same results within tolerance, slower); install gcc for "
                          "the kernels", CompilerMissingWarning, stacklevel=3)
        if self.fell_back:
            warnings.warn(f"{package}: {len(self.fell_back)} kernel(s) run their reference op: "
                          f"{'; '.join(self.fell_back[:3])}", KernelFallbackWarning, stacklevel=3)


def to_reference(module: nn.Module, why: str) -> None:
    """Every kernel under `module` runs its PyTorch reference from now on (a load whose outputs did not match).

    Example:
        >>> to_reference(cm.module, "load check failed")   # doctest: +SKIP
    """
    for m in module.modules():
        if isinstance(m, (KernelLinear, FusedPair)) and m._fn is not None:
            m._fn = None
            m.fallback_reason = why
