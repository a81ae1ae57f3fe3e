"""The activations a kernel can fuse after a linear: one table for C, PyTorch and fx.

Each entry says how the fused kernel computes it (a C statement on the vector `v`, using
the prelude's helpers), how the PyTorch reference computes it, and which fx call targets
are exactly this op (what the planner may fuse). Adding a row here adds it everywhere.

Example:
    >>> ACTIVATIONS["relu"].torch_fn(torch.tensor([-1.0, 2.0])).tolist()
    [0.0, 2.0]
    >>> sorted(ACTIVATIONS)
    ['gelu', 'none', 'relu', 'relu6', 'silu']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Activation:
    """One fusable activation: its C statement, PyTorch function and fx targets."""

    name: str
    c: str
    torch_fn: Callable[[torch.Tensor], torch.Tensor]
    fx_targets: tuple[object, ...] = ()


ACTIVATIONS: dict[str, Activation] = {}


def register_activation(act: Activation) -> Activation:
    """Add `act` to the table (its name must be new).

    Example:
        >>> "relu" in ACTIVATIONS
        True
    """
    if act.name in ACTIVATIONS:
        raise ValueError(f"activation {act.name!r} is already registered")
    ACTIVATIONS[act.name] = act
    return act


def _identity(y: torch.Tensor) -> torch.Tensor:
    return y


register_activation(Activation("none", "", _identity))
register_activation(Activation("relu", "v = vsel(v > zero, v, zero);", F.relu, (nn.ReLU, F.relu, torch.relu, "relu")))
# exact-erf GELU, v * Phi(v), Phi by Abramowitz-Stegun 7.1.26 (|err| < 1.5e-7; vgelu in
# kernels/templates/vector_prelude.c); only approximate="none" GELU modules are fused (the planner checks)
register_activation(Activation("gelu", "v = vgelu(v);", F.gelu,
                               (nn.GELU, F.gelu)))
register_activation(Activation("relu6", "v = vsel(v > zero, v, zero); v = vsel(v < zero + 6.0f, v, zero + 6.0f);",
                               F.relu6, (nn.ReLU6, F.relu6)))
# x sigmoid(x) with exp(-|x|) from the prelude's vexp_neg (vsilu in kernels/templates/vector_prelude.c)
register_activation(Activation("silu", "v = vsilu(v);", F.silu, (nn.SiLU, F.silu)))
