"""GPTQ (Frantar et al. 2023): weight-only quantization that compensates each rounding error.

Per linear, from the input Hessian H of its calibration inputs: columns are rounded to
their group's grid one at a time and the rounding error is spread over the columns not yet
rounded (the OBS update, lazily batched per `blocksize` columns). `act_order` rounds the
columns with the largest Hessian diagonal first; its groups are then fitted up front on the
original weights ("static groups"), so each group stays a contiguous run of columns, as
kernels expect.

The model's weights are replaced in place by the de-quantized values, each exactly
`scale * (q - zero)` on its group's grid; with `keep_mask` zeros already in a weight (an
earlier pruner's) stay exactly 0. The quantizer returns weight-only QuantBits; the grids
(scales and zeros per group) come from `gptq_quantize`.
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
    linears_in_blocks,
    obs_compress,
    obs_sequentially,
    select_linears,
)
from sparta_explore.quantizers.registry import QuantBits, QuantRequest, register_quantizer
from sparta_explore.tesa import NumberFormat

# per-layer outcome: the de-quantized (out, in) weight, its kept mask, `grid` (scale / zero per group)
GPTQResult = OBSResult


@dataclass(frozen=True)
class GPTQConfig:
    """GPTQ: `bits` (2..8) per weight, grids of `group_size` input columns (None: one per row).

    `sym` puts the zero point mid-grid (codes read as signed ints); else each grid fits its
    min..max (unsigned codes with a zero point). `damp` (x mean diag H) keeps H invertible;
    `samples` is how many calibration samples to use (None: all). `true_sequential`: within
    a block, each group of linears reading one input (q/k/v, o, gate/up, down) is calibrated
    with the groups before it already quantized (`oneshot.calibrate_sequentially`).

    Example:
        >>> GPTQConfig(bits=4, group_size=128).group_size
        128
        >>> GPTQConfig(bits=1)
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: bits must be an int in 2..8, got 1
    """

    bits: int = 4
    group_size: int | None = 128
    sym: bool = False
    mse: bool = False
    act_order: bool = False
    true_sequential: bool = False
    damp: float = 0.01
    blocksize: int = 128
    keep_mask: bool = True
    samples: int | None = 128
    hessian_dtype: str = "float32"
    op_names: tuple[str, ...] | None = None
    exclude_op_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        QuantSpec(self.bits, self.group_size, self.sym, self.mse)  # checks bits and group_size
        if not self.damp >= 0:
            raise ConfigError(f"damp must be >= 0, got {self.damp!r}")
        if not isinstance(self.blocksize, int) or self.blocksize < 1:
            raise ConfigError(f"blocksize must be a positive int, got {self.blocksize!r}")
        if self.samples is not None and (not isinstance(self.samples, int) or self.samples < 1):
            raise ConfigError(f"samples must be a positive int or None (the whole calibration set), got "
                              f"{self.samples!r}")
        hessian_dtype(self.hessian_dtype)
        if self.op_names is not None:
            object.__setattr__(self, "op_names", tuple(self.op_names))
        object.__setattr__(self, "exclude_op_names", tuple(self.exclude_op_names))

    @property
    def quant(self) -> QuantSpec:
        """The grid spec: bits, group size, symmetry."""
        return QuantSpec(self.bits, self.group_size, self.sym, self.mse)

    @property
    def number_format(self) -> NumberFormat:
        """INT for symmetric grids (codes minus the mid zero point), UINT for asymmetric ones."""
        return NumberFormat.INT if self.sym else NumberFormat.UINT


def gptq_quantize_layer(weight: torch.Tensor, hessian: torch.Tensor, config: GPTQConfig,
                        name: str = "weight") -> GPTQResult:
    """GPTQ on one (out, in) weight given its input Hessian; `.weight` is on `.grid` exactly.

    Example:
        >>> w, h = torch.randn(8, 64), torch.eye(64)
        >>> r = gptq_quantize_layer(w, h, GPTQConfig(bits=4, group_size=32))
        >>> r.grid.scale.shape, bool((r.grid.dequantize(r.grid.codes(r.weight)) == r.weight).all())
        (torch.Size([8, 2]), True)
    """
    keep = weight != 0 if config.keep_mask else None
    return obs_compress(weight, hessian, keep=keep, quant=config.quant, act_order=config.act_order,
                        damp=config.damp, blocksize=config.blocksize, name=name)


def gptq_quantize(model: nn.Module, config: GPTQConfig, calibration: Any) -> dict[str, GPTQResult]:
    """Quantize the selected linears of `model` in place, block by block; per layer, its result and grids.

    Example:
        >>> results = gptq_quantize(llama, GPTQConfig(bits=4, group_size=32), calib_ids)  # doctest: +SKIP
        >>> results["model.layers.0.mlp.up_proj"].grid.scale.shape                           # doctest: +SKIP
        torch.Size([128, 2])
    """
    samples = calibration_samples(calibration, config.samples)
    layers = select_linears(model, [b for b, _ in find_blocks(model)], config.op_names, config.exclude_op_names)

    def sweep(name: str, weight: torch.Tensor, hessian: torch.Tensor) -> GPTQResult:
        return gptq_quantize_layer(weight, hessian, config, name)

    return obs_sequentially(model, samples, layers, sweep, dtype=hessian_dtype(config.hessian_dtype), desc="gptq",
                            true_sequential=config.true_sequential)


def gptq_configs(request: QuantRequest, model: nn.Module) -> list[GPTQConfig]:
    """A GPTQ config for a trial: weight-only at `request.bits`, groups of 128 (a shorter last one), act order.

    Example:
        >>> gptq_configs(QuantRequest(4, ("0",), act_bits=32), nn.Sequential(nn.Linear(64, 8)))[0].group_size
        128
    """
    if request.quantizes_inputs:
        raise ConfigError(f"gptq quantizes weights only; ask for float inputs (act_bits=32), not "
                          f"{request.input_bits}-bit ones")
    reachable = linears_in_blocks(model)
    names = tuple(n for n in request.layers if n in reachable) if reachable else request.layers
    if not names:
        return []
    return [GPTQConfig(bits=request.bits, group_size=128, act_order=True, samples=None, op_names=names)]


@register_quantizer("gptq", config_type=GPTQConfig, needs_evaluator=True, from_request=gptq_configs)
def gptq_bits(model: nn.Module, config: GPTQConfig, evaluator: Any) -> QuantBits:
    """Quantize `model`'s weights in place with GPTQ; their bits ({module: {"weight": (bits, format, group)}}).

    `group` is the grid's run of input columns (the layer's width for one grid per row): the
    table's TeSAs carry it (`TeSA.group`), so the plan and the compile's reference take the
    weights as the de-quantized values GPTQ wrote, never re-rounded onto a per-row grid.

    `evaluator` is the calibration set (token ids `(n, seq)`, input dicts, a workload).

    Example:
        >>> table = quantize(llama, GPTQConfig(bits=4, group_size=128), "gptq", evaluator=calib_ids)  # doctest: +SKIP
    """
    results = gptq_quantize(model, config, evaluator)
    return {name: {"weight": (config.bits, config.number_format, r.grid.group_size)} for name, r in results.items()}
