"""Functions and classes by name: how a package refers to code without pickling it.

A package holds no code. Each function a graph calls (`torch.reshape`,
`operator.getitem`, `torch.ops.aten.arange.default`) and each class it builds (a module,
a frozen config, a pytree node type) is written as its qualified name, and resolved on load
only under the roots in `TRUSTED_ROOTS` (PyTorch, the standard operators, Hugging Face
transformers, sparta-explore's kernels and compiled ops) or roots the caller names
(`allow=`), never under `BLOCKED` (what loads, saves or runs other code: `torch.hub`,
`torch.load`, ...). Builtins are limited to `SAFE_BUILTINS`. So a package from anywhere can at most call PyTorch.

Example:
    >>> qualified_name(torch.reshape), resolve("operator.getitem", "test")(["a"], 0)
    ('torch.reshape', 'a')
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Collection
from typing import Any

import torch
from torch.fx.node import _get_qualified_name

from sparta_explore.errors import PackageError

TRUSTED_ROOTS = ("torch", "operator", "_operator", "math", "builtins", "transformers", "sparta_explore.kernels",
                 "sparta_explore.compile", "sparta_explore.fake_quant", "sparta_explore.activations")
BLOCKED = ("torch.hub", "torch.load", "torch.save", "torch.package", "torch.utils", "torch.distributed",
           "torch.multiprocessing", "torch.jit", "torch.compile", "torch._dynamo", "torch.ops.load_library",
           "torch.classes", "torch.serialization", "torch.backends", "torch.cuda", "transformers.trainer",
           "transformers.utils.hub", "transformers.dynamic_module_utils", "transformers.models.auto",
           "sparta_explore.compile.package", "sparta_explore.kernels.build", "sparta_explore.kernels.tuning")
BLOCKED_PARTS = frozenset({"from_pretrained", "save_pretrained", "push_to_hub", "from_single_file"})
SAFE_BUILTINS = frozenset({"getattr", "len", "int", "float", "bool", "min", "max", "abs", "round", "range", "slice",
                           "tuple", "list", "dict", "isinstance", "str", "pow", "divmod", "sum", "any", "all"})


def qualified_name(obj: Any) -> str:
    """The importable dotted name of a function, builtin, op overload or class.

    Example:
        >>> qualified_name(torch.nn.Linear)
        'torch.nn.modules.linear.Linear'
    """
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    name = _get_qualified_name(obj)
    if "." not in name and getattr(builtins, name, None) is obj:  # fx names builtins bare ("getattr")
        return f"builtins.{name}"
    return name


def _within(name: str, roots: Collection[str]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


def check_name(name: str, allow: Collection[str] = ()) -> None:
    """Raise `PackageError` unless `name` lies under a trusted root (or one of `allow`) and outside `BLOCKED`.

    Example:
        >>> check_name("torch.hub.load")
        Traceback (most recent call last):
        ...
        sparta_explore.errors.PackageError: 'torch.hub.load' is not allowed in a package (blocked: it loads, ...)
    """
    if not isinstance(name, str) or not name or any(not part.isidentifier() for part in name.split(".")):
        raise PackageError(f"{name!r} is not a dotted Python name")
    if _within(name, BLOCKED):
        raise PackageError(f"{name!r} is not allowed in a package (blocked: it loads, saves or runs other code)")
    if not _within(name, (*TRUSTED_ROOTS, *allow)):
        raise PackageError(f"{name!r} is outside the trusted code ({', '.join(TRUSTED_ROOTS)}); pass "
                           f"allow=[{name.split('.')[0]!r}] to save and load code of your own package")
    if name.startswith("builtins.") and name.split(".", 1)[1] not in SAFE_BUILTINS:
        raise PackageError(f"{name!r} is not one of the builtins a package may call "
                           f"({', '.join(sorted(SAFE_BUILTINS))})")
    if BLOCKED_PARTS.intersection(name.split(".")):
        raise PackageError(f"{name!r} is not allowed in a package (it reads or writes files or the hub)")
    operators = name.startswith(("torch.ops.aten.", "operator.", "_operator."))  # aten::__and__ is a plain op
    if not operators and any(part.startswith("__") for part in name.split(".")[1:]):
        raise PackageError(f"{name!r} names a private attribute")


# classes that moved, by the name packages written before the move hold
MOVED = {"sparta_explore.kernels.sparse_linear.Int8SparseLinear": "sparta_explore.kernels.int8_linear.Int8SparseLinear"}


def resolve(name: str, where: str, allow: Collection[str] = ()) -> Any:
    """The object `name` refers to, imported under the rules of `check_name`; `where` says who asked (errors).

    Example:
        >>> resolve("torch.ops.aten.arange.default", "node arange") is torch.ops.aten.arange.default
        True
    """
    name = MOVED.get(name, name)
    try:
        check_name(name, allow)
    except PackageError as e:
        raise PackageError(f"{where}: {e}") from None
    parts = name.split(".")
    if parts[0] in ("builtins",):
        return getattr(builtins, parts[1])
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        return obj
    raise PackageError(f"{where}: {name!r} does not exist in this environment (torch {torch.__version__}); the "
                       "package was written with other library versions")


def resolve_class(name: str, where: str, base: type, allow: Collection[str] = ()) -> type:
    """`resolve` for a class that must derive from `base`.

    Example:
        >>> resolve_class("torch.nn.modules.linear.Linear", "module fc", torch.nn.Module).__name__
        'Linear'
    """
    cls = resolve(name, where, allow)
    if not isinstance(cls, type) or not issubclass(cls, base):
        raise PackageError(f"{where}: {name!r} is not a {base.__name__} class")
    return cls
