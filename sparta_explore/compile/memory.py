"""What a compile leaves in memory: its temporaries freed as it returns, its model freed the moment it is dropped.

Every `fx.GraphModule` is in a reference cycle (its graph's `owning_module` is the module),
so Python frees one only in a full garbage collection, which runs once many objects have
built up. A BERT-base compile left its masked references (417 MB) to the next full
collection, and a sweep's dropped compiled models piled up with them: five compiles in one
process took RSS from 3.8 to 8.5 GiB, and each later compile paid the page faults (w8a8, the
same masks again: 4.9 s with the memory freed, 7.9-9.4 s without).

* `collecting_temporaries()`: around a compile, the objects that exist before it are frozen
  (`gc.freeze`, constant time), and one collection over only the objects it made frees its
  cyclic temporaries (17-40 ms where a full collection takes 0.3 s), then they are unfrozen.
  Skipped where something froze objects already (a nested compile, or the process itself).
* `weakly_owned(module)`: each GraphModule in `module` gets a graph that refers to its module
  weakly, so reference counting frees the compiled model when its last reference goes.

Example:
    >>> import torch
    >>> gm = weakly_owned(torch.fx.symbolic_trace(torch.nn.ReLU()))
    >>> gm.graph.owning_module is gm
    True
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch.fx as fx
from torch import nn


class _WeaklyOwnedGraph(fx.Graph):
    """An `fx.Graph` whose `owning_module` is held by a weak reference (no cycle with its GraphModule)."""

    @property
    def owning_module(self) -> fx.GraphModule | None:
        ref = self._owning_module
        return ref() if isinstance(ref, weakref.ref) else ref

    @owning_module.setter
    def owning_module(self, mod: fx.GraphModule | None) -> None:
        self._owning_module = None if mod is None else weakref.ref(mod)


def weakly_owned(module: nn.Module) -> nn.Module:
    """`module`, each GraphModule in it now freed by reference counting (its graph refers to it weakly).

    The graphs behave as before while their modules live; a deep copy's graph is an ordinary one.

    Example:
        >>> import torch, weakref
        >>> gm = weakly_owned(torch.fx.symbolic_trace(torch.nn.ReLU()))
        >>> ref = weakref.ref(gm); del gm
        >>> ref() is None
        True
    """
    for sub in module.modules():
        if isinstance(sub, fx.GraphModule) and type(sub.graph) is fx.Graph:
            graph = sub.graph
            graph.__class__ = _WeaklyOwnedGraph
            graph.owning_module = sub
    return module


@contextmanager
def collecting_temporaries() -> Iterator[None]:
    """Free the cyclic garbage made inside the block as it ends, without scanning the objects that existed before.

    Example:
        >>> with collecting_temporaries():
        ...     cycle = []; cycle.append(cycle); del cycle
    """
    if gc.get_freeze_count() or not gc.isenabled():  # frozen by someone else (unfreezing would undo it), or no gc
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.collect()
        gc.unfreeze()
