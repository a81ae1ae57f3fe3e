"""An explicit, process-wide allocator setting that makes large outputs cheap to allocate again.

glibc serves allocations above its mmap threshold (at most 32 MiB by default) with fresh
pages from the kernel, which fault in on first touch: writing a new 48 MiB output (BERT FFN,
M=4096) costs ~13 ms of page faults here, every call, for dense and sparse ops alike.
Raising the threshold keeps freed blocks in the heap for reuse. It is opt-in because it
changes the whole process (memory is returned to the system less eagerly).
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(threshold_bytes: int = 1 << 30) -> bool:
    """Ask glibc to reuse freed blocks up to `threshold_bytes` instead of unmapping them.

    Returns False where glibc's `mallopt` is not available (the setting is then a no-op).

    Example:
        >>> keep_freed_memory()  # doctest: +SKIP
        True
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt"):
        return False
    ok = libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)) == 1
    return ok and libc.mallopt(_M_TRIM_THRESHOLD, int(2 * threshold_bytes)) == 1
