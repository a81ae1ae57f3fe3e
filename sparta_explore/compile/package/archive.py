"""The package file: a zip archive of named parts, with a manifest that names, sizes and hashes every part.

Written to a temporary file beside the target and renamed into place, so a reader never sees
half a package. Read in full and checked before anything is built: the zip must open, the
manifest must be this format at this version, and every part it lists must be there with its
recorded SHA-256. A truncated, corrupt or foreign file is one `PackageError` naming the
file and what is wrong; nothing is half-loaded.

Example:
    >>> path = write_package(Path("/tmp/p.sparta"), {"a.json": b"{}"}, {"kind": "test"})
    >>> PackageReader(path).json("a.json")
    {}
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparta_explore.errors import PackageError

FORMAT = "sparta-explore package"
FORMAT_VERSION = 2  # 2: the permute int8 tables (runs of cells) and its fused driver's call changed
MANIFEST = "manifest.json"
_STORED = (".safetensors", ".npz", ".so")  # already binary or compressed: deflate only costs time


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_package(path: Path, parts: Mapping[str, bytes], manifest: dict[str, Any]) -> Path:
    """Write `parts` and the manifest (with every part's size and hash added) to `path` atomically.

    Example:
        >>> write_package(Path("/tmp/q.sparta"), {}, {}).name
        'q.sparta'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    full = {**manifest, "format": FORMAT, "format_version": FORMAT_VERSION,
            "files": {name: {"size": len(data), "sha256": _sha256(data)} for name, data in parts.items()}}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w") as zf:
            zf.writestr(MANIFEST, json.dumps(full, indent=1, allow_nan=False), zipfile.ZIP_DEFLATED)
            for name, data in parts.items():
                stored = name.endswith(_STORED)
                zf.writestr(name, data, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED,
                            compresslevel=None if stored else 1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class PackageReader:
    """A package read in full and checked (see the module docstring); `read`, `json` and `manifest` give its parts.

    Example:
        >>> PackageReader(Path("/nonexistent.sparta"))
        Traceback (most recent call last):
        ...
        sparta_explore.errors.PackageError: /nonexistent.sparta: no such file
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise PackageError(f"{self.path}: no such file")
        try:
            with zipfile.ZipFile(self.path) as zf:
                names = set(zf.namelist())
                if MANIFEST not in names:
                    raise PackageError(f"{self.path}: no {MANIFEST}: not a sparta-explore package")
                self.manifest = self._manifest(zf.read(MANIFEST))
                self._parts = {name: self._part(zf, name, info, names)
                               for name, info in self.manifest["files"].items()}
        except zipfile.BadZipFile as e:
            raise PackageError(f"{self.path}: not a sparta-explore package, or a truncated one (zip: {e})") from None
        except (zlib.error, EOFError, OSError) as e:
            raise PackageError(f"{self.path}: unreadable, truncated or corrupt ({type(e).__name__}: {e})") from None

    def _manifest(self, raw: bytes) -> dict[str, Any]:
        try:
            manifest = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise PackageError(f"{self.path}: {MANIFEST} is not JSON ({e})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise PackageError(f"{self.path}: not a sparta-explore package ({MANIFEST} names format "
                               f"{manifest.get('format') if isinstance(manifest, dict) else None!r})")
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise PackageError(f"{self.path}: written in package format version {version!r} (by sparta-explore "
                               f"{manifest.get('sparta_explore', '?')}); this sparta-explore reads version "
                               f"{FORMAT_VERSION}: load it with the version that wrote it, or compile the model again")
        files = manifest.get("files")
        if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
            raise PackageError(f"{self.path}: {MANIFEST} has no valid file list")
        return manifest

    def _part(self, zf: zipfile.ZipFile, name: str, info: dict[str, Any], names: set[str]) -> bytes:
        if name not in names:
            raise PackageError(f"{self.path}: file {name!r} listed in the manifest is missing")
        try:
            data = zf.read(name)
        except zipfile.BadZipFile as e:  # a CRC mismatch: the bytes changed after writing
            raise PackageError(f"{self.path}: file {name!r} is corrupt ({e})") from None
        if len(data) != info.get("size") or _sha256(data) != info.get("sha256"):
            raise PackageError(f"{self.path}: file {name!r} is corrupt (its size or SHA-256 differs from the "
                               "manifest's)")
        return data

    @property
    def files(self) -> set[str]:
        """The names of the package's parts (the manifest aside)."""
        return set(self._parts)

    def read(self, name: str) -> bytes:
        """The bytes of part `name`; a missing part is a `PackageError`."""
        if name not in self._parts:
            raise PackageError(f"{self.path}: the package has no {name!r}")
        return self._parts[name]

    def json(self, name: str) -> Any:
        """Part `name` parsed as JSON."""
        try:
            return json.loads(self.read(name).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise PackageError(f"{self.path}: {name!r} is not JSON ({e})") from None
