"""Outputs of compiled ops reuse memory nobody holds any more, so large outputs skip page faults.

A fresh 48 MiB output (BERT FFN, M = 4096) faults in ~13 ms of pages on every call on these
machines: more than a 90% sparse kernel computes. The pool keeps the buffers it handed out
and gives one back again only when no tensor but the pool's own still uses its storage
(the caller dropped the result, or the next op consumed it), so a result is never
overwritten while anyone can read it. Results are always views, never the pooled tensor.

Example:
    >>> y = take((4, 8)); p = y.data_ptr(); del y
    >>> take((4, 8)).data_ptr() == p
    True
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

KEEP_PER_SIZE = 4  # buffers kept per element count: a few ops in flight at once (attention q, k, v)
_pool: dict[int, list[torch.Tensor]] = {}
_lock = threading.Lock()


def _free(buffer: torch.Tensor) -> bool:
    # the pooled tensor and the temporary storage object of this query: 2; any view handed out adds one
    return torch._C._storage_Use_Count(buffer.untyped_storage()._cdata) <= 2


def take(shape: Sequence[int]) -> torch.Tensor:
    """An uninitialized float32 CPU tensor of `shape`, reusing a pooled buffer nobody reads.

    Example:
        >>> take((2, 3)).shape
        torch.Size([2, 3])
    """
    if not hasattr(torch._C, "_storage_Use_Count"):  # private API; without it no buffer is provably free
        return torch.empty(*shape)
    numel = 1
    for s in shape:
        numel *= int(s)
    with _lock:
        buffers = _pool.setdefault(numel, [])
        for buffer in buffers:
            if _free(buffer):
                return buffer.view(*shape)
        with torch.inference_mode(False):  # a normal tensor: callers outside inference mode may update it in place
            buffer = torch.empty(numel)
        buffers.append(buffer)
        if len(buffers) > KEEP_PER_SIZE:
            buffers.pop(0)  # forgotten by the pool; whoever holds its view keeps it alive
        return buffer.view(*shape)


def clear() -> None:
    """Forget every pooled buffer (memory held by results still in use stays with them)."""
    with _lock:
        _pool.clear()
