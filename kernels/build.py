"""Compile generated C with the system gcc and load it with ctypes, cached by content hash.

The cache key covers the source, the flags, the gcc version and the CPU's flags, so a
library built on one machine is never loaded on another with a different ISA. Builds go
to a temporary file and are renamed into place, so two processes (two NNI trials)
building the same kernel at once never see a torn library.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sparta_explore.cache import resolve_cache_dir

FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-ffp-contract=fast", "-fno-math-errno")


class KernelBuildError(RuntimeError):
    """gcc failed; the message carries its first error lines."""


@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    """`gcc --version`'s first line, part of every cache key."""
    out = subprocess.run(["gcc", "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0]


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags (from /proc/cpuinfo), part of every cache key."""
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
    """A loaded shared library and where it came from."""

    lib: ctypes.CDLL
    path: Path
    key: str
    cached: bool
    build_seconds: float


def build(source: str, name: str, *, cache_dir: str | os.PathLike | None = None,
          extra_flags: tuple[str, ...] = ()) -> BuiltLibrary:
    """Compile `source` (C) into a shared library, or load it from the cache.

    Example:
        >>> lib = build("int add(int a, int b) { return a + b; }", "add").lib
        >>> lib.add(2, 3)
        5
    """
    flags = FLAGS + tuple(extra_flags)
    key = hashlib.sha256("\n".join([source, " ".join(flags), compiler_version(),
                                    " ".join(sorted(cpu_flags()))]).encode()).hexdigest()[:24]
    folder = resolve_cache_dir(cache_dir, "kernels")
    path = folder / f"{name}-{key}.so"
    start = time.perf_counter()
    cached = path.exists()
    if not cached:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src = Path(tmp) / f"{name}.c"
            src.write_text(source)
            out = Path(tmp) / f"{name}.so"
            proc = subprocess.run(["gcc", *flags, str(src), "-o", str(out), "-lm"], capture_output=True, text=True)
            if proc.returncode != 0:
                first = "\n".join(proc.stderr.strip().splitlines()[:8])
                raise KernelBuildError(f"gcc failed building {name}: {first}")
            os.replace(out, path)  # atomic: a concurrent builder of the same key writes the same bytes
    lib = ctypes.CDLL(str(path))
    return BuiltLibrary(lib, path, key, cached, time.perf_counter() - start)
