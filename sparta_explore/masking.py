"""Apply a TeSATable's pruning to a model's weights: the masked dense reference model.

A weight whose TeSA has grid groups (`TeSA.group`, as GPTQ's) holds the compressor's
de-quantized values: they are the reference as they are, and are checked to lie on at most
2^bits levels per group, so a table applied to a model the compressor did not update (the
original weights) is an error naming the tensor, not a silently different reference.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from sparta_explore.compact import zero_where_
from sparta_explore.errors import TeSABitsError, TeSANameError
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
            if tesa.group:
                check_on_group_grids(t, tesa, name)
    return model


def check_on_group_grids(tensor: torch.Tensor, tesa: TeSA, name: str) -> None:
    """A `TeSABitsError` naming `name` unless every run of `tesa.group` elements along the last dim
    holds at most 2^bits distinct values (its grid's levels, 0 among them).

    Example:
        >>> check_on_group_grids(torch.tensor([[0.5, -0.5, 0.1]]), TeSA.dense((1, 3), bits=2).with_group(3), "w")
        >>> check_on_group_grids(torch.randn(1, 8), TeSA.dense((1, 8), bits=2).with_group(8), "w")
        Traceback (most recent call last):
        ...
        sparta_explore.errors.TeSABitsError: 'w': the table puts it on 2-bit grids of 8 values, but a group holds ...
    """
    levels = 2 ** max(tesa.kept_bits(), default=0)
    rows = tensor.detach().reshape(-1, tensor.shape[-1]) if tensor.dim() else tensor.detach().reshape(1, 1)
    for start in range(0, rows.shape[1], tesa.group):
        ordered = rows[:, start:start + tesa.group].sort(dim=1).values
        distinct = int((ordered.diff(dim=1) != 0).sum(dim=1).max()) + 1 if ordered.shape[1] else 0
        if distinct > levels:
            raise TeSABitsError(
                f"{name!r}: the table puts it on {levels.bit_length() - 1}-bit grids of {tesa.group} values, but a "
                f"group holds {distinct} distinct values (at most {levels}): pass the model the compressor updated")


def masked_copy(model: nn.Module, table: Mapping[str, TeSA]) -> nn.Module:
    """A deep copy of `model` with the table's pruning applied; `model` is left untouched.

    Example:
        >>> ref = masked_copy(model, table)  # doctest: +SKIP
    """
    return apply_table(deep_copy(model), table)
