"""What Wanda and SparseGPT configs share: sparsity or N:M, calibration samples, layer selection, OWL.

One-shot pruners calibrate on a few samples instead of training; `samples` says how many
of the calibration set (the `evaluator` argument) they use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.oneshot import linears_in_blocks
from sparta_explore.pruners.registry import PruneRequest

LAYER_SPARSITIES = ("uniform", "owl")


@dataclass(frozen=True)
class OneShotPruneConfig:
    """Prune `sparsity` of each selected linear (or keep `nm=(n, m)`: n of every m consecutive inputs).

    `layer_sparsity="owl"` spreads the sparsity over blocks by their outlier ratio (OWL):
    blocks with more Wanda-score outliers (scores above `owl_m` x their mean) get less,
    each within `sparsity` +- `owl_lambda`, their mean exactly `sparsity`.

    Example:
        >>> OneShotPruneConfig(nm=(2, 4)).sparsity
        0.5
        >>> OneShotPruneConfig(0.5, nm=(1, 4))
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: sparsity=0.5 contradicts nm=(1, 4), which prunes 0.75
    """

    sparsity: float | None = None
    nm: tuple[int, int] | None = None
    samples: int | None = 128
    layer_sparsity: str = "uniform"
    owl_m: float = 5.0
    owl_lambda: float = 0.08
    op_names: tuple[str, ...] | None = None
    exclude_op_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.nm is not None:
            nm = tuple(self.nm)
            if len(nm) != 2 or not all(isinstance(v, int) for v in nm) or not 0 < nm[0] <= nm[1]:
                raise ConfigError(f"nm must be (n, m), integers with 0 < n <= m, got {self.nm!r}")
            object.__setattr__(self, "nm", nm)
            implied = 1.0 - nm[0] / nm[1]
            if self.sparsity is not None and abs(self.sparsity - implied) > 1e-9:
                raise ConfigError(f"sparsity={self.sparsity} contradicts nm={nm}, which prunes {implied:g}")
            object.__setattr__(self, "sparsity", implied)
        if self.sparsity is None:
            raise ConfigError("give sparsity (a share in [0, 1)) or nm=(n, m)")
        if not isinstance(self.sparsity, (int, float)) or not 0.0 <= self.sparsity < 1.0:
            raise ConfigError(f"sparsity must be in [0, 1), got {self.sparsity!r}")
        if self.samples is not None and (not isinstance(self.samples, int) or self.samples < 1):
            raise ConfigError(f"samples must be a positive int or None (the whole calibration set), got "
                              f"{self.samples!r}")
        if self.layer_sparsity not in LAYER_SPARSITIES:
            raise ConfigError(f"layer_sparsity must be one of {list(LAYER_SPARSITIES)}, got {self.layer_sparsity!r}")
        if self.layer_sparsity == "owl" and self.nm is not None:
            raise ConfigError("layer_sparsity='owl' varies the sparsity per block; nm fixes it at 1 - n/m")
        if not self.owl_m > 0 or not 0.0 <= self.owl_lambda < 1.0:
            raise ConfigError(f"owl_m must be > 0 and owl_lambda in [0, 1), got owl_m={self.owl_m!r}, "
                              f"owl_lambda={self.owl_lambda!r}")
        if self.op_names is not None:
            object.__setattr__(self, "op_names", tuple(self.op_names))
        object.__setattr__(self, "exclude_op_names", tuple(self.exclude_op_names))


def oneshot_prune_configs(config_type: type, request: PruneRequest, model: nn.Module,
                          **extra: Any) -> list[Any]:
    """Configs of `config_type` for a trial's request, one per sparsity group.

    `block=None` prunes unstructured, `(1, m)` is N:M with n = m * (1 - sparsity), any other
    `(r, c)` is blocks (for configs with a `block` field). Only the request's layers inside
    the model's repeated blocks are pruned (calibration reaches no other); the whole
    calibration set is used (`samples=None`).

    Example:
        >>> oneshot_prune_configs(OneShotPruneConfig, PruneRequest(0.5, ("0",)),
        ...                       nn.Sequential(nn.Linear(2, 2)))[0].op_names
        ('0',)
    """
    if request.scope == "global":
        raise ConfigError("one-shot pruners prune each layer to its own sparsity; scope='global' is not offered")
    reachable = linears_in_blocks(model)
    out = []
    for sparsity, layers in request.groups():
        names = tuple(n for n in layers if n in reachable) if reachable else tuple(layers)
        if not names or sparsity == 0:
            continue
        kwargs: dict[str, Any] = {"samples": None, "op_names": names, **extra}
        block = request.block
        if block is None:
            out.append(config_type(sparsity, **kwargs))
        elif block[0] == 1:
            n = block[1] * (1.0 - sparsity)
            if abs(n - round(n)) > 1e-9 or round(n) < 1:
                raise ConfigError(f"N:M keeps n of every m={block[1]} weights: sparsity {sparsity} gives n={n:g}, "
                                  "not a positive integer (block=(1, m) sets m)")
            out.append(config_type(nm=(round(n), block[1]), **kwargs))
        elif "block" in config_type.__dataclass_fields__:
            out.append(config_type(sparsity, block=tuple(block), **kwargs))
        else:
            raise ConfigError(f"{config_type.__name__} prunes unstructured or N:M (block=(1, m)), not {block} blocks")
    return out
