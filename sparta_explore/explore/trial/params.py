"""TrialParams: everything one exploration trial varies, as one flat, JSON-friendly record.

NNI trial parameters (`nni.get_next_parameter()`) and sweep grid points map straight onto
it with `TrialParams.from_dict`, which names any unknown key; `to_dict` / `canonical_json`
round-trip it, and the canonical JSON is the key a sweep resumes by.

Fields (defaults in brackets):

* ``workload`` [digits-ffn]: a built-in workload (the embedded digits models, `sparta-explore
  models`) or a reference ``package.module:attr`` / ``path/file.py:attr`` to a `Workload`
  (see `sparta_explore.workload`). ``model`` is accepted as the old name of this key.
* ``pruner`` [block]: any registered pruner (block, nm, level, l1norm, l2norm, fpgm,
  taylor, slim, movement, agp, linear); ``sparsity`` [0.5] in [0, 1).
* ``layer_sparsity`` [{}]: per-layer overrides {module name: sparsity}; layers not named
  take ``sparsity``. Flat keys ``"sparsity@<module>"`` (what an NNI search space can hold)
  are accepted by `from_dict` and folded in here.
* ``scope`` [layer]: "layer" prunes `sparsity` of every layer; "global" ranks all layers
  together (block pruner: global block ranking; NNI pruners: one `global_group_id`).
* ``block`` [(32, 32)]: the pruning granularity (rows, cols). Block pruner: the block;
  NNI pruners: their `granularity` (None = the pruner's own default: rows for norm
  pruners, elements for Level); N:M: (1, m), with n = m * (1 - sparsity). JSON may give
  it as [32, 32] or "32x32".
* ``bits`` [32]: 32 = fp32; 2..8 = integer weights and activations through ``quantizer``
  [uniform] (the int8 kernels run 2..8-bit grids). ``act_bits`` [None]: the inputs' width
  when it differs from the weights' (2..8), or 32 for weight-only quantization.
* ``pattern`` and ``precision`` (see `explore.families`) are accepted by `from_dict` as
  single keys that set pruner/block(/sparsity) and bits/act_bits together.
* ``calibrate`` [False]: after fine-tuning, distillation calibration (quantizers.calibrate)
  lowers each tensor below ``bits`` (16, 8, 4) while the accuracy drop on held-out
  training digits stays within ``calibrate_threshold`` [0.01]; with bits=32 it alone
  decides the bits.
* ``finetune_epochs`` [1]: epochs of mask-respecting fine-tuning on the workload's training batches.
* ``batch`` [None]: batch size of the latency inputs; None = the workload's default.
* ``seed`` [0]; ``objective`` [latency] and ``target`` [0.5]: see `objectives`.

Example:
    >>> p = TrialParams.from_dict({"sparsity": 0.75, "block": "1x32", "bits": 8})
    >>> p.block, p.bits
    ((1, 32), 8)
    >>> TrialParams.from_dict(p.to_dict()) == p
    True
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparta_explore.cache import content_key
from sparta_explore.errors import ConfigError
from sparta_explore.explore.trial.families import LAYER_KEY, expand_aliases
from sparta_explore.explore.trial.objectives import check_target, get_objective
from sparta_explore.workload import check_reference

FLOAT_BITS = 32
INT_BITS = range(2, 9)  # what the int8 kernels run (fake_quant.INT_BITS)
SCOPES = ("layer", "global")


def _layer_sparsity(value: Any) -> tuple[tuple[str, float], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    try:
        out = tuple(sorted((str(k), _as_float(f"{LAYER_KEY}{k}", v)) for k, v in items))
    except (TypeError, ValueError):
        raise ConfigError(f"layer_sparsity must map module names to sparsities, got {value!r}") from None
    for name, s in out:
        if not name:
            raise ConfigError("layer_sparsity has an empty module name")
        if not 0.0 <= s < 1.0:
            raise ConfigError(f"{LAYER_KEY}{name} must be in [0, 1), got {s}")
    return out


def parse_block(value: Any) -> tuple[int, int] | None:
    """A block shape from (r, c), [r, c], "RxC", or None (the pruner's default granularity).

    Example:
        >>> parse_block("1x32"), parse_block([32, 32]), parse_block(None)
        ((1, 32), (32, 32), None)
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = [int(v) for v in value.lower().split("x")]
        except ValueError:
            raise ConfigError(f"block must look like '32x32', got {value!r}") from None
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(f"block must be two sizes (rows, cols) or 'RxC', got {value!r}")
    rows, cols = (_as_int("block", v) for v in value)
    if rows < 1 or cols < 1:
        raise ConfigError(f"block sizes must be >= 1, got {value!r}")
    return rows, cols


def format_block(block: tuple[int, int] | None) -> str:
    """The block as "RxC" ("" for None), the form rows and plots show.

    Example:
        >>> format_block((1, 32)), format_block(None)
        ('1x32', '')
    """
    return "" if block is None else f"{block[0]}x{block[1]}"


def _as_int(key: str, value: Any) -> int:
    # NNI's quniform/randint hand back floats such as 8.0: integral floats are accepted
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    raise ConfigError(f"{key} must be an integer, got {value!r}")


def _as_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    return float(value)


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in (0, 1):  # NNI's choice over [0, 1]
        return bool(value)
    raise ConfigError(f"{key} must be true or false, got {value!r}")


def _as_str(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} must be a non-empty string, got {value!r}")
    return value


def format_layer_sparsity(layer_sparsity: tuple[tuple[str, float], ...]) -> str:
    """The flat CSV form of per-layer sparsities: "layers.0:0.9;layers.1:0.5" ("" without overrides).

    Example:
        >>> format_layer_sparsity((("a", 0.9), ("b", 0.5)))
        'a:0.9;b:0.5'
    """
    return ";".join(f"{name}:{s:g}" for name, s in layer_sparsity)


@dataclass(frozen=True)
class TrialParams:
    """One point of the search space; validates itself (see the module docstring for fields).

    Example:
        >>> TrialParams(sparsity=1.5)
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: sparsity must be in [0, 1), got 1.5
    """

    workload: str = "digits-ffn"
    pruner: str = "block"
    sparsity: float = 0.5
    layer_sparsity: tuple[tuple[str, float], ...] = ()
    scope: str = "layer"
    block: tuple[int, int] | None = (32, 32)
    bits: int = FLOAT_BITS
    act_bits: int | None = None
    quantizer: str = "uniform"
    calibrate: bool = False
    calibrate_threshold: float = 0.01
    finetune_epochs: int = 1
    batch: int | None = None
    seed: int = 0
    objective: str = "latency"
    target: float = 0.5

    def __post_init__(self) -> None:
        put = object.__setattr__
        for key in ("workload", "pruner", "scope", "quantizer", "objective"):
            put(self, key, _as_str(key, getattr(self, key)))
        for key in ("bits", "finetune_epochs", "seed"):
            put(self, key, _as_int(key, getattr(self, key)))
        put(self, "sparsity", _as_float("sparsity", self.sparsity))
        put(self, "layer_sparsity", _layer_sparsity(self.layer_sparsity))
        put(self, "calibrate_threshold", _as_float("calibrate_threshold", self.calibrate_threshold))
        put(self, "target", check_target(_as_float("target", self.target)))
        put(self, "calibrate", _as_bool("calibrate", self.calibrate))
        put(self, "block", parse_block(self.block))
        if self.act_bits is not None:
            put(self, "act_bits", _as_int("act_bits", self.act_bits))
            if self.act_bits == self.bits:  # one spelling per point: the sweep key must not split it
                put(self, "act_bits", None)
        if self.batch is not None:
            put(self, "batch", _as_int("batch", self.batch))
            if self.batch < 1:
                raise ConfigError(f"batch must be >= 1, got {self.batch}")
        if not 0.0 <= self.sparsity < 1.0:
            raise ConfigError(f"sparsity must be in [0, 1), got {self.sparsity}")
        if self.scope not in SCOPES:
            raise ConfigError(f"scope must be one of {list(SCOPES)}, got {self.scope!r}")
        if self.bits != FLOAT_BITS and self.bits not in INT_BITS:
            raise ConfigError(f"bits must be {FLOAT_BITS} (float) or {INT_BITS.start}..{INT_BITS.stop - 1} "
                              f"(integer kernels), got {self.bits}")
        if self.act_bits is not None and (self.bits == FLOAT_BITS or
                                          (self.act_bits != FLOAT_BITS and self.act_bits not in INT_BITS)):
            raise ConfigError(f"act_bits must be {FLOAT_BITS} (weight-only) or {INT_BITS.start}.."
                              f"{INT_BITS.stop - 1}, with integer bits; got act_bits={self.act_bits}, "
                              f"bits={self.bits}")
        if not 0.0 <= self.calibrate_threshold < 1.0:
            raise ConfigError(f"calibrate_threshold must be in [0, 1), got {self.calibrate_threshold}")
        if self.finetune_epochs < 0:
            raise ConfigError(f"finetune_epochs must be >= 0, got {self.finetune_epochs}")
        get_objective(self.objective)
        check_reference(self.workload)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrialParams:
        """Params from a dict (NNI parameters, a grid point, a JSON row); unknown keys are an error.

        Example:
            >>> TrialParams.from_dict({"sparsity": 0.5, "spasity": 0.9})
            Traceback (most recent call last):
            ...
            sparta_explore.errors.ConfigError: unknown trial parameter 'spasity'; known: act_bits, batch, bits, ...
        """
        if isinstance(values, TrialParams):
            return values
        if not isinstance(values, Mapping):
            raise ConfigError(f"trial parameters must be a dict, got {type(values).__name__}")
        values = expand_aliases(values)
        if "model" in values:  # the key's old name
            if "workload" in values and values["workload"] != values["model"]:
                raise ConfigError(f"both workload={values['workload']!r} and model={values['model']!r} given")
            values["workload"] = values.pop("model")
        layers = dict(_layer_sparsity(values.pop("layer_sparsity", ())))
        layers.update({k[len(LAYER_KEY):]: v for k, v in values.items() if k.startswith(LAYER_KEY)})
        values = {k: v for k, v in values.items() if not k.startswith(LAYER_KEY)}
        if layers:
            values["layer_sparsity"] = layers
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown trial parameter{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(repr(k) for k in unknown)}; known: {', '.join(sorted(known))}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (block as [rows, cols] or None).

        Example:
            >>> TrialParams().to_dict()["block"]
            [32, 32]
        """
        out = dataclasses.asdict(self)
        out["block"] = None if self.block is None else list(self.block)
        out["layer_sparsity"] = dict(self.layer_sparsity)
        if self.act_bits is None:  # absent, not null: keys of points that predate the field stay the same
            del out["act_bits"]
        return out

    def sparsity_of(self, layer: str) -> float:
        """The sparsity this trial prunes `layer` to (its override, else `sparsity`).

        Example:
            >>> TrialParams.from_dict({"sparsity": 0.5, "sparsity@fc1": 0.9}).sparsity_of("fc1")
            0.9
        """
        return dict(self.layer_sparsity).get(layer, self.sparsity)

    def canonical_json(self) -> str:
        """One JSON text per distinct point (sorted keys, no spaces): what a sweep keys rows by.

        Example:
            >>> TrialParams().canonical_json()[:40]
            '{"batch":null,"bits":32,"block":[32,32],'
        """
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def key(self) -> str:
        """A short hash of `canonical_json()`, used as a row's file name.

        Example:
            >>> TrialParams().key == TrialParams.from_dict({"block": "32x32"}).key
            True
        """
        return content_key(self.to_dict())

    def replace(self, **changes: Any) -> TrialParams:
        """A copy with `changes` applied (validated like `from_dict`).

        Example:
            >>> TrialParams().replace(bits=8).bits
            8
        """
        return TrialParams.from_dict({**self.to_dict(), **changes})
