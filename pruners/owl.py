"""OWL (Outlier Weighed Layerwise sparsity, Yin et al. 2024): less sparsity for blocks with more outliers.

A block's outlier ratio is the share of its Wanda scores `|W| * ||X_j||` (all its
selected linears together) above `M` times their mean. Ratios are mapped linearly onto a
band of width 2 x lambda around the target, more outliers meaning lower sparsity, and
centred so the blocks' mean sparsity is exactly the target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from sparta_explore.oneshot import (
    CalibrationSample,
    InputChannelNorms,
    calibrate_sequentially,
    find_blocks,
    layers_by_block,
    weight_matrix,
)
from sparta_explore.pruners.oneshot_config import OneShotPruneConfig


def outlier_ratio(scores: Sequence[torch.Tensor], m: float) -> float:
    """Share of all `scores` (concatenated) above `m` x their mean.

    Example:
        >>> outlier_ratio([torch.tensor([1.0, 1.0, 1.0, 100.0])], 3.0)
        0.25
    """
    flat = torch.cat([s.detach().flatten().double() for s in scores])
    return float((flat > m * flat.mean()).double().mean())


def owl_sparsities(ratios: Sequence[float], target: float, lam: float) -> list[float]:
    """Per-block sparsities from outlier ratios: mean exactly `target`, each within `target` +- `lam`.

    As in OWL, ratios are scaled onto [0, 2 x lam] and centred on the target; if one block
    then lies further than `lam` from it (skewed ratios), all deviations shrink together.
    The band also shrinks so no block leaves [0, 1).

    Example:
        >>> [round(s, 3) for s in owl_sparsities([0.01, 0.02, 0.03], 0.5, 0.08)]
        [0.58, 0.5, 0.42]
        >>> owl_sparsities([0.02, 0.02], 0.5, 0.08)
        [0.5, 0.5]
    """
    r = torch.tensor(list(ratios), dtype=torch.float64)
    if r.numel() == 0 or float(r.max() - r.min()) == 0.0:
        return [float(target)] * r.numel()
    deviation = (r - r.min()) / (r.max() - r.min()) * 2 * lam
    deviation -= deviation.mean()
    # 1e-6 keeps the densest-pruned block strictly below sparsity 1
    bound = min(lam, target, 1.0 - target - 1e-6)
    widest = float(deviation.abs().max())
    if widest > bound:
        deviation *= max(bound, 0.0) / widest
    return (target - deviation).tolist()


def owl_outlier_ratios(model: nn.Module, samples: Sequence[CalibrationSample], layers: Mapping[str, nn.Module],
                       m: float) -> dict[int, float]:
    """The outlier ratio of each block with selected layers, calibrated on the dense model (nothing changes).

    Example:
        >>> ratios = owl_outlier_ratios(llama, samples, layers, 5.0)  # doctest: +SKIP
    """
    ratios: dict[int, float] = {}

    def record(index: int, own: dict[str, nn.Module], stats: dict[str, InputChannelNorms]) -> None:
        ratios[index] = outlier_ratio([stats[n].scores(weight_matrix(layer)) for n, layer in own.items()], m)

    def statistic(name: str, layer: nn.Module) -> InputChannelNorms:
        return InputChannelNorms(weight_matrix(layer).shape[1], device=layer.weight.device)

    calibrate_sequentially(model, samples, layers, statistic, record, desc="owl outliers")
    return ratios


def block_sparsities(config: OneShotPruneConfig, model: nn.Module, samples: Sequence[CalibrationSample],
                     layers: Mapping[str, nn.Module]) -> list[float]:
    """The sparsity of each repeated block: `config.sparsity` everywhere, or OWL's per-block values.

    Example:
        >>> block_sparsities(OneShotPruneConfig(0.5), nn.Linear(2, 2), [], {})
        [0.5]
    """
    count = len(find_blocks(model))
    if config.layer_sparsity != "owl":
        return [config.sparsity] * count
    ratios = owl_outlier_ratios(model, samples, layers, config.owl_m)
    order = sorted(ratios)
    spread = owl_sparsities([ratios[i] for i in order], config.sparsity, config.owl_lambda)
    out = [config.sparsity] * count
    for index, sparsity in zip(order, spread):
        out[index] = sparsity
    return out


def layer_sparsities(config: OneShotPruneConfig, model: nn.Module, samples: Sequence[CalibrationSample],
                     layers: Mapping[str, nn.Module]) -> dict[str, float]:
    """The sparsity each selected layer is pruned to (its block's).

    Example:
        >>> layer_sparsities(OneShotPruneConfig(0.5), nn.Linear(2, 2), [], {"": nn.Linear(2, 2)})
        {'': 0.5}
    """
    per_block = block_sparsities(config, model, samples, layers)
    out = {}
    for index, own in enumerate(layers_by_block(model, layers)):
        out.update(dict.fromkeys(own, per_block[index]))
    return out
