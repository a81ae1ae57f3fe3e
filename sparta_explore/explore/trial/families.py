"""Pruning families and precisions as single search keys, so one NNI choice sets fields that go together.

A search over "which kind of sparsity" must not pair a pruner with a block it cannot use
(an N:M pruner with a 32x32 block, Level with a granularity): each family is one value of
the ``pattern`` key, and each precision one value of ``precision``. `TrialParams.from_dict`
expands both into its own fields, so NNI's flat search spaces, sweeps and the protocol of
`explore.protocol` all speak the same keys:

* ``pattern``: ``unstructured`` (NNI LevelPruner, element-wise), ``channel`` (NNI
  L1NormPruner, whole output rows: compile shrinks the layer), ``1x32`` / ``32x32``
  (our block pruner), ``2:4`` (N:M, keeps 2 of every 4 weights; it fixes every layer at
  50%, so per-layer sparsities do not apply to it);
* ``precision``: ``fp32``; ``w8a8`` (8-bit weights and inputs: the int8 kernels);
  ``w4a8`` (4-bit weights, 8-bit inputs: int8 kernels on a 4-bit weight grid);
  ``w4a32`` (4-bit weights only, inputs stay float: fp32 kernels on 4-bit weight values).

FLOPs see none of this: a 2:4 layer counts half its FLOPs whatever it runs at, and a
precision changes no FLOP count, which is why a search that trusts FLOPs misjudges them.

Example:
    >>> expand_aliases({"pattern": "2:4", "precision": "w4a8", "sparsity@fc1": 0.9})
    {'pruner': 'nm', 'block': '1x4', 'sparsity': 0.5, 'bits': 4, 'act_bits': 8}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparta_explore.errors import ConfigError

LAYER_KEY = "sparsity@"  # flat per-layer key prefix: "sparsity@layers.0"

# value -> the TrialParams fields it sets; "fixed_sparsity" patterns drop per-layer sparsities
PATTERNS: dict[str, dict[str, Any]] = {
    "unstructured": {"pruner": "level", "block": None},
    "channel": {"pruner": "l1norm", "block": None},
    "1x32": {"pruner": "block", "block": "1x32"},
    "32x32": {"pruner": "block", "block": "32x32"},
    "2:4": {"pruner": "nm", "block": "1x4", "sparsity": 0.5},
}
PRECISIONS: dict[str, dict[str, Any]] = {
    "fp32": {"bits": 32, "act_bits": None},
    "w8a8": {"bits": 8, "act_bits": None},
    "w4a8": {"bits": 4, "act_bits": 8},
    "w4a32": {"bits": 4, "act_bits": 32},
}
ALIASES: dict[str, dict[str, dict[str, Any]]] = {"pattern": PATTERNS, "precision": PRECISIONS}


def _lookup(key: str, value: Any) -> dict[str, Any]:
    table = ALIASES[key]
    if value not in table:
        raise ConfigError(f"unknown {key} {value!r}; choose from {', '.join(table)}")
    return dict(table[value])


def expand_aliases(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with ``pattern`` / ``precision`` replaced by the fields they set; a clash is an error.

    A pattern that fixes the sparsity (2:4) also drops per-layer sparsity keys, since it
    prunes every layer alike.

    Example:
        >>> expand_aliases({"pattern": "channel", "sparsity": 0.7})
        {'sparsity': 0.7, 'pruner': 'l1norm', 'block': None}
        >>> expand_aliases({"pattern": "1x32", "pruner": "level"})
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: pattern '1x32' sets pruner='block', but pruner='level' is also given
    """
    out = {k: v for k, v in values.items() if k not in ALIASES}
    for key in ALIASES:
        if key not in values:
            continue
        fields = _lookup(key, values[key])
        for name, value in fields.items():
            if name in out and out[name] != value and name != "sparsity":
                raise ConfigError(f"{key} {values[key]!r} sets {name}={value!r}, but {name}={out[name]!r} is "
                                  "also given")
        if "sparsity" in fields:
            out = {k: v for k, v in out.items() if not k.startswith(LAYER_KEY) and k != "layer_sparsity"}
        out.update(fields)
    return out


def pattern_of(params: Mapping[str, Any]) -> str:
    """The family name of a params dict (pruner, block), or "pruner:block" for one outside the table.

    Example:
        >>> pattern_of({"pruner": "nm", "block": "1x4"}), pattern_of({"pruner": "fpgm", "block": ""})
        ('2:4', 'fpgm:')
    """
    block = params.get("block")
    if isinstance(block, (list, tuple)):
        block = f"{block[0]}x{block[1]}"
    for name, fields in PATTERNS.items():
        if fields["pruner"] == params.get("pruner") and (fields["block"] or "") == (block or ""):
            return name
    return f"{params.get('pruner')}:{block or ''}"


def precision_of(bits: int, act_bits: int | None) -> str:
    """The precision name of (bits, act_bits), or "w<bits>a<act>" for one outside the table.

    Example:
        >>> precision_of(8, None), precision_of(4, 8), precision_of(6, None)
        ('w8a8', 'w4a8', 'w6a6')
    """
    for name, fields in PRECISIONS.items():
        if fields["bits"] == bits and fields["act_bits"] == act_bits:
            return name
    return f"w{bits}a{bits if act_bits is None else act_bits}"
