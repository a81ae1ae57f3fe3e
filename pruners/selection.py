"""Choosing which modules a pruner touches, the way NNI's config lists do (op_types / op_names)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from sparta_explore.errors import ConfigError


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
        if type(mod).__name__ in op_types and getattr(mod, "weight", None) is not None:
            chosen[fqn] = mod
    if not chosen:
        raise ConfigError(f"no module of {type(model).__name__} matches op_types={list(op_types)}"
                          + (f", {key}={list(op_names)}" if op_names is not None else ""))
    return chosen


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
