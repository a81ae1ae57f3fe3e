"""Compile generated C with the system gcc and load it with ctypes, cached by content hash.

The cache key covers the source, the flags, the gcc version and the CPU's flags, so a
library built on one machine is never loaded on another with a different ISA. Builds go
to a temporary file and are renamed into place, so two processes (two NNI trials)
building the same kernel at once never see a torn library.

Each entry is three files: ``<name>-<key>.c`` (the source that ran, for reading),
``<name>-<key>.so`` and ``<name>-<key>.json`` (the library's size and SHA-256, written after
it). A library is loaded only if it matches its record: a truncated or garbage ``.so``
would crash the process inside `dlopen` (SIGBUS), so a mismatch is rebuilt instead.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from sparta_explore.cache import atomic_write, resolve_cache_dir
from sparta_explore.cache_limits import mark_used, note_new_entry

# -pipe: the assembler reads the compiler's output as it comes (no temporary file); the library is the same
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-ffp-contract=fast", "-fno-math-errno", "-pipe")
COMPILER = "gcc"
# Portable C of instructions this CPU lacks (`emulate_dot`: tests of the VNNI and permute paths on any CPU) is
# checked for its results, never timed: -O1 builds an emulated VNNI kernel in 1.6 s where -O3 took 8.1 (Zen 3)
EMULATED_FLAGS = ("-O1",)


class KernelBuildError(RuntimeError):
    """gcc failed (or is missing); the message carries its first error lines."""


class CompilerMissingWarning(UserWarning):
    """No C compiler on PATH: every op runs on PyTorch's own kernels."""


@functools.lru_cache(maxsize=1)
def compiler_version() -> str | None:
    """`gcc --version`'s first line (part of every cache key), or None when gcc is not on PATH.

    Example:
        >>> compiler_version() is None or compiler_version().startswith("gcc")
        True
    """
    exe = shutil.which(COMPILER)
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.splitlines()
    return lines[0] if lines else None


def compiler_available() -> bool:
    """Whether kernels can be built on this machine (gcc on PATH and answering).

    Example:
        >>> isinstance(compiler_available(), bool)
        True
    """
    return compiler_version() is not None


@functools.lru_cache(maxsize=1)
def warn_compiler_missing() -> None:
    """Warn, once per process, that no compiler exists and PyTorch's kernels run instead.

    Example:
        >>> warn_compiler_missing() if not compiler_available() else None
    """
    warnings.warn(f"no C compiler: {COMPILER!r} is not on PATH, so no kernel can be built; every op runs on "
                  "PyTorch's own kernels (dense and channel-shrink). Install gcc to get the sparse kernels",
                  CompilerMissingWarning, stacklevel=3)


# Instruction-set ceilings below the CPU's own: the flags they hide and the gcc options that keep
# -march=native code under them. "avx2" runs an AVX-512 VNNI machine as an AVX2 + FMA one
# (for the AVX2 peers table and for checking the AVX2 paths where no such machine is at hand).
ISA_CEILINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "native": ((), ()),
    "avx2": (("avx512", "avx_vnni", "amx"), ("-mno-avx512f", "-mno-avxvnni")),
}
_ceiling = ["native"]  # process-wide, like torch.set_num_threads: set_target_isa changes it


def set_target_isa(name: str) -> None:
    """Build and choose kernels as if the CPU had no instruction set above `name` ("native" undoes it).

    Every cache key holds the flags, so kernels, tile choices and device profiles made under a
    ceiling never mix with native ones. Timings still come from this CPU (its clocks and caches).

    Example:
        >>> set_target_isa("avx2"); vector_width()
        8
        >>> set_target_isa("native")
    """
    if name not in ISA_CEILINGS:
        raise ValueError(f"unknown target ISA {name!r}; choose from {sorted(ISA_CEILINGS)}")
    _ceiling[0] = name


def target_isa() -> str:
    """The ceiling `set_target_isa` set: "native" unless lowered."""
    return _ceiling[0]


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags (from /proc/cpuinfo) under the target ISA ceiling, part of every cache key."""
    hidden = ISA_CEILINGS[_ceiling[0]][0]
    return frozenset(f for f in native_cpu_flags() if not f.startswith(hidden))


@functools.lru_cache(maxsize=1)
def native_cpu_flags() -> frozenset[str]:
    """The CPU's own feature flags, from /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return frozenset()  # no /proc (not Linux): no flags known, so the 8-lane AVX2 path is assumed
    return frozenset()


def vector_width() -> int:
    """fp32 lanes of the widest vector unit the kernels target: 16 with AVX-512F, else 8 (AVX2)."""
    return 16 if "avx512f" in cpu_flags() else 8


@dataclass(frozen=True)
class BuiltLibrary:
    """A loaded shared library and where it came from (`lib` is None once pickled)."""

    lib: ctypes.CDLL | None
    path: Path
    key: str
    cached: bool
    build_seconds: float

    @property
    def source_path(self) -> Path:
        """The C source this library was built from, kept beside it for reading."""
        return self.path.with_suffix(".c")

    def detached(self) -> BuiltLibrary:
        """A picklable copy without the ctypes handle."""
        return replace(self, lib=None)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _record_path(path: Path) -> Path:
    return path.with_suffix(".json")


def library_problem(path: Path) -> str | None:
    """Why the cached library at `path` must not be loaded, or None if it matches its build record.

    Example:
        >>> library_problem(Path("/nonexistent/k.so"))
        'missing'
    """
    if not path.is_file():
        return "missing"
    try:
        record = json.loads(_record_path(path).read_text())
        size, digest = int(record["size"]), str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return "no valid build record"
    actual = path.stat().st_size
    if actual != size:
        return f"size {actual} bytes, recorded {size}"
    if _digest(path) != digest:
        return "checksum differs from its build record"
    return None


def load_library(path: str | os.PathLike) -> ctypes.CDLL:
    """`ctypes.CDLL(path)` after checking the file against its build record (never dlopen a torn file).

    Raises `KernelBuildError` (naming the file) when it does not match.

    Example:
        >>> load_library(build("int one(void) { return 1; }", "one").path).one()
        1
    """
    path = Path(path)
    problem = library_problem(path)
    if problem is not None:
        raise KernelBuildError(f"cached kernel library {path} is unusable: {problem}")
    return ctypes.CDLL(str(path))


def _compile(source: str, name: str, flags: tuple[str, ...], folder: Path, path: Path) -> None:
    exe = shutil.which(COMPILER)
    if exe is None:
        raise KernelBuildError(f"cannot build {name}: no C compiler ({COMPILER!r} is not on PATH)")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(source)
        out = Path(tmp) / f"{name}.so"
        proc = subprocess.run([exe, *flags, str(src), "-o", str(out), "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            first = "\n".join(proc.stderr.strip().splitlines()[:8])
            raise KernelBuildError(f"gcc failed building {name}: {first}")
        record = json.dumps({"size": out.stat().st_size, "sha256": _digest(out), "compiler": compiler_version(),
                             "flags": list(flags)}).encode()
        os.replace(src, path.with_suffix(".c"))
        os.replace(out, path)  # atomic: a concurrent builder of the same key writes the same bytes
        atomic_write(_record_path(path), lambda f: f.write(record))


def build(source: str, name: str, *, cache_dir: str | os.PathLike | None = None,
          extra_flags: tuple[str, ...] = (), emulated: bool = False) -> BuiltLibrary:
    """Compile `source` (C) into a shared library, or load it from the cache (`emulated`: portable C of
    instructions this CPU lacks, built at `EMULATED_FLAGS`).

    A cache entry that does not match its build record (truncated, garbage, no record) is
    rebuilt with a warning. No compiler raises `KernelBuildError`.

    Example:
        >>> lib = build("int add(int a, int b) { return a + b; }", "add").lib
        >>> lib.add(2, 3)
        5
    """
    flags = FLAGS + ISA_CEILINGS[_ceiling[0]][1] + tuple(extra_flags) + (EMULATED_FLAGS if emulated else ())
    cc = compiler_version()
    if cc is None:
        raise KernelBuildError(f"cannot build {name}: no C compiler ({COMPILER!r} is not on PATH)")
    key = hashlib.sha256("\n".join([source, " ".join(flags), cc, " ".join(sorted(cpu_flags()))]).encode()
                         ).hexdigest()[:24]
    folder = resolve_cache_dir(cache_dir, "kernels")
    path = folder / f"{name}-{key}.so"
    start = time.perf_counter()
    problem = library_problem(path)
    cached = problem is None
    if problem not in (None, "missing"):
        warnings.warn(f"kernel cache entry {path} is corrupt ({problem}): rebuilding it", RuntimeWarning,
                      stacklevel=2)
    if cached:
        mark_used(path)  # recency for the cache's least-recently-used eviction
    else:
        _compile(source, name, flags, folder, path)
        note_new_entry(path)  # over $SPARTA_EXPLORE_CACHE_MAX_MB: evicts the oldest entries, never this one
    lib = load_library(path)
    return BuiltLibrary(lib, path, key, cached, time.perf_counter() - start)
