"""Where sparta-explore keeps what it computes once: trained weights, kernels, profiles.

The location is an explicit argument everywhere (`cache_dir=`); this module supplies the
default and an atomic writer, so two processes (two NNI trials) writing the same entry
never leave a torn file behind.

The default follows the platform convention, so a user or CI can isolate it without
touching code: ``$SPARTA_EXPLORE_CACHE`` if set, else ``$XDG_CACHE_HOME/sparta-explore``,
else ``~/.cache/sparta-explore``. These are read when a default is needed, never cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

CACHE_ENV = "SPARTA_EXPLORE_CACHE"


def default_cache_dir() -> Path:
    """The user cache folder: ``$SPARTA_EXPLORE_CACHE``, ``$XDG_CACHE_HOME/sparta-explore`` or ``~/.cache/...``.

    Example:
        >>> default_cache_dir().is_absolute()
        True
    """
    explicit = os.environ.get(CACHE_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg and Path(xdg).is_absolute():  # the XDG spec says to ignore a relative path
        return Path(xdg) / "sparta-explore"
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
