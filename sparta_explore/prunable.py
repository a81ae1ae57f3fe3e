"""Which modules hold a weight the pruners and kernels treat as a matrix: Linear, Conv2d, Hugging Face's Conv1D.

Keyed by class, and by the exact class (a subclass such as `nn.MultiheadAttention`'s
`out_proj` is read inside its parent's fused call, not by a call of its own). Hugging
Face's `Conv1D` is found without importing transformers: a model holding one has
imported it already, so `sys.modules` has it whenever it matters.

`PRUNABLE_OP_TYPES` are the same classes by name, as NNI-style configs select modules
(`op_types`).

Example:
    >>> is_prunable(nn.Linear(2, 2)), is_prunable(nn.ReLU()), is_linear(nn.Conv2d(1, 1, 1))
    (True, False, False)
"""

from __future__ import annotations

import sys

from torch import nn

PRUNABLE_OP_TYPES = ("Linear", "Conv2d", "Conv1D")
_HF_CONV1D = ("transformers.pytorch_utils", "Conv1D")  # a linear with its weight stored (in, out)


def _hf_conv1d() -> tuple[type, ...]:
    module = sys.modules.get(_HF_CONV1D[0])
    cls = getattr(module, _HF_CONV1D[1], None)
    return (cls,) if isinstance(cls, type) else ()


def linear_classes() -> tuple[type, ...]:
    """The linear layers: `nn.Linear`, and Hugging Face's `Conv1D` once transformers is loaded.

    Example:
        >>> nn.Linear in linear_classes()
        True
    """
    return (nn.Linear, *_hf_conv1d())


def prunable_classes() -> tuple[type, ...]:
    """The classes whose weight a pruner may touch: the linear layers and `nn.Conv2d`.

    Example:
        >>> nn.Conv2d in prunable_classes()
        True
    """
    return (*linear_classes(), nn.Conv2d)


def is_linear(module: nn.Module) -> bool:
    """Whether `module` is exactly one of `linear_classes()`.

    Example:
        >>> is_linear(nn.Linear(2, 2))
        True
    """
    return type(module) in linear_classes()


def is_prunable(module: nn.Module) -> bool:
    """Whether `module` is exactly one of `prunable_classes()`.

    Example:
        >>> is_prunable(nn.Conv2d(1, 1, 3)), is_prunable(nn.BatchNorm2d(1))
        (True, False)
    """
    return type(module) in prunable_classes()
