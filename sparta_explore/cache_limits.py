"""A size cap on the kernel cache, kept by evicting the least-recently-used entries.

Each kernel entry is three files, ``<name>-<key>.c``, ``.so`` and ``.json`` (see
`sparta_explore.kernels.build`). `build` marks an entry used on every load from the cache
(`mark_used`: the record's mtime is set to now, nothing is rewritten) and reports every new
build (`note_new_entry`). When the folder is over the cap, whole entries go, oldest use first,
down to `TRIM_TO` of the cap, so one eviction buys many builds before the next.

The cap is ``$SPARTA_EXPLORE_CACHE_MAX_MB`` (MB of 2**20 bytes; `DEFAULT_MAX_MB` if unset;
``0``, ``off`` or ``none``: no cap). It is read at each new build, never cached.

Example:
    >>> parse_max_mb("512")
    536870912
    >>> parse_max_mb("off") is None
    True
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sparta_explore.errors import ConfigError

MAX_MB_ENV = "SPARTA_EXPLORE_CACHE_MAX_MB"
DEFAULT_MAX_MB = 2048
MB = 1 << 20
TRIM_TO = 0.9  # evict down to 90% of the cap, so the next builds do not each evict again
RECENT_S = 60.0  # an entry used this recently is evicted only if the folder is still over the cap without it
RESCAN_EVERY = 32  # new builds between rescans: other processes fill the folder too
ENTRY_SUFFIXES = (".so", ".c", ".json")  # deleted in this order: a reader that finds no .so just rebuilds
_OFF = ("0", "off", "none")


class CacheSettingWarning(UserWarning):
    """``$SPARTA_EXPLORE_CACHE_MAX_MB`` could not be read during a build; the default cap applies."""


def parse_max_mb(text: str | None) -> int | None:
    """The cap in bytes for a ``$SPARTA_EXPLORE_CACHE_MAX_MB`` value; None means no cap.

    Unset or blank gives `DEFAULT_MAX_MB`; anything but a number >= 0, ``off`` or ``none`` is a
    `ConfigError` naming the variable.

    Example:
        >>> parse_max_mb(None) == DEFAULT_MAX_MB * MB, parse_max_mb("0"), parse_max_mb("0.5")
        (True, None, 524288)
    """
    value = (text or "").strip().lower()
    if not value:
        return DEFAULT_MAX_MB * MB
    if value in _OFF:
        return None
    try:
        mb = float(value)
    except ValueError:
        mb = math.nan
    if not math.isfinite(mb) or mb < 0:
        raise ConfigError(f"{MAX_MB_ENV} must be a size in MB (a number >= 0; 0, 'off' or 'none' for no cap), "
                          f"got {text!r}")
    return max(1, int(mb * MB)) if mb > 0 else None


def cache_max_bytes() -> int | None:
    """The kernel cache's cap in bytes from ``$SPARTA_EXPLORE_CACHE_MAX_MB`` (None: no cap).

    Example:
        >>> cache_max_bytes() is None or cache_max_bytes() > 0
        True
    """
    return parse_max_mb(os.environ.get(MAX_MB_ENV))


@functools.lru_cache(maxsize=8)
def _warn_bad_setting(message: str) -> None:
    warnings.warn(f"{message}; the kernel cache is capped at the default {DEFAULT_MAX_MB} MB until it is fixed",
                  CacheSettingWarning, stacklevel=4)


def _cap_for_builds() -> int | None:
    # A build must not fail on this: kernel callers catch ValueError (ConfigError is one) and
    # silently run the dense reference instead. One warning per bad value says what is wrong.
    try:
        return cache_max_bytes()
    except ConfigError as e:
        _warn_bad_setting(str(e))
        return DEFAULT_MAX_MB * MB


@dataclass(frozen=True)
class KernelEntry:
    """One kernel cache entry: its files (a torn one may lack some), total bytes and last use (epoch s)."""

    stem: str
    files: tuple[Path, ...]
    size: int
    last_used: float


@dataclass(frozen=True)
class Eviction:
    """What one eviction found and did: the folder's bytes when scanned, the entries this call removed,
    the bytes it freed, and the bytes left (entries another process evicted meanwhile count as gone)."""

    scanned_bytes: int
    removed: tuple[str, ...]
    freed_bytes: int
    remaining_bytes: int


def scan_kernels(folder: Path) -> list[KernelEntry]:
    """Every entry in a kernel folder, one stat per file; files that vanish mid-scan are skipped.

    In-progress builds (temporary folders, hidden ``.name.tmp`` files) are not entries.

    Example:
        >>> scan_kernels(Path("/nonexistent"))
        []
    """
    found: dict[str, list[tuple[Path, os.stat_result]]] = {}
    try:
        listing = os.scandir(folder)
    except FileNotFoundError:
        return []
    with listing:
        for item in listing:
            stem, dot, ext = item.name.rpartition(".")
            if not dot or not stem or item.name.startswith(".") or f".{ext}" not in ENTRY_SUFFIXES:
                continue
            try:
                if not item.is_file(follow_symlinks=False):
                    continue
                st = item.stat(follow_symlinks=False)
            except FileNotFoundError:  # another process evicted or cleared it after the listing
                continue
            found.setdefault(stem, []).append((Path(item.path), st))
    return [KernelEntry(stem, tuple(p for p, _ in files), sum(st.st_size for _, st in files),
                        max(st.st_mtime for _, st in files)) for stem, files in found.items()]


def mark_used(library: Path) -> None:
    """Record a load of the entry whose library is `library` (its ``.json`` mtime becomes now).

    A read-only cache is fine: the entry then keeps its old recency.

    Example:
        >>> mark_used(Path("/nonexistent/k-1.so"))
    """
    with contextlib.suppress(OSError):
        os.utime(library.with_suffix(".json"))


def _used_since(entry: KernelEntry) -> bool:
    # A loader may have marked it between our scan and now: then it is no longer the oldest.
    for path in entry.files:
        try:
            if path.stat().st_mtime > entry.last_used:
                return True
        except FileNotFoundError:
            continue
    return False


def remove_entry(entry: KernelEntry) -> int:
    """Delete an entry's files (library first, record last); the bytes this call freed.

    A file already gone (another process evicting the same entry) frees nothing and is no error.

    Example:
        >>> remove_entry(KernelEntry("k-1", (Path("/nonexistent/k-1.so"),), 10, 0.0))
        0
    """
    freed = 0
    for path in sorted(entry.files, key=lambda p: ENTRY_SUFFIXES.index(p.suffix)):
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        freed += size
    return freed


def evict_lru(folder: Path, max_bytes: int, *, keep: Iterable[str] = (), now: float | None = None,
              recent_s: float = RECENT_S, trim_to: float = TRIM_TO) -> Eviction:
    """If `folder` holds more than `max_bytes`, delete least-recently-used entries down to `trim_to` of it.

    Entries named in `keep` (stems, ``<name>-<key>``) are never removed. Entries used in the
    last `recent_s` seconds go only while the folder is still over `max_bytes` without them.

    Example:
        >>> import tempfile; d = Path(tempfile.mkdtemp())
        >>> _ = (d / "k-1.so").write_bytes(b"x" * 10)
        >>> evict_lru(d, 5, recent_s=0).removed
        ('k-1',)
    """
    entries = scan_kernels(folder)
    total = sum(e.size for e in entries)
    if total <= max_bytes:
        return Eviction(total, (), 0, total)
    now = time.time() if now is None else now
    kept = set(keep)
    by_age = sorted((e for e in entries if e.stem not in kept), key=lambda e: e.last_used)
    old = [e for e in by_age if now - e.last_used >= recent_s]
    recent = [e for e in by_age if now - e.last_used < recent_s]
    removed: list[str] = []
    freed, left = 0, total
    for tier, goal in ((old, int(max_bytes * trim_to)), (recent, max_bytes)):
        for entry in tier:
            if left <= goal:
                break
            if _used_since(entry):
                continue
            n = remove_entry(entry)
            left -= entry.size  # gone either way: removed here, or by another process evicting at once
            if n:
                freed += n
                removed.append(entry.stem)
    return Eviction(total, tuple(removed), freed, left)


@dataclass
class _Tally:
    bytes: int  # this process's estimate of the folder's size: the last scan plus its own builds since
    builds: int  # new builds since that scan


# Per process, per folder: a scan per build would cost ~10 ms on a folder of thousands of files.
_TALLIES: dict[Path, _Tally] = {}
_LOCK = threading.Lock()  # builds run on many threads at once (a package load builds in parallel)


def _entry_bytes(library: Path) -> int:
    total = 0
    for suffix in ENTRY_SUFFIXES:
        try:
            total += library.with_suffix(suffix).stat().st_size
        except FileNotFoundError:
            continue
    return total


def note_new_entry(library: Path) -> Eviction | None:
    """Count a newly built entry and, when the folder may be over the cap, evict (never this entry).

    The folder is scanned on a process's first build in it, every `RESCAN_EVERY` builds, and when
    the running estimate crosses the cap; otherwise this costs three stats. Returns the eviction
    when one ran, else None. A filesystem error warns and leaves the cache as it is.

    Example:
        >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / "k-1.so").write_bytes(b"x")
        >>> result = note_new_entry(d / "k-1.so")  # None when no cap is set
        >>> result is None or result.removed == ()  # far under the cap: nothing to evict
        True
    """
    cap = _cap_for_builds()
    if cap is None:
        return None
    folder = library.parent
    added = _entry_bytes(library)
    with _LOCK:
        tally = _TALLIES.get(folder)
        if tally is not None:
            tally.bytes += added
            tally.builds += 1
            if tally.bytes <= cap and tally.builds < RESCAN_EVERY:
                return None
        try:
            result = evict_lru(folder, cap, keep=(library.stem,))
        except OSError as e:
            warnings.warn(f"kernel cache {folder}: could not evict ({e}); it may grow over the "
                          f"{MAX_MB_ENV} cap", RuntimeWarning, stacklevel=3)
            return None
        _TALLIES[folder] = _Tally(result.remaining_bytes, 0)
    return result
