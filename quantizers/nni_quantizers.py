"""Adapters for NNI 3.0's quantizers: run one, read the bits of every target, unwrap.

Each quantizer's `compress()` returns a calibration dict `{module: {target: {...,
"quant_bits", "quant_dtype", ...}}}`; those bits become TeSAs. Facts about NNI 3.0
that shape this file (checked on torch 2.13):

* every quantizer trains or calibrates through an evaluator; PtqQuantizer collects its
  ranges from `evaluating_func`, so it runs with zero training steps;
* BNNQuantizer reports 8 bits, but its weights are exactly +-1: we record 1 bit;
* DoReFaQuantizer turns weights into NaN when a sample's gradient is all zero (its
  gradient quantizer divides by the max with no epsilon): we run `SafeDoReFaQuantizer`;
  any non-finite result from any quantizer is an error, and the weights are restored;
* LsqQuantizer supports only the symmetric scheme and DoReFa only affine weights; the
  config's schemes are adjusted for them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from nni.compression.quantization import BNNQuantizer, LsqQuantizer, PtqQuantizer, QATQuantizer
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.pruners.nni_evaluator import quiet_nni, resolve_evaluator
from sparta_explore.pruners.selection import checked_config_list, nni_op_entry
from sparta_explore.quantizers.dorefa import SafeDoReFaQuantizer
from sparta_explore.quantizers.registry import QuantBits, QuantRequest, parse_quant_dtype, register_quantizer
from sparta_explore.tesa import NumberFormat


@dataclass(frozen=True)
class NNIQuantConfig:
    """What to quantize with an NNI quantizer, as one flat, JSON-friendly record.

    Defaults match the int8 VNNI kernels: signed symmetric weights, unsigned affine inputs.

    Example:
        >>> NNIQuantConfig(weight_bits=4).to_config_list()[0]["quant_dtype"]
        'int4'
    """

    weight_bits: int = 8
    weight_dtype: str = "int"
    activation_bits: int = 8
    activation_dtype: str = "uint"
    targets: tuple[str, ...] = ("weight", "_input_")
    op_types: tuple[str, ...] = ("Linear", "Conv2d")
    op_names: tuple[str, ...] | None = None
    exclude_op_names: tuple[str, ...] = ()
    granularity: str = "default"
    training_steps: int = 20

    def __post_init__(self) -> None:
        for key in ("weight_bits", "activation_bits"):
            value = getattr(self, key)
            if not isinstance(value, int) or not 1 <= value <= 32:
                raise ConfigError(f"{key} must be an int in 1..32, got {value!r}")
        for key in ("weight_dtype", "activation_dtype"):
            if getattr(self, key) not in ("int", "uint"):
                raise ConfigError(f"{key} must be 'int' or 'uint', got {getattr(self, key)!r}")
        bad = [t for t in self.targets if t not in ("weight", "bias", "_input_", "_output_")]
        if bad or not self.targets:
            raise ConfigError(f"targets must be a non-empty subset of weight, bias, _input_, _output_; got {bad}")
        if self.training_steps < 0:
            raise ConfigError(f"training_steps must be >= 0, got {self.training_steps}")

    def to_config_list(self) -> list[dict[str, Any]]:
        """The equivalent NNI config_list (activations set through `target_settings`)."""
        act = {"quant_dtype": f"{self.activation_dtype}{self.activation_bits}",
               "quant_scheme": "affine" if self.activation_dtype == "uint" else "symmetric"}
        entry = nni_op_entry(self.op_types, self.op_names, self.exclude_op_names)
        entry.update({"target_names": list(self.targets), "quant_dtype": f"{self.weight_dtype}{self.weight_bits}",
                      "quant_scheme": "symmetric" if self.weight_dtype == "int" else "affine",
                      "granularity": self.granularity})
        settings = {t: dict(act) for t in self.targets if t.startswith("_")}
        if settings:  # NNI's schema rejects an empty target_settings
            entry["target_settings"] = settings
        return [entry]


def _steps(config: NNIQuantConfig | list) -> int:
    return config.training_steps if isinstance(config, NNIQuantConfig) else NNIQuantConfig().training_steps


def _bits_of(calib: dict[str, dict[str, dict[str, Any]]], fixed: tuple[int, NumberFormat] | None) -> QuantBits:
    out: QuantBits = {}
    for module, targets in calib.items():
        for target, info in targets.items():
            bits = fixed or (int(info["quant_bits"]), parse_quant_dtype(info.get("quant_dtype"))[1])
            out.setdefault(module, {})[target] = bits
    return out


def _run(model: nn.Module, make: Callable[[], Any], compress: Callable[[Any], Any], name: str,
         fixed: tuple[int, NumberFormat] | None = None) -> QuantBits:
    """Build, compress and unwrap an NNI quantizer; restore the weights if NNI left NaNs, and each module's mode."""
    saved = copy.deepcopy(model.state_dict())
    # NNI's evaluators train, and leave the model in training mode: a compile or a metric after
    # `quantize` must see the model as the caller handed it (dropout off, BatchNorm frozen)
    modes = [(module, module.training) for module in model.modules()]
    with quiet_nni():
        quantizer = make()
        try:
            _, calib = compress(quantizer)
        finally:
            quantizer.unwrap_model()
            for module, training in modes:
                module.training = training
    broken = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if broken:
        model.load_state_dict(saved)
        raise ConfigError(f"NNI's {name} produced non-finite weights in {broken}; weights restored. "
                          "Quantize fewer targets (e.g. no '_output_' of activations) or use another quantizer.")
    return _bits_of(calib, fixed)


def _with_schemes(cfg_list: list[dict[str, Any]], weight: str | None, activation: str | None) -> list[dict[str, Any]]:
    out = copy.deepcopy(cfg_list)
    for entry in out:
        if weight is not None:
            entry["quant_scheme"] = weight
        if activation is not None:
            for setting in entry.get("target_settings", {}).values():
                setting["quant_scheme"] = activation
                if activation == "symmetric":
                    setting["quant_dtype"] = setting["quant_dtype"].replace("uint", "int")
    return out


def nni_quant_configs(request: QuantRequest, model: nn.Module) -> list[NNIQuantConfig]:
    """NNIQuantConfig: weights at `request.bits`, inputs at its `input_bits` (none if weight-only).

    Example:
        >>> nni_quant_configs(QuantRequest(8, ("0",)), nn.Sequential(nn.Linear(2, 2)))[0].op_types
        ('Linear',)
    """
    named = dict(model.named_modules())
    op_types = tuple(sorted({type(named[n]).__name__ for n in request.layers}))
    return [NNIQuantConfig(weight_bits=request.bits, activation_bits=request.activation_bits, targets=request.targets,
                           op_types=op_types, op_names=request.layers, training_steps=request.training_steps)]


def _trained(cls: type, weight_scheme: str | None = None,
             activation_scheme: str | None = None) -> Callable[[nn.Module, Any, Any], QuantBits]:
    def run(model: nn.Module, config: Any, evaluator: Any) -> QuantBits:
        cfg_list = checked_config_list(model, config)
        if isinstance(config, NNIQuantConfig):  # a user's raw config_list is passed on as written
            cfg_list = _with_schemes(cfg_list, weight_scheme, activation_scheme)
        return _run(model, lambda: cls(model, cfg_list, resolve_evaluator(model, evaluator)),
                    lambda q: q.compress(max_steps=max(1, _steps(config)), max_epochs=None), cls.__name__)
    run.__doc__ = f"Bits from NNI's {cls.__name__}, trained for `training_steps` steps."
    return run


for _name, _quantizer in (("qat", _trained(QATQuantizer)),
                          ("lsq", _trained(LsqQuantizer, "symmetric", "symmetric")),
                          ("dorefa", _trained(SafeDoReFaQuantizer, "affine", None))):
    register_quantizer(_name, config_type=NNIQuantConfig, needs_evaluator=True, accepts_config_list=True,
                       from_request=nni_quant_configs)(_quantizer)


@register_quantizer("bnn", config_type=NNIQuantConfig, needs_evaluator=True, accepts_config_list=True,
                    from_request=nni_quant_configs)
def bnn_bits(model: nn.Module, config: Any, evaluator: Any) -> QuantBits:
    """1-bit weights from NNI's BNNQuantizer (which itself reports 8: the values are +-1)."""
    cfg_list = checked_config_list(model, config)
    if isinstance(config, NNIQuantConfig):  # BNN binarizes weights only; NNI wants no dtype for it
        cfg_list = [{**nni_op_entry(config.op_types, config.op_names, config.exclude_op_names),
                     "target_names": ["weight"], "quant_dtype": None}]
    return _run(model, lambda: BNNQuantizer(model, cfg_list, resolve_evaluator(model, evaluator)),
                lambda q: q.compress(max_steps=max(1, _steps(config)), max_epochs=None), "BNNQuantizer",
                fixed=(1, NumberFormat.INT))


@register_quantizer("ptq", config_type=NNIQuantConfig, needs_evaluator=True, accepts_config_list=True,
                    from_request=nni_quant_configs)
def ptq_bits(model: nn.Module, config: Any, evaluator: Any) -> QuantBits:
    """Bits from NNI's PtqQuantizer: no training, ranges calibrated on the training split."""
    cfg_list = checked_config_list(model, config)
    return _run(model, lambda: PtqQuantizer(model, cfg_list, resolve_evaluator(model, evaluator, eval_split="train")),
                lambda q: q.compress(max_steps=0, max_epochs=None), "PtqQuantizer")
