"""Uniform bit widths with no training: the quantizer to use when NNI's are not wanted.

It only states bits (e.g. int8 weights, uint8 inputs, as the VNNI kernels run them);
the calibration step (`calibrate_bits`) and the kernels decide scales later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.prunable import PRUNABLE_OP_TYPES
from sparta_explore.pruners.selection import select_modules
from sparta_explore.quantizers.registry import QuantBits, QuantRequest, register_quantizer
from sparta_explore.tesa import NumberFormat

_TARGETS = ("weight", "bias", "_input_", "_output_")


@dataclass(frozen=True)
class UniformQuantConfig:
    """One bit width per target kind for every selected module.

    Example:
        >>> UniformQuantConfig(weight_bits=4).weight_bits
        4
    """

    weight_bits: int = 8
    weight_fmt: str = "int"
    activation_bits: int = 8
    activation_fmt: str = "uint"
    targets: tuple[str, ...] = ("weight", "_input_")
    op_types: tuple[str, ...] = ("Linear", "Conv2d")
    op_names: tuple[str, ...] | None = None
    exclude_op_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in ("weight_bits", "activation_bits"):
            value = getattr(self, key)
            if not isinstance(value, int) or not 1 <= value <= 32:
                raise ConfigError(f"{key} must be an int in 1..32, got {value!r}")
        for key in ("weight_fmt", "activation_fmt"):
            NumberFormat.parse(getattr(self, key))
        bad = [t for t in self.targets if t not in _TARGETS]
        if bad:
            raise ConfigError(f"targets {bad} unknown; choose from {list(_TARGETS)}")


def uniform_configs(request: QuantRequest, model: nn.Module) -> list[UniformQuantConfig]:
    """Symmetric int grids (what the int8 kernels run): weights at `request.bits`, inputs at its `input_bits`.

    Example:
        >>> uniform_configs(QuantRequest(4, ("0",)), None)[0].activation_fmt
        'int'
        >>> uniform_configs(QuantRequest(4, ("0",), act_bits=32), None)[0].targets
        ('weight',)
    """
    return [UniformQuantConfig(weight_bits=request.bits, activation_bits=request.activation_bits, activation_fmt="int",
                               targets=request.targets, op_types=PRUNABLE_OP_TYPES, op_names=request.layers)]


@register_quantizer("uniform", config_type=UniformQuantConfig, from_request=uniform_configs)
def uniform_bits(model: nn.Module, config: UniformQuantConfig, evaluator: Any = None) -> QuantBits:
    """The same bits for every selected module's targets.

    Example:
        >>> uniform_bits(nn.Sequential(nn.Linear(2, 2)), UniformQuantConfig())
        {'0': {'weight': (8, <NumberFormat.INT: 0>), '_input_0': (8, <NumberFormat.UINT: 1>)}}
    """
    modules = select_modules(model, config.op_types, config.op_names, config.exclude_op_names)
    weight = (config.weight_bits, NumberFormat.parse(config.weight_fmt))
    act = (config.activation_bits, NumberFormat.parse(config.activation_fmt))
    out: QuantBits = {}
    for name, mod in modules.items():
        targets: dict[str, tuple[int, NumberFormat]] = {}
        for t in config.targets:
            if t == "bias" and getattr(mod, "bias", None) is None:
                continue
            targets[t if not t.startswith("_") else f"{t}0"] = weight if not t.startswith("_") else act
        out[name] = targets
    return out
