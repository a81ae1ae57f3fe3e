"""Editing a module tree that shares modules with another: swap one module without touching the shared ones.

A graph pass or `compile` works on a GraphModule whose submodules are shared with the
captured model (or with an earlier pass's graph). `set_module` puts a new module at a
path after copying, shallowly, every parent on that path, so the other trees never see the
change; `clone_module` is that shallow copy (its own parameter, buffer and child tables).
`put_module` is the one edit that does touch the tree it is given: compiling in place.

Example:
    >>> tree = nn.Sequential(nn.Linear(2, 2)); other = nn.Sequential(*tree)
    >>> set_module(other, "0", nn.Identity()); type(tree[0]).__name__
    'Linear'
"""

from __future__ import annotations

import copy

import torch  # noqa: F401  (used by the docstring examples)
from torch import nn


def set_module(gm: nn.Module, target: str, module: nn.Module) -> None:
    """Put `module` at `target` in `gm`, copying (shallowly) every parent on its path: shared modules stay as they were.

    Example:
        >>> tree = nn.Sequential(nn.Sequential(nn.ReLU())); other = nn.Sequential(*tree)
        >>> set_module(other, "0.0", nn.Tanh()); type(tree[0][0]).__name__, type(other[0][0]).__name__
        ('ReLU', 'Tanh')
    """
    *path, leaf = target.split(".")
    parent: nn.Module = gm
    for item in path:
        clone = clone_module(getattr(parent, item))
        setattr(parent, item, clone)
        parent = clone
    setattr(parent, leaf, module)


def clone_module(module: nn.Module) -> nn.Module:
    """A shallow copy of `module` whose parameter, buffer and child tables are its own (their tensors shared).

    A `forward` bound on the instance to another object (NNI leaves one after unwrapping)
    would still call the original: the copy calls its class's forward.

    Example:
        >>> a = nn.Linear(2, 2); c = clone_module(a); c.weight = nn.Parameter(torch.zeros(2, 2))
        >>> bool(a.weight.abs().sum() > 0)
        True
    """
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    bound = clone.__dict__.get("forward")
    if bound is not None and getattr(bound, "__self__", clone) is not clone:
        del clone.__dict__["forward"]
    return clone


def put_module(root: nn.Module, target: str, module: nn.Module) -> None:
    """Put `module` at `target` in `root` itself (no copies: in place means the user's own tree).

    Example:
        >>> m = nn.Sequential(nn.Linear(2, 2)); put_module(m, "0", nn.ReLU()); type(m[0]).__name__
        'ReLU'
    """
    parent_path, _, leaf = target.rpartition(".")
    setattr(root.get_submodule(parent_path) if parent_path else root, leaf, module)
