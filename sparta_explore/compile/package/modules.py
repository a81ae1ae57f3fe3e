"""Module trees as records: class by name, attributes as plain values, tensors by key, children recursively.

A module is written from its `__getstate__` (what pickling would keep: a kernel drops its
ctypes handle there and keeps its library's record), minus PyTorch's hook tables, and read
back with `cls.__new__`, `nn.Module.__init__` and `__setstate__` (where a kernel binds its
library again). No code runs but the class's own `__setstate__`, and classes resolve only
under the trusted roots (`package.names`). A GraphModule is written as its graph
(`package.fx_graph`) over its own children, parameters and buffers.

Example:
    >>> enc = Encoder(TensorStore()); record = encode_module(enc, nn.Linear(2, 3), "fc")
    >>> record["class"], sorted(record["parameters"])
    ('torch.nn.modules.linear.Linear', ['bias', 'weight'])
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch.fx as fx
from torch import nn

from sparta_explore.compile.package import codecs  # noqa: F401  (the codecs of the project's own values)
from sparta_explore.compile.package.fx_graph import decode_graph, encode_graph
from sparta_explore.compile.package.names import resolve_class
from sparta_explore.compile.package.tensors import TensorStore  # noqa: F401  (used by the docstring example)
from sparta_explore.compile.package.values import Decoder, Encoder, code_name
from sparta_explore.errors import PackageError

TABLES = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")
HOOKS = ("_backward_hooks", "_backward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called",
         "_forward_hooks_with_kwargs", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs",
         "_is_full_backward_hook", "_load_state_dict_post_hooks", "_load_state_dict_pre_hooks", "_state_dict_hooks",
         "_state_dict_pre_hooks")

Finish = Callable[[nn.Module, dict, str], nn.Module]


class HooksNotSavedWarning(UserWarning):
    """A module of the saved model had hooks registered; hooks are code, so the package does not keep them."""


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _tables(enc: Encoder, module: nn.Module, path: str) -> dict[str, Any]:
    where = f"module {path or '(root)'!r}"
    return {
        "parameters": {n: None if p is None else enc.encode(p, f"{where} parameter {n!r}")
                       for n, p in module._parameters.items()},
        "buffers": {n: None if b is None else enc.encode(b, f"{where} buffer {n!r}")
                    for n, b in module._buffers.items()},
        "non_persistent": sorted(module._non_persistent_buffers_set),
        "children": {n: None if c is None else encode_module(enc, c, _child(path, n))
                     for n, c in module._modules.items()},
    }


def encode_module(enc: Encoder, module: nn.Module, path: str = "") -> dict[str, Any]:
    """The record of `module` and everything under it; `path` is its place in the model (errors name it).

    Example:
        >>> encode_module(Encoder(TensorStore()), nn.ReLU(), "act")["state"]["inplace"]
        False
    """
    where = f"module {path or '(root)'!r} ({type(module).__name__})"
    if any(getattr(module, h, None) for h in HOOKS if h != "_is_full_backward_hook"):
        warnings.warn(f"{where} has hooks registered; a package keeps no code, so they are not saved: register them "
                      "again after loading", HooksNotSavedWarning, stacklevel=3)
    if isinstance(module, fx.GraphModule):  # its class is made per instance: the graph says what it is
        record: dict[str, Any] = {"class": "torch.fx.graph_module.GraphModule",
                                  "graph": encode_graph(enc, module, where), "state": {"training": module.training}}
    else:
        state = dict(module.__getstate__())
        skipped = set(TABLES) | set(HOOKS)
        record = {"class": code_name(enc, type(module), where),
                  "state": {k: enc.encode(v, f"{where} attribute {k!r}") for k, v in state.items()
                            if k not in skipped and not k.startswith("_compiled")}}
    record.update(_tables(enc, module, path))
    return record


def _checked_record(record: Any, where: str) -> dict:
    if not isinstance(record, dict) or not isinstance(record.get("class"), str):
        raise PackageError(f"{where}: malformed module record")
    for key in ("parameters", "buffers", "children", "state"):
        if not isinstance(record.get(key), dict):
            raise PackageError(f"{where}: module record without {key!r}")
    return record


def decode_module(dec: Decoder, record: Any, path: str = "", finish: Finish | None = None) -> nn.Module:
    """The module `record` describes (children first); `finish(module, record, path)` may replace each one built.

    Example:
        >>> enc = Encoder(store := TensorStore()); rec = encode_module(enc, nn.Linear(2, 3), "fc")
        >>> from sparta_explore.compile.package.tensors import TensorTable
        >>> decode_module(Decoder(TensorTable(*store.arrays(), "m")), rec, "fc").out_features
        3
    """
    where = f"module {path or '(root)'!r}"
    record = _checked_record(record, where)
    children = {n: None if c is None else decode_module(dec, c, _child(path, n), finish)
                for n, c in record["children"].items()}
    parameters = {n: None if p is None else dec.decode(p, f"{where} parameter {n!r}")
                  for n, p in record["parameters"].items()}
    buffers = {n: None if b is None else dec.decode(b, f"{where} buffer {n!r}") for n, b in record["buffers"].items()}
    if "graph" in record:
        root = nn.Module()
        _fill(root, parameters, buffers, children, record)
        module: nn.Module = decode_graph(dec, record["graph"], root, where)
        module.training = bool(record["state"].get("training", False))
    else:
        cls = resolve_class(record["class"], where, nn.Module, dec.allow)
        state = {k: dec.decode(v, f"{where} attribute {k!r}") for k, v in record["state"].items()}
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        _fill(module, parameters, buffers, children, record)
        state.update({k: module.__dict__[k] for k in TABLES})
        try:
            module.__setstate__(state)
        except (TypeError, ValueError, KeyError, AttributeError, OSError) as e:
            raise PackageError(f"{where}: {record['class']} cannot take its stored state ({type(e).__name__}: {e})"
                               ) from None
    return finish(module, record, path) if finish is not None else module


def _fill(module: nn.Module, parameters: dict, buffers: dict, children: dict, record: dict) -> None:
    module._parameters.update(parameters)
    module._buffers.update(buffers)
    module._modules.update(children)
    module._non_persistent_buffers_set.update(str(n) for n in record.get("non_persistent", ()))
