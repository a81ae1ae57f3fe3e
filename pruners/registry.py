"""The pruner registry and `prune`, the one entry point for every pruner (NNI's and ours).

A pruner is a function `(model, config, evaluator) -> masks`, masks being NNI's layout
`{module FQN: {"weight" | "bias": 0/1 tensor}}`; `prune` turns them into a `TeSATable`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.graph import Graph, capture
from sparta_explore.registry import Registry
from sparta_explore.tesa import TeSA
from sparta_explore.tesa_table import TeSATable

Masks = dict[str, dict[str, torch.Tensor]]
CompressorFn = Callable[[nn.Module, Any, Any], Any]


@dataclass(frozen=True)
class PruneRequest:
    """What an exploration trial asks of a pruner, independent of which pruner it is.

    `layers` are the modules that may be pruned (the workload's prunable modules); each
    takes `sparsity` unless `layer_sparsity` overrides it. `block` is the granularity
    (None: the pruner's own), `scope` "layer" or "global". Each pruner turns a request into
    the configs it runs (`CompressorEntry.configs_for`).

    Example:
        >>> PruneRequest(0.5, ("fc1", "fc2"), layer_sparsity=(("fc2", 0.9),)).groups()
        [(0.5, ('fc1',)), (0.9, ('fc2',))]
    """

    sparsity: float
    layers: tuple[str, ...]
    layer_sparsity: tuple[tuple[str, float], ...] = ()
    block: tuple[int, int] | None = None
    scope: str = "layer"
    training_steps: int = 20

    def __post_init__(self) -> None:
        unknown = sorted({n for n, _ in self.layer_sparsity} - set(self.layers))
        if unknown:
            raise ConfigError(f"layer_sparsity names {unknown}, which are not prunable layers; choose from "
                              f"{sorted(self.layers)}")
        if self.layer_sparsity and self.scope == "global":
            raise ConfigError("layer_sparsity and scope='global' conflict: global ranking picks each layer's sparsity")
        if not self.layers:
            raise ConfigError("the workload has no prunable layer")

    def groups(self) -> list[tuple[float, tuple[str, ...]]]:
        """(sparsity, layers) pairs: the layers at `sparsity`, then one group per distinct override."""
        overrides = dict(self.layer_sparsity)
        out: dict[float, list[str]] = {}
        for layer in self.layers:
            out.setdefault(overrides.get(layer, self.sparsity), []).append(layer)
        base = [(self.sparsity, tuple(out.pop(self.sparsity)))] if self.sparsity in out else []
        return base + [(s, tuple(names)) for s, names in sorted(out.items())]


RequestFn = Callable[[PruneRequest, nn.Module], list[Any]]


@dataclass(frozen=True)
class CompressorEntry:
    """One registered pruner or quantizer: its function and how it is configured.

    `config_type` is the config dataclass it takes (dicts are converted to it);
    `needs_evaluator` marks compressors that train or calibrate; `accepts_config_list`
    marks NNI compressors, which also take a raw NNI config_list.
    """

    name: str
    fn: CompressorFn
    config_type: type | None
    needs_evaluator: bool
    accepts_config_list: bool
    from_request: RequestFn | None = None

    def configs_for(self, request: PruneRequest, model: nn.Module) -> list[Any]:
        """The configs this pruner runs for `request`, in turn (their tables merge).

        Example:
            >>> get_pruner("block").configs_for(PruneRequest(0.5, ("0",), block=(1, 4)), model)  # doctest: +SKIP
        """
        if self.from_request is None:
            raise ConfigError(f"{self.name!r} cannot be configured from trial parameters")
        return self.from_request(request, model)

    def prepare(self, config: Any, evaluator: Any) -> Any:
        """Check the evaluator and coerce `config`; returns the config the function takes."""
        if self.needs_evaluator and evaluator is None:
            raise ConfigError(f"{self.name!r} trains or calibrates and needs an evaluator "
                              "(an NNI Evaluator, or a workload that can train)")
        if isinstance(config, list):
            if not self.accepts_config_list:
                raise ConfigError(f"{self.name!r} takes a {getattr(self.config_type, '__name__', 'config')}, "
                                  "not an NNI config_list")
            return config
        if self.config_type is None:
            return config
        return coerce_config(config, self.config_type, self.name)


_PRUNERS: Registry[CompressorEntry] = Registry("pruner", suffix="pruner")


def register_pruner(name: str, *, config_type: type | None = None, needs_evaluator: bool = False,
                    accepts_config_list: bool = False,
                    from_request: RequestFn | None = None) -> Callable[[CompressorFn], CompressorFn]:
    """Decorator adding a pruner `(model, config, evaluator) -> Masks` under `name` ("l1norm", "block").

    `from_request(request, model) -> [config, ...]` says how trial parameters configure it.
    """
    def add(fn: CompressorFn) -> CompressorFn:
        _PRUNERS.add(name, CompressorEntry(name, fn, config_type, needs_evaluator, accepts_config_list,
                                           from_request))
        return fn
    return add


def pruner_names() -> list[str]:
    """Names accepted by `prune(..., pruner=...)`."""
    return _PRUNERS.names()


def get_pruner(name: str) -> CompressorEntry:
    """The registered pruner `name`; an unknown name is a `ConfigError` listing the choices."""
    return _PRUNERS.get(name)


def coerce_config(config: Any, config_type: type, owner: str) -> Any:
    """`config` as an instance of `config_type`; a dict (e.g. NNI trial parameters) is converted.

    Unknown keys are a `ConfigError` naming them.
    """
    if isinstance(config, config_type):
        return config
    if isinstance(config, Mapping):
        fields = {f.name for f in dataclasses.fields(config_type)}
        unknown = sorted(set(config) - fields)
        if unknown:
            raise ConfigError(f"{owner!r}: unknown config keys {unknown}; {config_type.__name__} "
                              f"takes {sorted(fields)}")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
        return config_type(**values)
    raise ConfigError(f"{owner!r} takes a {config_type.__name__} or a dict, got {type(config).__name__}")


def parameter_table(source: Graph | nn.Module) -> TeSATable:
    """A dense 32-bit TeSA for every parameter; bound to the graph's names and shapes if given one."""
    model = source.root if isinstance(source, Graph) else source
    return TeSATable({n: TeSA.dense(p.shape) for n, p in model.named_parameters(remove_duplicate=False)},
                     shapes=source.shapes() if isinstance(source, Graph) else None)


def masks_to_table(source: Graph | nn.Module, masks: Mapping[str, Mapping[str, torch.Tensor]]) -> TeSATable:
    """A TeSATable with every parameter of the model, pruned where `masks` are zero.

    `source` is a captured `Graph` (the table is then bound to its tensor names and
    shapes) or the model itself. Mask keys follow NNI: module FQN, then target name.

    Example:
        >>> t = masks_to_table(model, {"fc1": {"weight": mask}})  # doctest: +SKIP
    """
    model = source.root if isinstance(source, Graph) else source
    params = dict(model.named_parameters(remove_duplicate=False))
    table = parameter_table(source)
    modules = dict(model.named_modules())
    for module_name, targets in masks.items():
        if module_name not in modules:
            raise ConfigError(f"mask for module {module_name!r}, which is not a submodule of {type(model).__name__}")
        for target, mask in targets.items():
            name = f"{module_name}.{target}" if module_name else target
            if name not in params:
                raise ConfigError(f"mask for {name!r}, which is not a parameter of {type(model).__name__} "
                                  f"(NNI activation targets such as '_output_' are not weights)")
            tesa = TeSA.from_mask(mask)
            tesa.check_fits(params[name].shape, name)
            table[name] = table[name].merge(tesa.expand(params[name].shape))
    return table


def from_nni_masks(source: Graph | nn.Module, masks: Mapping[str, Mapping[str, torch.Tensor]]) -> TeSATable:
    """Turn the masks an NNI pruner returned (`_, masks = pruner.compress()`) into a TeSATable.

    Example:
        >>> _, masks = L1NormPruner(model, config_list).compress()  # doctest: +SKIP
        >>> table = from_nni_masks(capture(model, x), masks)       # doctest: +SKIP
    """
    return masks_to_table(source, masks)


def prune(model: nn.Module, config: Any, pruner: str = "l1norm", evaluator: Any = None, *,
          graph: Graph | None = None, example_inputs: Any = None) -> TeSATable:
    """Prune `model` with the registered pruner `pruner` and return the pruning as a TeSATable.

    `config` is the pruner's config dataclass, a dict of its fields, or (NNI pruners) an
    NNI config_list. Weights are left as they were, except that pruners which train
    (Taylor, Movement, Slim, AGP/Linear) update them through `evaluator`. Pass `graph`
    (or `example_inputs`) to bind the table to the captured graph's names and shapes.

    Example:
        >>> table = prune(model, {"sparsity": 0.5}, pruner="l1norm")  # doctest: +SKIP
        >>> table = prune(model, BlockPruneConfig(0.9, (32, 32)), pruner="block")  # doctest: +SKIP
    """
    entry = get_pruner(pruner)
    config = entry.prepare(config, evaluator)
    if graph is None and example_inputs is not None:
        graph = capture(model, example_inputs)
    masks = entry.fn(model, config, evaluator)
    return masks_to_table(graph if graph is not None else model, masks)
