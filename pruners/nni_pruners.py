"""Adapters for NNI 3.0's pruners: run one, read its masks, leave the model unwrapped.

NNI wraps modules when a pruner is constructed and `unwrap_model()` restores the
unmasked weights, so the weights come back as they were (plus whatever training the
pruner did); the pruning lives in the returned masks, and so in the TeSATable.
SlimPruner's wrapped forward also multiplies by its learned `weight_slim_factor`; we fold
that factor into the weight so the unwrapped model computes what NNI trained.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from nni.compression.base.setting import PruningSetting
from nni.compression.pruning import (
    AGPPruner,
    FPGMPruner,
    L1NormPruner,
    L2NormPruner,
    LevelPruner,
    LinearPruner,
    MovementPruner,
    SlimPruner,
    TaylorPruner,
)
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.pruners.nni_evaluator import quiet_nni, resolve_evaluator
from sparta_explore.pruners.registry import Masks, PruneRequest, register_pruner
from sparta_explore.pruners.selection import STORED_IN_OUT, checked_config_list, nni_op_entry


def _register_stored_in_out() -> None:
    """Tell NNI about Hugging Face's Conv1D (GPT-2): a Linear whose weight is stored (in, out).

    NNI knows only torch's module types and refuses any other ("Conv1D is not registered");
    the bias follows the output features, which are the weight's dim 1 here.
    """
    for name in STORED_IN_OUT:
        setting = {"weight": dict(PruningSetting.default_setting["weight"]),
                   "bias": {"align": {"module_name": None, "target_name": "weight", "dims": [1]},
                            "apply_method": "mul"}}
        PruningSetting.register(name, setting)


_register_stored_in_out()


@dataclass(frozen=True)
class NNIPruneConfig:
    """What to prune with an NNI pruner, as one flat, JSON-friendly record.

    `granularity` is NNI's: "default" (whole output rows/filters for norm pruners,
    elements for Level), "in_channel", "out_channel", or a block such as (1, 4).
    `training_steps` drives the pruners that train (Taylor, Slim, Movement, AGP, Linear);
    `schedule_times` is how many steps AGP/Linear take to reach `sparsity`.

    Example:
        >>> NNIPruneConfig(0.5, op_types=("Linear",)).to_config_list()
        [{'op_types': ['Linear'], 'sparse_ratio': 0.5, 'granularity': 'default'}]
    """

    sparsity: float
    op_types: tuple[str, ...] = ("Linear", "Conv2d")
    op_names: tuple[str, ...] | None = None
    exclude_op_names: tuple[str, ...] = ()
    granularity: str | tuple[int, ...] = "default"
    training_steps: int = 20
    schedule_times: int = 4

    def __post_init__(self) -> None:
        if not 0.0 <= self.sparsity < 1.0:
            raise ConfigError(f"sparsity must be in [0, 1), got {self.sparsity}")
        if isinstance(self.granularity, str):
            if self.granularity not in ("default", "in_channel", "out_channel"):
                raise ConfigError(f"granularity must be 'default', 'in_channel', 'out_channel' or a block "
                                  f"tuple, got {self.granularity!r}")
        elif not all(isinstance(g, int) and g >= 1 for g in self.granularity):
            raise ConfigError(f"granularity block must be positive ints, got {self.granularity!r}")
        if self.training_steps < 1:
            raise ConfigError(f"training_steps must be >= 1, got {self.training_steps}")
        if self.schedule_times < 1:
            raise ConfigError(f"schedule_times must be >= 1, got {self.schedule_times}")

    def to_config_list(self) -> list[dict[str, Any]]:
        """The equivalent NNI config_list."""
        entry = nni_op_entry(self.op_types, self.op_names, self.exclude_op_names)
        entry["sparse_ratio"] = float(self.sparsity)
        entry["granularity"] = self.granularity if isinstance(self.granularity, str) else list(self.granularity)
        return [entry]


def nni_configs(request: PruneRequest, model: nn.Module) -> list[list[dict[str, Any]]]:
    """One NNI config_list for a trial's request: an entry per sparsity group (one global group if asked).

    Example:
        >>> nni_configs(PruneRequest(0.5, ("0",), block=None), nn.Sequential(nn.Linear(2, 2)))[0][0]["op_names"]
        ['0']
    """
    named = dict(model.named_modules())
    granularity = "default" if request.block is None else request.block
    entries: list[dict[str, Any]] = []
    for sparsity, layers in request.groups():
        for stored_in_out in (False, True):  # a (out, in) block is an (in, out) block of a Conv1D weight
            part = tuple(n for n in layers if (type(named[n]).__name__ in STORED_IN_OUT) == stored_in_out)
            if not part:
                continue
            grain = tuple(reversed(granularity)) if stored_in_out and not isinstance(granularity, str) else granularity
            op_types = tuple(sorted({type(named[n]).__name__ for n in part}))
            entries += NNIPruneConfig(sparsity, op_types=op_types, op_names=part, granularity=grain,
                                      training_steps=request.training_steps).to_config_list()
    if request.scope == "global":  # NNI ranks every target of one global group together
        entries = [{**e, "global_group_id": 0} for e in entries]
    return [entries]


def slim_configs(request: PruneRequest, model: nn.Module) -> list[Any]:
    """SlimPruner prunes BatchNorm scaling factors where the model has them, else the request's layers."""
    if any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):
        return [NNIPruneConfig(request.sparsity, op_types=("BatchNorm2d",),
                               training_steps=request.training_steps)]
    return nni_configs(request, model)


def _steps(config: NNIPruneConfig | list) -> NNIPruneConfig:
    return config if isinstance(config, NNIPruneConfig) else NNIPruneConfig(0.0)


def _run(pruner: Any, compress: Callable[[], Any], fold_slim: bool = False) -> Masks:
    """Compress, read the masks, unwrap; NNI's module wrappers never leak out."""
    try:
        compress()
        # bias-free modules (conv with bias=False) report a None mask for "bias"
        masks = {m: {t: v.detach().clone() for t, v in d.items() if v is not None}
                 for m, d in pruner.get_masks().items()}
        factors = {}
        if fold_slim:
            for name, wrapper in pruner._module_wrappers.items():
                factor = getattr(wrapper, "weight_slim_factor", None)
                if factor is not None:
                    factors[name] = factor.detach().clone()
    finally:
        pruner.unwrap_model()
    if factors:
        model = pruner.bound_model
        with torch.no_grad():
            for name, factor in factors.items():
                weight = model.get_submodule(name).weight
                weight.mul_(factor.to(weight.dtype).expand_as(weight))
    return masks


def _one_shot(cls: type) -> Callable[[nn.Module, Any, Any], Masks]:
    def run(model: nn.Module, config: Any, evaluator: Any = None) -> Masks:
        with quiet_nni():
            pruner = cls(model, checked_config_list(model, config))
            return _run(pruner, pruner.compress)
    run.__doc__ = f"Masks from NNI's {cls.__name__} (one shot, no training)."
    return run


for _name, _cls in (("level", LevelPruner), ("l1norm", L1NormPruner), ("l2norm", L2NormPruner),
                    ("fpgm", FPGMPruner)):
    register_pruner(_name, config_type=NNIPruneConfig, accepts_config_list=True,
                    from_request=nni_configs)(_one_shot(_cls))


@register_pruner("taylor", config_type=NNIPruneConfig, needs_evaluator=True, accepts_config_list=True,
                 from_request=nni_configs)
def taylor_masks(model: nn.Module, config: Any, evaluator: Any) -> Masks:
    """Masks from NNI's TaylorPruner (first-order saliency over `training_steps` steps)."""
    with quiet_nni():
        pruner = TaylorPruner(model, checked_config_list(model, config), resolve_evaluator(model, evaluator),
                              training_steps=_steps(config).training_steps)
        return _run(pruner, pruner.compress)


@register_pruner("slim", config_type=NNIPruneConfig, needs_evaluator=True, accepts_config_list=True,
                 from_request=slim_configs)
def slim_masks(model: nn.Module, config: Any, evaluator: Any) -> Masks:
    """Masks from NNI's SlimPruner (L1-regularised scaling factors, usually on BatchNorm)."""
    with quiet_nni():
        pruner = SlimPruner(model, checked_config_list(model, config), resolve_evaluator(model, evaluator),
                            training_steps=_steps(config).training_steps, regular_scale=1.0)
        return _run(pruner, pruner.compress, fold_slim=True)


@register_pruner("movement", config_type=NNIPruneConfig, needs_evaluator=True, accepts_config_list=True,
                 from_request=nni_configs)
def movement_masks(model: nn.Module, config: Any, evaluator: Any) -> Masks:
    """Masks from NNI's MovementPruner (scores learned while fine-tuning)."""
    steps = max(_steps(config).training_steps, 4)
    with quiet_nni():
        # warm-up for the first quarter, scores frozen from three quarters on (NNI asserts the order)
        pruner = MovementPruner(model, checked_config_list(model, config), resolve_evaluator(model, evaluator),
                                warmup_step=steps // 4, cooldown_begin_step=(3 * steps) // 4, regular_scale=1.0)
        return _run(pruner, lambda: pruner.compress(max_steps=steps, max_epochs=None))


def _scheduled(cls: type) -> Callable[[nn.Module, Any, Any], Masks]:
    def run(model: nn.Module, config: Any, evaluator: Any) -> Masks:
        cfg = _steps(config)
        interval = max(1, cfg.training_steps // cfg.schedule_times)
        with quiet_nni():
            pruner = cls(L1NormPruner(model, checked_config_list(model, config)), interval_steps=interval,
                         total_times=cfg.schedule_times, evaluator=resolve_evaluator(model, evaluator))
            return _run(pruner, lambda: pruner.compress(max_steps=interval * cfg.schedule_times, max_epochs=None))
    run.__doc__ = f"Masks from NNI's {cls.__name__} over L1NormPruner, reaching `sparsity` in `schedule_times` steps."
    return run


register_pruner("agp", config_type=NNIPruneConfig, needs_evaluator=True, accepts_config_list=True,
                from_request=nni_configs)(
    _scheduled(AGPPruner))
register_pruner("linear", config_type=NNIPruneConfig, needs_evaluator=True, accepts_config_list=True,
                from_request=nni_configs)(
    _scheduled(LinearPruner))
