"""Choosing which modules a pruner touches, the way NNI's config lists do (op_types / op_names)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from sparta_explore.errors import ConfigError


def type_names(module: nn.Module) -> set[str]:
    """Class names of `module` and its bases: op_types "Linear" also selects subclasses of nn.Linear.

    Example:
        >>> "Linear" in type_names(nn.modules.linear.NonDynamicallyQuantizableLinear(2, 2))
        True
    """
    return {c.__name__ for c in type(module).__mro__}


def select_modules(model: nn.Module, op_types: Sequence[str], op_names: Sequence[str] | None = None,
                   exclude_op_names: Sequence[str] = (), *, key: str = "op_names") -> dict[str, nn.Module]:
    """Modules of `model` whose class name is in `op_types` (and FQN in `op_names`, if given).

    A name in `op_names` or `exclude_op_names` that is not a submodule is a `ConfigError`
    naming `key`, so a typo never silently prunes nothing.

    Example:
        >>> list(select_modules(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), ["Linear"]))
        ['0']
    """
    named = dict(model.named_modules())
    for label, names in ((key, op_names or ()), ("exclude_op_names", exclude_op_names)):
        missing = [n for n in names if n not in named]
        if missing:
            raise ConfigError(f"{label} {missing} are not submodules of {type(model).__name__}")
    chosen = {}
    for fqn, mod in named.items():
        if not fqn or fqn in exclude_op_names:
            continue
        if op_names is not None and fqn not in op_names:
            continue
        if type_names(mod) & set(op_types) and getattr(mod, "weight", None) is not None:
            chosen[fqn] = mod
    if not chosen:
        raise ConfigError(f"no module of {type(model).__name__} matches op_types={list(op_types)}"
                          + (f", {key}={list(op_names)}" if op_names is not None else ""))
    return chosen


# classes whose weight is stored (in, out), i.e. transposed against nn.Linear (Hugging Face GPT-2's Conv1D)
STORED_IN_OUT = frozenset({"Conv1D"})


def gemm_weight(module: nn.Module) -> torch.Tensor:
    """The module's weight as the kernels see it, (out, in * kernel...): transposed for `STORED_IN_OUT` classes.

    Example:
        >>> gemm_weight(nn.Linear(3, 2)).shape
        torch.Size([2, 3])
    """
    weight = module.weight
    return weight.t() if type(module).__name__ in STORED_IN_OUT else weight


def stored_mask(module: nn.Module, gemm_mask: torch.Tensor) -> torch.Tensor:
    """A mask made on `gemm_weight(module)` in the weight's stored layout.

    Example:
        >>> stored_mask(nn.Linear(3, 2), torch.ones(2, 3)).shape
        torch.Size([2, 3])
    """
    return gemm_mask.t().contiguous() if type(module).__name__ in STORED_IN_OUT else gemm_mask


def as_matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """The GEMM view of a weight: (out, in * kernel...) for Linear and Conv weights."""
    out = shape[0]
    rest = 1
    for s in shape[1:]:
        rest *= s
    return out, rest


def nni_op_entry(op_types: Sequence[str], op_names: Sequence[str] | None,
                 exclude_op_names: Sequence[str]) -> dict[str, Any]:
    """The module-selection keys of one NNI config_list entry.

    Example:
        >>> nni_op_entry(["Linear"], None, ["head"])
        {'op_types': ['Linear'], 'exclude_op_names': ['head']}
    """
    entry: dict[str, Any] = {"op_types": list(op_types)}
    if op_names is not None:
        entry["op_names"] = list(op_names)
    if exclude_op_names:
        entry["exclude_op_names"] = list(exclude_op_names)
    return entry


def checked_config_list(model: nn.Module, config: Any) -> list[dict[str, Any]]:
    """A raw NNI config_list as given, or `config.to_config_list()` once its op names are checked.

    Checked here so a typo in op_names is our clear `ConfigError`, not NNI's silent no-op.
    """
    if isinstance(config, list):
        return config
    select_modules(model, config.op_types, config.op_names, config.exclude_op_names)
    return config.to_config_list()
