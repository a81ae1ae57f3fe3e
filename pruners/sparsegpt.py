"""SparseGPT (Frantar & Alistarh 2023): one-shot pruning that re-solves the kept weights.

Per linear, from the input Hessian H of its calibration inputs: columns are swept in blocks
of `blocksize`; in each block the mask is chosen adaptively by OBS saliency
`w^2 / [H^-1]_jj^2` (or per group of m columns for N:M), pruned weights are set to 0 and
the error is compensated on the not-yet-pruned columns. Optionally each kept weight is
also rounded to a grid in the same sweep (joint quantization, as the reference does).

The model's weights are updated in place: pruned entries are exactly 0 and kept ones
carry the compensation. The returned masks (hence `prune`'s table) say which are kept, so
`masked_copy(model, table)` equals the compressed model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.oneshot import (
    OBSResult,
    QuantSpec,
    calibration_samples,
    find_blocks,
    hessian_dtype,
    obs_compress,
    obs_sequentially,
    select_linears,
)
from sparta_explore.pruners.oneshot_config import OneShotPruneConfig, oneshot_prune_configs
from sparta_explore.pruners.owl import layer_sparsities
from sparta_explore.pruners.registry import Masks, PruneRequest, register_pruner
from sparta_explore.pruners.selection import stored_mask
from sparta_explore.pruners.wanda import check_pattern_fits
from sparta_explore.tesa import NumberFormat


@dataclass(frozen=True)
class SparseGPTConfig(OneShotPruneConfig):
    """SparseGPT: `sparsity` (adaptive mask) or `nm=(n, m)`; OBS `damp` (x mean diag H), column `blocksize`.

    `bits` (2..8) quantizes the kept weights in the same sweep, on grids of `group_size`
    input columns (None: one per row), symmetric or not (`sym`). See `OneShotPruneConfig`
    for samples, layer selection and OWL.

    Example:
        >>> SparseGPTConfig(0.5, bits=4, group_size=32).quant
        QuantSpec(bits=4, group_size=32, sym=False, mse=False)
        >>> SparseGPTConfig(0.5, bits=9)
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: bits must be an int in 2..8, got 9
    """

    damp: float = 0.01
    blocksize: int = 128
    bits: int | None = None
    group_size: int | None = None
    sym: bool = False
    mse: bool = False
    hessian_dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.damp >= 0:
            raise ConfigError(f"damp must be >= 0, got {self.damp!r}")
        if not isinstance(self.blocksize, int) or self.blocksize < 1:
            raise ConfigError(f"blocksize must be a positive int, got {self.blocksize!r}")
        if self.bits is None and self.group_size is not None:
            raise ConfigError("group_size is the quantization grid's; give bits too")
        if self.bits is not None:
            QuantSpec(self.bits, self.group_size, self.sym, self.mse)  # checks bits and group_size
        hessian_dtype(self.hessian_dtype)

    @property
    def quant(self) -> QuantSpec | None:
        """The joint quantization, None when `bits` is None."""
        return None if self.bits is None else QuantSpec(self.bits, self.group_size, self.sym, self.mse)


def sparsegpt_prune(model: nn.Module, config: SparseGPTConfig, calibration: Any) -> dict[str, OBSResult]:
    """Prune (and quantize) the selected linears of `model` in place; per layer, what the sweep produced.

    Each result holds the (out, in) weight now in the model, the kept mask, and the grids
    (scale and zero per group) when `config.bits` is set.

    Example:
        >>> results = sparsegpt_prune(llama, SparseGPTConfig(0.5), calib_ids)  # doctest: +SKIP
        >>> results["model.layers.0.mlp.up_proj"].keep.float().mean()          # doctest: +SKIP
        tensor(0.5000)
    """
    samples = calibration_samples(calibration, config.samples)
    layers = select_linears(model, [b for b, _ in find_blocks(model)], config.op_names, config.exclude_op_names)
    check_pattern_fits(layers, config.nm)
    quant = config.quant
    sparsities = layer_sparsities(config, model, samples, layers)

    def sweep(name: str, weight: torch.Tensor, hessian: torch.Tensor) -> OBSResult:
        return obs_compress(weight, hessian, sparsity=sparsities[name], nm=config.nm, quant=quant, damp=config.damp,
                            blocksize=config.blocksize, name=name)

    return obs_sequentially(model, samples, layers, sweep, dtype=hessian_dtype(config.hessian_dtype), desc="sparsegpt")


def sparsegpt_bits(config: SparseGPTConfig, results: dict[str, OBSResult]) -> dict[str, dict[str, Any]]:
    """The QuantBits of a jointly quantized run ({module: {"weight": (bits, format, group)}}), for `bits_to_table`.

    Example:
        >>> sparsegpt_bits(SparseGPTConfig(0.5), {})
        {}
    """
    if config.bits is None:
        return {}
    fmt = NumberFormat.INT if config.sym else NumberFormat.UINT
    return {name: {"weight": (config.bits, fmt, r.grid.group_size)} for name, r in results.items()}


def sparsegpt_configs(request: PruneRequest, model: nn.Module) -> list[SparseGPTConfig]:
    """SparseGPT configs for a trial: unstructured, or N:M for block=(1, m).

    Example:
        >>> [c.sparsity for c in sparsegpt_configs(PruneRequest(0.5, ("0",)), nn.Sequential(nn.Linear(8, 8)))]
        [0.5]
    """
    return oneshot_prune_configs(SparseGPTConfig, request, model)


@register_pruner("sparsegpt", config_type=SparseGPTConfig, needs_evaluator=True, from_request=sparsegpt_configs)
def sparsegpt_masks(model: nn.Module, config: SparseGPTConfig, evaluator: Any) -> Masks:
    """Prune `model` in place with SparseGPT; the masks ({module: {"weight": 0/1}}) of what was kept.

    `evaluator` is the calibration set (token ids `(n, seq)`, input dicts, a workload).

    Example:
        >>> table = prune(llama, SparseGPTConfig(0.5), pruner="sparsegpt", evaluator=calib_ids)  # doctest: +SKIP
        >>> masked = se.masked_copy(llama, table)  # equals llama, already pruned              # doctest: +SKIP
    """
    results = sparsegpt_prune(model, config, evaluator)
    modules = dict(model.named_modules())
    return {name: {"weight": stored_mask(modules[name], r.keep).to(modules[name].weight.dtype)}
            for name, r in results.items()}
