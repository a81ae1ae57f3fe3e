"""The quantizer registry and `quantize`, the one entry point for every quantizer.

A quantizer is a function `(model, config, evaluator) -> QuantBits`, with QuantBits
`{module FQN: {target: (bits, NumberFormat)}}` and targets as NNI names them: "weight",
"bias", "_input_0", "_output_0". `quantize` turns them into a `TeSATable`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.graph import Graph, capture
from sparta_explore.pruners.registry import CompressorEntry, CompressorFn, parameter_table
from sparta_explore.registry import Registry
from sparta_explore.tesa import NumberFormat, TeSA
from sparta_explore.tesa_table import TeSATable

# {module: {target: (bits, format)}}; a weight may add its grid size: (bits, format, group), see bits_to_table
QuantBits = dict[str, dict[str, tuple[int, NumberFormat] | tuple[int, NumberFormat, int]]]


@dataclass(frozen=True)
class QuantRequest:
    """What an exploration trial asks of a quantizer: `bits` for the weights of `layers`, `act_bits` for their inputs.

    `act_bits` None means the inputs take `bits` too; 32 leaves the inputs in float
    (weight-only quantization).

    Example:
        >>> QuantRequest(8, ("fc1",)).input_bits, QuantRequest(4, ("fc1",), act_bits=32).quantizes_inputs
        (8, False)
    """

    bits: int
    layers: tuple[str, ...]
    training_steps: int = 20
    act_bits: int | None = None

    def __post_init__(self) -> None:
        if not self.layers:
            raise ConfigError("the workload has no layer to quantize")

    @property
    def input_bits(self) -> int:
        """The inputs' width: `act_bits`, else `bits`."""
        return self.bits if self.act_bits is None else self.act_bits

    @property
    def quantizes_inputs(self) -> bool:
        """False for weight-only requests (inputs stay 32-bit float)."""
        return self.input_bits < 32

    @property
    def targets(self) -> tuple[str, ...]:
        """What a quantizer config quantizes: weights, and the inputs unless weight-only."""
        return ("weight", "_input_") if self.quantizes_inputs else ("weight",)

    @property
    def activation_bits(self) -> int:
        """The inputs' grid for a config (8, a config's default, when the inputs are left alone)."""
        return self.input_bits if self.quantizes_inputs else 8

_QUANTIZERS: Registry[CompressorEntry] = Registry("quantizer", suffix="quantizer")


def register_quantizer(name: str, *, config_type: type | None = None, needs_evaluator: bool = False,
                       accepts_config_list: bool = False,
                       from_request: Callable[[QuantRequest, nn.Module], list[Any]] | None = None
                       ) -> Callable[[CompressorFn], CompressorFn]:
    """Decorator adding a quantizer `(model, config, evaluator) -> QuantBits` under `name` ("qat", "uniform").

    `from_request(request, model) -> [config]` says how trial parameters configure it.
    """
    def add(fn: CompressorFn) -> CompressorFn:
        _QUANTIZERS.add(name, CompressorEntry(name, fn, config_type, needs_evaluator, accepts_config_list,
                                              from_request))
        return fn
    return add


def quantizer_names() -> list[str]:
    """Names accepted by `quantize(..., quantizer=...)`."""
    return _QUANTIZERS.names()


def get_quantizer(name: str) -> CompressorEntry:
    """The registered quantizer `name`; an unknown name is a `ConfigError` listing the choices."""
    return _QUANTIZERS.get(name)


def parse_quant_dtype(dtype: str | None) -> tuple[int, NumberFormat]:
    """NNI's quant_dtype ("int8", "uint4"; None means int8) as (bits, format).

    Example:
        >>> parse_quant_dtype("uint4")
        (4, <NumberFormat.UINT: 1>)
    """
    if dtype is None:
        return 8, NumberFormat.INT
    for prefix, fmt in (("uint", NumberFormat.UINT), ("int", NumberFormat.INT)):
        if dtype.startswith(prefix) and dtype[len(prefix):].isdigit():
            bits = int(dtype[len(prefix):])
            if 1 <= bits <= 32:
                return bits, fmt
    raise ConfigError(f"quant_dtype must look like 'int8' or 'uint4' (1..32 bits), got {dtype!r}")


def _activation_shape(graph: Graph, name: str) -> tuple[int, ...]:
    shape = graph.tensors[name].shape
    return (1, *shape[1:]) if shape else shape  # batch dim kept at 1: the attribute is per example


def bits_to_table(source: Graph | nn.Module, bits: Mapping[str, Mapping[str, tuple[int, NumberFormat]]]
                  ) -> TeSATable:
    """A TeSATable with every parameter (32-bit float unless quantized) and the quantized activations.

    Activation targets ("_input_0", "_output_0") need `source` to be a captured Graph,
    which names the tensor flowing into / out of each call of the module.

    Example:
        >>> bits_to_table(graph, {"fc1": {"weight": (8, NumberFormat.INT)}})  # doctest: +SKIP

    A weight's entry may name its grid size as a third item, `(bits, format, group)`: one grid
    per `group` consecutive input columns (`TeSA.group`), as GPTQ's are.
    """
    graph = source if isinstance(source, Graph) else None
    model = graph.root if graph is not None else source
    params = dict(model.named_parameters(remove_duplicate=False))
    table = parameter_table(source)
    for module, targets in bits.items():
        for target, (nbits, fmt, *group) in targets.items():
            if not target.startswith("_"):
                name = f"{module}.{target}"
                if name not in params:
                    raise ConfigError(f"quantized target {name!r} is not a parameter of {type(model).__name__}")
                tesa = TeSA.dense(params[name].shape, bits=nbits, fmt=fmt).with_group(group[0] if group else 0)
                table[name] = table[name].merge(tesa)
                continue
            if graph is None:
                raise ConfigError(f"quantizing {target!r} of {module!r} needs the captured graph to name the "
                                  "activation: pass graph= or example_inputs=")
            for name in _activation_names(graph, module, target):
                tesa = TeSA.dense(_activation_shape(graph, name), bits=nbits, fmt=fmt)
                table[name] = table[name].merge(tesa) if name in table else tesa
    return table


def _activation_names(graph: Graph, module: str, target: str) -> list[str]:
    kind, _, index = target.strip("_").partition("_")
    calls = graph.module_nodes(module)
    if not calls:
        raise ConfigError(f"module {module!r} is never called in the captured graph")
    names = []
    for node in calls:
        if kind == "output":
            names.append(node.name)
        elif kind == "input":
            k = int(index or 0)
            if k >= len(node.args) or not isinstance(node.args[k], torch.fx.Node):
                raise ConfigError(f"{module!r} has no tensor input {k} (target {target!r})")
            names.append(graph.tensor_name(node.args[k]))
        else:
            raise ConfigError(f"unknown quantization target {target!r} of {module!r}")
    return [n for n in names if n in graph.tensors]


def quantize(model: nn.Module, config: Any, quantizer: str = "qat", evaluator: Any = None, *,
             graph: Graph | None = None, example_inputs: Any = None) -> TeSATable:
    """Quantize `model` with quantizer `quantizer`; return the bit widths as a TeSATable.

    Merge the result with a pruning table (`prune_table.merge(q_table)`) so pruned
    elements stay pruned and kept ones take the quantized bits.

    Example:
        >>> q = quantize(model, NNIQuantConfig(bits=8), "qat", evaluator=load_digits_split(),
        ...              example_inputs=x)  # doctest: +SKIP
    """
    entry = get_quantizer(quantizer)
    config = entry.prepare(config, evaluator)
    if graph is None and example_inputs is not None:
        graph = capture(model, example_inputs)
    return bits_to_table(graph if graph is not None else model, entry.fn(model, config, evaluator))
