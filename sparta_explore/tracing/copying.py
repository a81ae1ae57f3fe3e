"""Deep copies of captured modules and fx graphs, without torch's `LeafSpec` FutureWarning.

A module captured through `torch.export` keeps its calling convention (the model's own
arguments and output structure) in pytree specs whose leaves are torch's own `LeafSpec`
singleton (`torch.utils._pytree.treespec_leaf()`, the non-deprecated way to make one).
`copy.deepcopy` rebuilds each leaf through `LeafSpec.__new__`, which torch marks deprecated,
so every copy of such a module or of its fx graph printed "`isinstance(treespec, LeafSpec)`
is deprecated" (nine or more times per `compile`), though nothing of ours uses `LeafSpec`.
torch offers no copy that avoids it (`fx.Graph.__deepcopy__` copies its code generator
without the memo), so `deep_copy` silences exactly that warning, only around the copy.

Example:
    >>> import torch
    >>> deep_copy(torch.nn.Linear(2, 3)).weight.shape
    torch.Size([3, 2])
"""

from __future__ import annotations

import copy
import warnings
from typing import TypeVar

T = TypeVar("T")

# the start of torch's message (a regex matched at the message's start): nothing else is silenced
LEAF_SPEC_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def deep_copy(obj: T) -> T:
    """`copy.deepcopy(obj)`, without torch's `LeafSpec` FutureWarning (see the module docstring).

    Example:
        >>> import torch
        >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        >>> deep_copy(gm.graph) is not gm.graph
        True
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=LEAF_SPEC_WARNING, category=FutureWarning)
        return copy.deepcopy(obj)
