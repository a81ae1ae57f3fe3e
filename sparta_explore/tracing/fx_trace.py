"""Capture through torch.fx symbolic tracing, with errors that say which line failed and what to pass.

fx keeps every `torch.nn` module whole (a leaf); `leaf_modules` adds more (classes or
FQNs), `concrete_args` fixes arguments (e.g. an optional mask) to constants so Python
branches on them can be traced.

Example:
    >>> gm = trace_fx(nn.Sequential(nn.Linear(4, 3), nn.ReLU()))
    >>> [n.op for n in gm.graph.nodes]
    ['placeholder', 'call_module', 'call_module', 'output']
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import torch.fx as fx
from torch import nn

from sparta_explore.errors import CaptureError


class _Tracer(fx.Tracer):
    """fx tracer that honours extra leaf modules and remembers which module it is inside."""

    def __init__(self, leaf_types: tuple[type, ...], leaf_names: frozenset[str]) -> None:
        super().__init__()
        self.leaf_types = leaf_types
        self.leaf_names = leaf_names
        self.scope_trail: list[tuple[str, str]] = []

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if qualname in self.leaf_names or (self.leaf_types and isinstance(m, self.leaf_types)):
            return True
        return super().is_leaf_module(m, qualname)

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        # On failure the stack is left as it was, so the error can name the innermost module.
        self.scope_trail.append((self.path_of_module(m), type(m).__name__))
        out = super().call_module(m, forward, args, kwargs)
        self.scope_trail.pop()
        return out


def _user_frame(exc: BaseException) -> str:
    """The innermost traceback frame outside torch, i.e. the user's line that failed."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/torch/" not in f.filename.replace("\\", "/") and f.filename != __file__]
    if not frames:
        return ""
    f = frames[-1]
    line = f" `{f.line.strip()}`" if f.line else ""
    return f" at {f.filename}:{f.lineno}{line}"


def _trace_error(exc: Exception, tracer: _Tracer) -> CaptureError:
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if tracer.scope_trail:
        path, cls = tracer.scope_trail[-1]
        where = f"module {path or '<root>'!r} ({cls})"
        fix = (f"mark it as a leaf so it is kept whole: capture(model, inputs, leaf_modules=[{cls}]) "
               f"or leaf_modules=[{path!r}]" if path else
               "move the untraceable code into a submodule and pass it in leaf_modules")
    else:
        where = "the model's own forward"
        fix = "move the untraceable code into a submodule and pass it in leaf_modules"
    return CaptureError(f"cannot trace {where}{_user_frame(exc)}: {type(exc).__name__}: {first_line}. "
                        f"Fix: {fix}, pass concrete_args for optional arguments, remove data-dependent "
                        "control flow, or capture with method='export'.")


def trace_fx(model: nn.Module, leaf_modules: Sequence[type | str] = (),
             concrete_args: Mapping[str, Any] | None = None) -> fx.GraphModule:
    """`model` symbolically traced into an fx.GraphModule; a failure is a `CaptureError` naming the line.

    Example:
        >>> trace_fx(nn.Sequential(nn.Linear(2, 2))).graph.find_nodes(op="call_module")[0].target
        '0'
    """
    leaf_types = tuple(m for m in leaf_modules if isinstance(m, type))
    leaf_names = frozenset(m for m in leaf_modules if isinstance(m, str))
    unknown = [n for n in leaf_names if n and n not in dict(model.named_modules())]
    if unknown:
        raise CaptureError(f"leaf_modules names {unknown} are not submodules of {type(model).__name__}")
    tracer = _Tracer(leaf_types, leaf_names)
    try:
        graph = tracer.trace(model, concrete_args=dict(concrete_args) if concrete_args else None)
    except Exception as e:  # fx raises many types (TraceError, TypeError, ValueError, ...)
        raise _trace_error(e, tracer) from None
    return fx.GraphModule(tracer.root, graph, type(model).__name__)
