"""Wanda (Sun et al. 2024): prune by weight magnitude times input-channel norm, no weight update.

A weight's score is `|W_ij| * ||X_j||_2`, X_j being input channel j over the calibration
tokens: a small weight on an outlier channel can matter more than a large one on a quiet
channel, which is what magnitude pruning gets wrong on LLMs. Unstructured pruning keeps the
top (1 - sparsity) of each output row; N:M keeps the n best of every m consecutive inputs;
blocks keep the (r, c) blocks with the largest summed scores.

Blocks are calibrated in order, each on the outputs of the blocks before it pruned (the
pruned weights are zeroed while the next block is fed, then restored: the model's
weights are not changed; the masks are the result).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.oneshot import (
    InputChannelNorms,
    calibrate_sequentially,
    calibration_samples,
    find_blocks,
    select_linears,
    weight_matrix,
)
from sparta_explore.pruners.oneshot_config import OneShotPruneConfig, oneshot_prune_configs
from sparta_explore.pruners.owl import layer_sparsities
from sparta_explore.pruners.registry import Masks, PruneRequest, register_pruner
from sparta_explore.pruners.selection import stored_mask


@dataclass(frozen=True)
class WandaConfig(OneShotPruneConfig):
    """Wanda: `sparsity` per output row, or `nm=(n, m)`, or `block=(r, c)` blocks; see `OneShotPruneConfig`.

    Example:
        >>> WandaConfig(0.5).sparsity, WandaConfig(nm=(2, 4)).nm, WandaConfig(0.5, block=(4, 4)).block
        (0.5, (2, 4), (4, 4))
    """

    block: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block is not None:
            block = tuple(self.block)
            if len(block) != 2 or not all(isinstance(b, int) and b >= 1 for b in block):
                raise ConfigError(f"block must be two positive sizes (rows, cols), got {self.block!r}")
            if self.nm is not None:
                raise ConfigError(f"block={block} and nm={self.nm} are two patterns; give one")
            object.__setattr__(self, "block", block)


def wanda_keep(scores: torch.Tensor, sparsity: float, nm: tuple[int, int] | None = None,
               block: tuple[int, int] | None = None) -> torch.Tensor:
    """The kept-weight mask (bool) of an (out, in) score matrix.

    Unstructured: the round(in x sparsity) lowest scores of each row go. N:M: the m - n
    lowest of every m consecutive columns go. Blocks: the round(blocks x sparsity) lowest
    summed-score (r, c) blocks go.

    Example:
        >>> s = torch.tensor([[4.0, 1.0, 3.0, 2.0], [1.0, 2.0, 3.0, 4.0]])
        >>> wanda_keep(s, 0.5).int()
        tensor([[1, 0, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
        >>> wanda_keep(torch.tensor([[4.0, 3.0, 1.0, 1.0], [1.0, 1.0, 3.0, 4.0]]), 0.5, block=(1, 2)).int()
        tensor([[1, 1, 0, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    rows, cols = scores.shape
    if nm is not None:
        n, m = nm
        groups = scores.reshape(rows, cols // m, m)
        drop = groups.topk(m - n, dim=-1, largest=False).indices
        return torch.ones_like(groups, dtype=torch.bool).scatter_(-1, drop, False).reshape(rows, cols)
    if block is not None:
        r, c = block
        sums = scores.reshape(rows // r, r, cols // c, c).sum(dim=(1, 3))
        keep = torch.ones(sums.numel(), dtype=torch.bool, device=scores.device)
        count = round(sums.numel() * sparsity)
        if count:
            keep[sums.flatten().topk(count, largest=False).indices] = False
        keep = keep.reshape(sums.shape)
        return keep.repeat_interleave(r, 0).repeat_interleave(c, 1)
    count = round(cols * sparsity)
    drop = scores.topk(count, dim=1, largest=False).indices
    return torch.ones_like(scores, dtype=torch.bool).scatter_(1, drop, False)


def check_pattern_fits(layers: Mapping[str, nn.Module], nm: tuple[int, int] | None,
                       block: tuple[int, int] | None = None) -> None:
    """A `ConfigError` naming the first layer whose weight the N:M groups or the blocks do not tile.

    Checked before calibration, so a bad config never leaves a model half-pruned.

    Example:
        >>> check_pattern_fits({"fc": nn.Linear(6, 2)}, (2, 4))
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: N:M needs m=4 to divide the input width 6 of 'fc'
    """
    for name, layer in layers.items():
        rows, cols = weight_matrix(layer).shape
        if nm is not None and cols % nm[1]:
            raise ConfigError(f"N:M needs m={nm[1]} to divide the input width {cols} of {name!r}")
        if block is not None and (rows % block[0] or cols % block[1]):
            raise ConfigError(f"block {block} does not tile the ({rows}, {cols}) weight of {name!r}")


def _zero_until_undone(layers: Mapping[str, nn.Module], keeps: Mapping[str, torch.Tensor]) -> Any:
    """Zero each layer's pruned weights now; the returned function puts the originals back."""
    originals = {name: layer.weight.detach().clone() for name, layer in layers.items()}
    with torch.no_grad():
        for name, layer in layers.items():
            layer.weight.mul_(stored_mask(layer, keeps[name]).to(layer.weight.dtype))

    def undo() -> None:
        with torch.no_grad():
            for name, layer in layers.items():
                layer.weight.copy_(originals[name])
    return undo


def wanda_configs(request: PruneRequest, model: nn.Module) -> list[WandaConfig]:
    """Wanda configs for a trial: unstructured, N:M for block=(1, m), else (r, c) blocks.

    Example:
        >>> [c.nm for c in wanda_configs(PruneRequest(0.5, ("0",), block=(1, 4)), nn.Sequential(nn.Linear(8, 8)))]
        [(2, 4)]
    """
    return oneshot_prune_configs(WandaConfig, request, model)


@register_pruner("wanda", config_type=WandaConfig, needs_evaluator=True, from_request=wanda_configs)
def wanda_masks(model: nn.Module, config: WandaConfig, evaluator: Any) -> Masks:
    """Wanda masks ({module: {"weight": 0/1 tensor}}) for the selected linears; `evaluator` is the calibration set.

    Example:
        >>> table = prune(llama, WandaConfig(0.5), pruner="wanda", evaluator=calib_ids)  # doctest: +SKIP
    """
    samples = calibration_samples(evaluator, config.samples)
    layers = select_linears(model, [b for b, _ in find_blocks(model)], config.op_names, config.exclude_op_names)
    check_pattern_fits(layers, config.nm, config.block)
    sparsities = layer_sparsities(config, model, samples, layers)
    masks: Masks = {}

    def prune_block(index: int, own: dict[str, nn.Module], stats: dict[str, InputChannelNorms]) -> Any:
        keeps = {name: wanda_keep(stats[name].scores(weight_matrix(layer)), sparsities[name], config.nm,
                                  config.block) for name, layer in own.items()}
        for name, layer in own.items():
            masks[name] = {"weight": stored_mask(layer, keeps[name]).to(layer.weight.dtype)}
        return _zero_until_undone(own, keeps)

    def statistic(name: str, layer: nn.Module) -> InputChannelNorms:
        return InputChannelNorms(weight_matrix(layer).shape[1], device=layer.weight.device)

    calibrate_sequentially(model, samples, layers, statistic, prune_block, desc="wanda")
    return masks
