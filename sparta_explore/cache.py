"""Where sparta-explore keeps what it computes once: trained weights, kernels, profiles.

The location is an explicit argument everywhere; this module only supplies the default
(``~/.cache/sparta-explore``) and an atomic writer, so two processes (two NNI trials)
writing the same entry never leave a torn file behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def default_cache_dir() -> Path:
    """The user cache folder for sparta-explore (``~/.cache/sparta-explore``)."""
    return Path.home() / ".cache" / "sparta-explore"


def resolve_cache_dir(cache_dir: str | os.PathLike | None, sub: str) -> Path:
    """`cache_dir` (or the default) joined with `sub`, created if missing.

    Example:
        >>> resolve_cache_dir("/tmp/x", "zoo")
        PosixPath('/tmp/x/zoo')
    """
    path = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / sub
    path.mkdir(parents=True, exist_ok=True)
    return path


def content_key(payload: Any) -> str:
    """A short stable hash of a JSON-able payload, for cache file names.

    Example:
        >>> len(content_key({"a": 1}))
        16
    """
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write `path` through a temporary file in the same folder and rename it into place.

    Example:
        >>> atomic_write(Path("/tmp/a.bin"), lambda f: f.write(b"x"))
        PosixPath('/tmp/a.bin')
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
