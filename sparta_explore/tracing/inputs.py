"""Example inputs: how the model is called, and the same values in the order of the graph's placeholders.

A traced (fx) graph takes its inputs positionally, one placeholder per forward argument;
an exported graph takes the model's own call (positional and keyword, any structure) and
flattens it. An `fx.Interpreter` always consumes the flat list.

Example:
    >>> as_call(torch.zeros(2), None)
    ((tensor([0., 0.]),), {})
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from sparta_explore.errors import CaptureError


def as_call(example_inputs: Any, kwargs: Mapping[str, Any] | None = None) -> tuple[tuple, dict]:
    """(args, kwargs) of a call from a tensor, a tuple / list of inputs, or a dict of keyword inputs.

    The one place inputs become a call: capture, workloads and `measure` all go through it.

    Example:
        >>> as_call({"input_ids": 1})
        ((), {'input_ids': 1})
    """
    if isinstance(example_inputs, torch.Tensor):
        args: tuple = (example_inputs,)
    elif isinstance(example_inputs, Sequence) and not isinstance(example_inputs, (str, bytes)):
        args = tuple(example_inputs)
    elif isinstance(example_inputs, Mapping) and kwargs is None:
        args, kwargs = (), example_inputs
    else:
        raise CaptureError("example_inputs must be a tensor, a tuple of inputs or a dict of keyword inputs, got "
                           f"{type(example_inputs).__name__}")
    return args, dict(kwargs or {})


def batch_size(inputs: Any) -> int:
    """The batch size every tensor in `inputs` (any nesting) shares along dim 0, where it is over 1; 0 where the
    tensors share none (a scalar among them, sizes that differ, none at all): a call then has no items to cut.

    Example:
        >>> batch_size(((torch.zeros(4, 3),), {"mask": torch.ones(4, 2)})), batch_size((torch.zeros(4), torch.zeros(2)))
        (4, 0)
    """
    tensors = [x for x in pytree.tree_leaves(inputs) if isinstance(x, torch.Tensor)]
    batch = tensors[0].shape[0] if tensors and tensors[0].dim() else 0
    return 0 if batch <= 1 or any(x.dim() == 0 or x.shape[0] != batch for x in tensors) else batch


def set_mode(module: nn.Module, training: bool) -> bool:
    """Put `module` in train/eval mode where it allows it (exported modules refuse); returns the old mode.

    Example:
        >>> set_mode(nn.Linear(1, 1), False)
        True
    """
    was = module.training
    with contextlib.suppress(NotImplementedError):
        module.train(training)
    return was


def _forward_params(model: nn.Module) -> list[inspect.Parameter]:
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return []
    return [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def is_exported(gm: fx.GraphModule) -> bool:
    """Whether `gm` flattens its call with a pytree spec (a module from torch.export).

    Example:
        >>> is_exported(fx.symbolic_trace(nn.Linear(1, 1)))
        False
    """
    return isinstance(gm.graph._codegen, fx.graph._PyTreeCodeGen)


def flat_inputs(model: nn.Module, gm: fx.GraphModule, args: tuple, kwargs: dict) -> tuple:
    """The example inputs in the order of `gm`'s placeholders; `model` is whose forward was traced.

    Example:
        >>> gm = fx.symbolic_trace(nn.Linear(2, 1))
        >>> len(flat_inputs(nn.Linear(2, 1), gm, (), {"input": torch.zeros(1, 2)}))
        1
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if is_exported(gm):
        try:
            bound = inspect.signature(gm.forward).bind(*args, **kwargs)
        except TypeError as e:
            raise CaptureError(f"the example inputs do not fit the exported forward: {e}") from None
        flat = tuple(pytree.tree_leaves(list(bound.arguments.values())))
    else:
        params = _forward_params(model)[:len(placeholders)]
        try:
            bound = inspect.Signature(params).bind(*args, **kwargs)
        except TypeError as e:
            names = ", ".join(p.name for p in params)
            raise CaptureError(f"{type(model).__name__}.forward({names}) does not accept the example inputs: "
                               f"{e}") from None
        bound.apply_defaults()
        flat = tuple(bound.arguments[p.name] for p in params)
    if len(flat) != len(placeholders):
        raise CaptureError(f"{type(model).__name__} takes {len(placeholders)} graph inputs "
                           f"({', '.join(n.name for n in placeholders)}), the example gives {len(flat)}")
    return flat
