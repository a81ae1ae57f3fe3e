"""Apply a TeSATable's pruning to a model's weights: the masked dense reference model."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from sparta_explore.compact import zero_where_
from sparta_explore.errors import TeSANameError
from sparta_explore.tesa import TeSA
from sparta_explore.tracing.copying import deep_copy


def apply_table(model: nn.Module, table: Mapping[str, TeSA]) -> nn.Module:
    """Zero, in place, every parameter/buffer element the table marks pruned; returns `model`.

    Activation entries (graph node names, which never contain a dot) are skipped; a
    dotted name that is not a parameter or buffer of `model` is an error.

    Example:
        >>> apply_table(model, {"fc1.weight": TeSA.from_mask(mask)})  # doctest: +SKIP
    """
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(dict(model.named_buffers(remove_duplicate=False)))
    with torch.no_grad():
        for name, tesa in table.items():
            if name not in tensors:
                if "." in name:
                    raise TeSANameError(f"TeSA {name!r} names no parameter or buffer of {type(model).__name__}")
                continue
            t = tensors[name]
            tesa.check_fits(t.shape, name)
            zero_where_(t, tesa.kept.to(t.device), where=False)
    return model


def masked_copy(model: nn.Module, table: Mapping[str, TeSA]) -> nn.Module:
    """A deep copy of `model` with the table's pruning applied; `model` is left untouched.

    Example:
        >>> ref = masked_copy(model, table)  # doctest: +SKIP
    """
    return apply_table(deep_copy(model), table)
