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
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

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


def tree_copy(module: T, *, cloned: Collection[int] = (), replaced: Mapping[int, Any] | None = None) -> T:
    """A `deep_copy` of `module`'s module tree (and fx graph) that shares every parameter and buffer with it, but
    those whose `id` is in `cloned` (copied) or a key of `replaced` (its value stands in their place).

    For a second model over the same values that nothing edits in place (a BERT-base's tensors are 440 MB).

    Example:
        >>> import torch
        >>> a = torch.nn.Sequential(torch.nn.Linear(2, 3))
        >>> b = tree_copy(a)
        >>> b is not a and b[0] is not a[0] and b[0].weight is a[0].weight
        True
        >>> tree_copy(a, cloned={id(a[0].bias)})[0].bias is a[0].bias
        False
    """
    memo = dict(replaced or {})
    for _, t in (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)):
        if id(t) not in memo:
            memo[id(t)] = copy.deepcopy(t) if id(t) in cloned else t
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=LEAF_SPEC_WARNING, category=FutureWarning)
        return copy.deepcopy(module, memo)


def tensor_ids(*modules: Any) -> set[int]:
    """The ids of every parameter and buffer of `modules` (nn.Modules).

    Example:
        >>> import torch
        >>> len(tensor_ids(torch.nn.Linear(2, 3)))
        2
    """
    return {id(t) for m in modules
            for _, t in (*m.named_parameters(remove_duplicate=False), *m.named_buffers(remove_duplicate=False))}


def owning(module: T, shared: Collection[int]) -> T:
    """`module` with each parameter or buffer whose id is in `shared` replaced, in place, by a copy (tied ones stay
    tied); returns `module`. What a compile returns never shares a tensor with the user's model.

    Example:
        >>> import torch
        >>> a = torch.nn.Linear(2, 3); b = tree_copy(a)
        >>> owning(b, tensor_ids(a)).weight is a.weight
        False
    """
    copies: dict[int, Any] = {}
    for m in module.modules():
        for table in (m._parameters, m._buffers):
            for name, t in table.items():
                if t is not None and id(t) in shared:
                    if id(t) not in copies:
                        copies[id(t)] = copy.deepcopy(t)
                    table[name] = copies[id(t)]
    return module
