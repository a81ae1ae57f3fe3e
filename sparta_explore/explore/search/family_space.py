"""A search space where FLOPs and measured latency disagree: per-layer sparsity x pruning family x precision.

Built from any workload's prunable layers (`search.layers.prunable_layers`):

* ``sparsity@<layer>``: one choice per prunable layer (the head stays dense);
* ``pattern``: the pruning family (`families.PATTERNS`): unstructured (NNI Level),
  channel (NNI L1Norm, rows -> shrink), 1x32 / 32x32 blocks, 2:4. Every family is
  offered for every workload: on a layer its block does not tile, the pruners crop the
  ragged edge blocks (a 3x3 conv over 16 channels has 144 columns, not 5 x 32);
* ``precision``: fp32, w8a8, w4a8 (and w4a32 if asked; `families.PRECISIONS`).

These are the dimensions where a FLOP count misleads: it cannot see bits at all, it
prices 2:4 at half the dense cost whatever the kernel makes of it, and it charges an
unstructured layer and a block-sparse one alike at the same sparsity.

Example:
    >>> space = family_search_space(FamilySpaceConfig(workload="digits-mlp"))
    >>> sorted(space)
    ['pattern', 'precision', 'sparsity@layers.0', 'sparsity@layers.1']
    >>> space["pattern"]["_value"]
    ['unstructured', 'channel', '1x32', '32x32', '2:4']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparta_explore.errors import ConfigError
from sparta_explore.explore.search.layers import prunable_layers
from sparta_explore.explore.trial.families import LAYER_KEY, PATTERNS, PRECISIONS
from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.workload import load_workload


@dataclass(frozen=True)
class FamilySpaceConfig:
    """Candidate values of each key; `family_search_space` keeps the families the workload's layers allow.

    Example:
        >>> FamilySpaceConfig(patterns=("unstructured", "4x4"))
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: unknown pattern '4x4'; choose from unstructured, channel, 1x32, 32x32, 2:4
    """

    workload: str = "digits-ffn"
    sparsities: tuple[float, ...] = (0.5, 0.7, 0.8, 0.9, 0.95)
    patterns: tuple[str, ...] = tuple(PATTERNS)
    precisions: tuple[str, ...] = ("fp32", "w8a8", "w4a8")

    def __post_init__(self) -> None:
        for name, table in (("patterns", PATTERNS), ("precisions", PRECISIONS)):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ConfigError(f"{name} needs distinct values, got {list(values)}")
            for v in values:
                if v not in table:
                    raise ConfigError(f"unknown {name[:-1]} {v!r}; choose from {', '.join(table)}")
        if not self.sparsities or len(set(self.sparsities)) != len(self.sparsities):
            raise ConfigError(f"sparsities needs distinct values, got {list(self.sparsities)}")
        for s in self.sparsities:
            TrialParams(workload=self.workload, sparsity=s)  # range check, and the workload must load


def family_search_space(config: FamilySpaceConfig | None = None) -> dict[str, Any]:
    """The NNI search space (choices only) of `config.workload`: one sparsity key per prunable layer.

    Example:
        >>> family_search_space(FamilySpaceConfig("digits-mlp", precisions=("fp32",)))["precision"]
        {'_type': 'choice', '_value': ['fp32']}
    """
    cfg = config or FamilySpaceConfig()
    layers = prunable_layers(load_workload(cfg.workload))
    if not layers:
        raise ConfigError(f"workload {cfg.workload!r} has no prunable layer to search over")
    space: dict[str, Any] = {f"{LAYER_KEY}{layer.name}": {"_type": "choice", "_value": list(cfg.sparsities)}
                             for layer in layers}
    space["pattern"] = {"_type": "choice", "_value": list(cfg.patterns)}
    space["precision"] = {"_type": "choice", "_value": list(cfg.precisions)}
    return space
