"""The layers a trial's pruner targets, with their GEMM views: what every search space is built from.

Example:
    >>> from torch import nn
    >>> prunable_layers(nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 10)))
    [PrunableLayer(name='0', rows=96, cols=64)]
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from sparta_explore.workload import Workload


@dataclass(frozen=True)
class PrunableLayer:
    """A weight the trial's pruner targets, by module name, with its GEMM view (rows, cols).

    Example:
        >>> PrunableLayer("fc", 64, 128).fits((32, 64)), PrunableLayer("fc", 64, 128).fits((1, 48))
        (True, False)
    """

    name: str
    rows: int
    cols: int

    def fits(self, block: tuple[int, int]) -> bool:
        """Whether `block` tiles this weight exactly."""
        return self.rows % block[0] == 0 and self.cols % block[1] == 0


def prunable_layers(workload: Workload | nn.Module) -> list[PrunableLayer]:
    """The weights a trial's pruner targets (the workload's prunable modules), with their GEMM views.

    Example:
        >>> prunable_layers(nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 10)))
        [PrunableLayer(name='0', rows=96, cols=64)]
    """
    from sparta_explore.pruners.selection import gemm_weight

    if isinstance(workload, nn.Module):
        workload = Workload("model", workload, (), metric=lambda m: 0.0)
    model = workload.dense_model()
    out = []
    for name in workload.prunable_modules(model):
        w = gemm_weight(model.get_submodule(name))
        out.append(PrunableLayer(name, int(w.shape[0]), int(w[0].numel())))
    return out
