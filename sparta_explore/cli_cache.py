"""The `sparta-explore cache` command: what the cache holds, clearing it, trimming kernels to the cap.

``cache`` (or ``cache info``) lists each sub-folder (kernels, tuning, device, zoo, ...) with its
files and bytes, the total and the kernel cap; ``cache clear`` deletes the kernels (other
sub-folders only when named with ``--what``); ``cache trim`` evicts least-recently-used kernels
now. Nothing here imports more than the standard library.

Example:
    $ sparta-explore cache
    $ sparta-explore cache clear --what kernels,tuning
    $ sparta-explore cache trim --max-mb 500
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparta_explore.cache import default_cache_dir
from sparta_explore.cache_limits import (
    DEFAULT_MAX_MB,
    MAX_MB_ENV,
    MB,
    TRIM_TO,
    cache_max_bytes,
    evict_lru,
    remove_entry,
    scan_kernels,
)
from sparta_explore.cli_args import positive_float
from sparta_explore.errors import ConfigError

KERNELS = "kernels"
KNOWN = ("device", KERNELS, "tuning", "workloads", "zoo")  # what the library writes; absent until first used
ACTIONS = ("info", "clear", "trim")


def cache_arguments(p: argparse.ArgumentParser) -> None:
    """The `cache` command's options: the action, the folder, what to clear, the cap to trim to."""
    p.add_argument("action", nargs="?", choices=ACTIONS, default="info",
                   help="info (default): sizes per sub-folder; clear: delete; trim: evict old kernels to the cap")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="the cache folder (default: $SPARTA_EXPLORE_CACHE, else $XDG_CACHE_HOME/sparta-explore, "
                        "else ~/.cache/sparta-explore)")
    p.add_argument("--what", default=None,
                   help="with clear: comma-separated sub-folders, e.g. kernels,tuning, or 'all' (default: kernels; "
                        "the device profile and zoo weights go only when named)")
    p.add_argument("--max-mb", type=positive_float, default=None,
                   help=f"with trim: the cap in MB (default: ${MAX_MB_ENV}, else {DEFAULT_MAX_MB})")


def format_size(n: int) -> str:
    """Bytes as a short human size (powers of 1024).

    Example:
        >>> format_size(512), format_size(3 * 2**20), format_size(5 * 2**30)
        ('512 B', '3.0 MB', '5.0 GB')
    """
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _files(n: int) -> str:
    return f"{n} file{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class FolderUsage:
    """A cache sub-folder's file count and bytes (every file below it)."""

    name: str
    files: int
    size: int


def folder_usage(folder: Path) -> FolderUsage:
    """Files and bytes under `folder`, walked with one stat per file; vanishing files are skipped.

    Example:
        >>> folder_usage(Path("/nonexistent"))
        FolderUsage(name='nonexistent', files=0, size=0)
    """
    files = size = 0
    stack = [folder]
    while stack:
        try:
            listing = os.scandir(stack.pop())
        except (FileNotFoundError, NotADirectoryError):
            continue
        with listing:
            for item in listing:
                try:
                    if item.is_dir(follow_symlinks=False):
                        stack.append(Path(item.path))
                    elif item.is_file(follow_symlinks=False):
                        size += item.stat(follow_symlinks=False).st_size
                        files += 1
                except FileNotFoundError:
                    continue
    return FolderUsage(folder.name, files, size)


def sub_folders(root: Path) -> list[str]:
    """The names of the cache's sub-folders, sorted (none if the cache does not exist yet).

    Example:
        >>> sub_folders(Path("/nonexistent"))
        []
    """
    try:
        return sorted(p.name for p in root.iterdir() if p.is_dir())
    except FileNotFoundError:
        return []


def _cap_text(cap: int | None) -> str:
    if cap is None:
        return f"none ({MAX_MB_ENV} is 0/off)"
    source = f"${MAX_MB_ENV}" if os.environ.get(MAX_MB_ENV, "").strip() else "the default"
    return f"{format_size(cap)} ({source}); over it, least-recently-used kernels are evicted to {TRIM_TO:.0%}"


def cache_info(root: Path, echo: Callable[[str], None] = print) -> None:
    """Print the cache folder, each sub-folder's files and bytes (kernel entries too), the total and the cap.

    Example:
        >>> cache_info(Path("/nonexistent"), echo=lambda line: None)
    """
    cap = cache_max_bytes()  # a bad setting is the command's one-line error, before any output
    echo(f"cache folder: {root}" + ("" if root.is_dir() else " (does not exist yet)"))
    total = 0
    for name in sub_folders(root):
        usage = folder_usage(root / name)
        entries = f", {len(scan_kernels(root / name))} entries" if name == KERNELS else ""
        echo(f"  {name:12s} {format_size(usage.size):>10s}  {_files(usage.files)}{entries}")
        total += usage.size
    loose = sum(p.stat().st_size for p in root.glob("*") if p.is_file()) if root.is_dir() else 0
    if loose:
        echo(f"  {'(top level)':12s} {format_size(loose):>10s}")
    echo(f"  {'total':12s} {format_size(total + loose):>10s}")
    echo(f"kernel cap: {_cap_text(cap)}")


def _chosen(root: Path, what: str | None) -> list[str]:
    present = sub_folders(root)
    if what is None:
        return [KERNELS]
    names = [n.strip() for n in what.split(",") if n.strip()]
    if names == ["all"]:
        return present
    choices = sorted(set(present) | set(KNOWN))
    unknown = [n for n in names if n not in choices]
    if not names or unknown:
        raise ConfigError(f"--what: unknown cache sub-folder(s) {', '.join(unknown) or repr(what)} in {root}; "
                          f"choose from {', '.join(choices)} or 'all'")
    return names


def _clear_folder(folder: Path) -> tuple[int, int]:
    # Files written right now (hidden temporaries of atomic writes) are left for their writers.
    files = size = 0
    for item in sorted(folder.iterdir()) if folder.is_dir() else []:
        usage = folder_usage(item) if item.is_dir() else None
        try:
            if usage is not None:
                shutil.rmtree(item)
                files, size = files + usage.files, size + usage.size
            elif not item.name.startswith("."):
                n = item.stat().st_size
                item.unlink()
                files, size = files + 1, size + n
        except FileNotFoundError:
            continue
    return files, size


def cache_clear(root: Path, what: str | None = None, echo: Callable[[str], None] = print) -> int:
    """Delete the kernels (or the sub-folders `what` names, comma-separated, or 'all'); the bytes freed.

    Kernels go whole entry by whole entry, and builds in progress are left alone.

    Example:
        >>> cache_clear(Path("/nonexistent"), echo=lambda line: None)
        0
    """
    freed = 0
    for name in _chosen(root, what):
        folder = root / name
        if name == KERNELS:
            entries = scan_kernels(folder)
            size = sum(remove_entry(e) for e in entries)
            echo(f"{folder}: removed {len(entries)} kernel entries ({_files(sum(len(e.files) for e in entries))}), "
                 f"{format_size(size)} freed")
        else:
            files, size = _clear_folder(folder)
            echo(f"{folder}: removed {_files(files)}, {format_size(size)} freed")
        freed += size
    echo(f"freed {format_size(freed)} in all")
    return freed


def cache_trim(root: Path, max_mb: float | None = None, echo: Callable[[str], None] = print) -> int:
    """Evict least-recently-used kernels now if the folder is over the cap (`max_mb`, else the setting).

    Returns the bytes freed.

    Example:
        >>> cache_trim(Path("/nonexistent"), max_mb=1, echo=lambda line: None)
        0
    """
    cap = cache_max_bytes() if max_mb is None else max(1, int(max_mb * MB))
    folder = root / KERNELS
    if cap is None:
        echo(f"{folder}: no cap ({MAX_MB_ENV} is 0/off), nothing to trim; pass --max-mb to trim anyway")
        return 0
    result = evict_lru(folder, cap)
    if not result.removed:
        echo(f"{folder}: {format_size(result.scanned_bytes)}, within the cap of {format_size(cap)}: nothing removed")
    else:
        echo(f"{folder}: {format_size(result.scanned_bytes)} over the cap of {format_size(cap)}: removed "
             f"{len(result.removed)} least-recently-used entries, {format_size(result.freed_bytes)} freed, "
             f"{format_size(result.remaining_bytes)} left")
    return result.freed_bytes


def run_cache(args: argparse.Namespace, echo: Callable[[str], None] = print) -> int:
    """Run `sparta-explore cache` with parsed `args`; the exit status.

    Example:
        >>> run_cache(argparse.Namespace(action="info", cache_dir=Path("/nonexistent"), what=None,
        ...                              max_mb=None), echo=lambda line: None)
        0
    """
    if args.what is not None and args.action != "clear":
        raise ConfigError("--what picks what `cache clear` deletes; it means nothing to `cache "
                          f"{args.action}`")
    if args.max_mb is not None and args.action != "trim":
        raise ConfigError(f"--max-mb is the cap `cache trim` trims to; it means nothing to `cache {args.action}`")
    root = args.cache_dir.expanduser() if args.cache_dir is not None else default_cache_dir()
    if args.action == "clear":
        cache_clear(root, args.what, echo)
    elif args.action == "trim":
        cache_trim(root, args.max_mb, echo)
    else:
        cache_info(root, echo)
    return 0
