"""The decoder-LLM search space: per layer group a sparsity, weight bits and group size; one compressor,
the head's bits and the activations' width for the whole model.

A Llama's linears fall into groups by kind (``attn``: q/k/v/o projections; ``mlp``: gate/up/down)
and depth band (``bands`` equal slices of the layers), so the space stays small: 2 x bands groups.
NNI sees it flat (`search_space`): keys ``sparsity@attn.0``, ``bits@mlp.1``, ``group@mlp.1``, ...
plus ``compressor``, ``head_bits`` and ``act_bits``. `LLMPoint.from_dict` reads such a dict back,
naming any key it does not know or any value outside its choices, and `LLMPoint.assignment` says
what each linear gets.

* sparsity: the fraction of each row the compressor prunes (Wanda: |W| x the input norm; SparseGPT:
  with its weight update); 0 keeps the group dense.
* bits: 32 keeps float weights (the grids already in them, e.g. a GGUF's, stay); 8 / 4 / 3: GPTQ
  onto asymmetric grids of ``group`` columns, after pruning (pruned weights stay zero).
* head_bits: 32 keeps the tied head / embedding as given; 8 / 4 round it to nearest on grids of 32.
* act_bits: 8 rounds each projection's input to int8 per 32 columns (the decode step's integer
  path, llama.cpp's Q8 activations), 32 keeps them float.

Example:
    >>> p = LLMPoint.from_dict({"bits@mlp.0": 4, "group@mlp.0": 64, "act_bits": 8}, layers=4, bands=2)
    >>> p.assignment(4)["model.layers.1.mlp.up_proj"], p.assignment(4)["model.layers.3.mlp.up_proj"]
    (Choice(sparsity=0.0, bits=4, group=64), Choice(sparsity=0.0, bits=32, group=128))
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparta_explore.errors import ConfigError

LLAMA_LINEARS = {"self_attn.q_proj": "attn", "self_attn.k_proj": "attn", "self_attn.v_proj": "attn",
                 "self_attn.o_proj": "attn", "mlp.gate_proj": "mlp", "mlp.up_proj": "mlp", "mlp.down_proj": "mlp"}
KINDS = ("attn", "mlp")
SPARSITIES = (0.0, 0.3, 0.5, 0.7)
BITS = (32, 8, 4, 3)
GROUPS = (32, 64, 128)
COMPRESSORS = ("wanda", "sparsegpt")
HEAD_BITS = (32, 8, 4)
ACT_BITS = (32, 8)
GLOBAL_KEYS = {"compressor": COMPRESSORS, "head_bits": HEAD_BITS, "act_bits": ACT_BITS}
GROUP_KEYS = {"sparsity": SPARSITIES, "bits": BITS, "group": GROUPS}


@dataclass(frozen=True)
class Choice:
    """What one linear gets: prune `sparsity` of each row, then GPTQ to `bits` on grids of `group` (32 = none)."""

    sparsity: float = 0.0
    bits: int = 32
    group: int = 128


def group_names(bands: int) -> tuple[str, ...]:
    """The groups of a space with `bands` depth bands.

    Example:
        >>> group_names(2)
        ('attn.0', 'attn.1', 'mlp.0', 'mlp.1')
    """
    return tuple(f"{kind}.{band}" for kind in KINDS for band in range(bands))


def group_of(name: str, layers: int, bands: int) -> str:
    """The group of linear `name` ("model.layers.<i>.<path>") in a model of `layers` layers.

    Example:
        >>> group_of("model.layers.29.mlp.down_proj", 30, 3)
        'mlp.2'
    """
    parts = name.split(".")
    if len(parts) < 5 or parts[:2] != ["model", "layers"] or not parts[2].isdigit() \
            or ".".join(parts[3:]) not in LLAMA_LINEARS:
        raise ConfigError(f"{name!r} is not a Llama decoder linear (model.layers.<i>.self_attn|mlp.<proj>)")
    return f"{LLAMA_LINEARS['.'.join(parts[3:])]}.{int(parts[2]) * bands // layers}"


def _value(key: str, value: Any, choices: tuple[Any, ...]) -> Any:
    for c in choices:
        if value == c and not isinstance(value, bool):
            return c
    raise ConfigError(f"LLM search: {key} must be one of {list(choices)}, got {value!r}")


@dataclass(frozen=True)
class LLMPoint:
    """One point of the space: per group its `Choice`, and the model-wide compressor, head and activation bits.

    Example:
        >>> LLMPoint.from_dict({"sparsity@attn.0": 0.5}, layers=2, bands=1).groups["attn.0"].sparsity
        0.5
    """

    bands: int = 3
    groups: Mapping[str, Choice] = field(default_factory=dict)
    compressor: str = "wanda"
    head_bits: int = 32
    act_bits: int = 8

    @classmethod
    def from_dict(cls, params: Mapping[str, Any], *, layers: int, bands: int = 3) -> LLMPoint:
        """A point from flat NNI parameters; groups not named keep `Choice()` (dense, float)."""
        if not 1 <= bands <= layers:
            raise ConfigError(f"LLM search: bands must be in 1 .. {layers} (the layers), got {bands}")
        names = group_names(bands)
        per: dict[str, dict[str, Any]] = {g: {} for g in names}
        top: dict[str, Any] = {}
        for key, value in params.items():
            what, at, group = str(key).partition("@")
            if at:
                if what not in GROUP_KEYS or group not in per:
                    raise ConfigError(f"LLM search: unknown key {key!r}; per group: "
                                      f"{', '.join(f'{k}@<group>' for k in GROUP_KEYS)} with groups {', '.join(names)}")
                per[group][what] = _value(key, value, GROUP_KEYS[what])
            elif key in GLOBAL_KEYS:
                top[key] = _value(key, value, GLOBAL_KEYS[key])
            else:
                raise ConfigError(f"LLM search: unknown key {key!r}; known: {', '.join(GLOBAL_KEYS)} and "
                                  f"{', '.join(f'{k}@<group>' for k in GROUP_KEYS)}")
        return cls(bands=bands, groups={g: Choice(**per[g]) for g in names}, **top)

    @classmethod
    def from_key(cls, key: str) -> LLMPoint:
        """The point a `key` (or `asked_key`) names.

        Example:
            >>> p = LLMPoint.from_dict({"bits@mlp.0": 4}, layers=2, bands=1)
            >>> LLMPoint.from_key(p.key()) == p
            True
        """
        try:
            params = json.loads(key)
            bands = int(params.pop("bands"))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(f"LLM search: {key!r} is not a point key (JSON with 'bands')") from None
        return cls.from_dict(params, layers=bands, bands=bands)

    def to_dict(self) -> dict[str, Any]:
        """The flat parameters this point came from (every key), JSON-ready."""
        out: dict[str, Any] = {"compressor": self.compressor, "head_bits": self.head_bits, "act_bits": self.act_bits}
        for g, c in self.groups.items():
            out.update({f"sparsity@{g}": c.sparsity, f"bits@{g}": c.bits, f"group@{g}": c.group})
        return out

    def canonical(self) -> LLMPoint:
        """The same model with the parameters that do not change it at their defaults: a group's columns per
        grid without bits (32), the compressor where nothing is pruned.

        Example:
            >>> p = LLMPoint.from_dict({"group@mlp.0": 32, "compressor": "sparsegpt"}, layers=2, bands=1)
            >>> p.canonical() == LLMPoint.from_dict({}, layers=2, bands=1)
            True
        """
        groups = {g: c if c.bits < 32 else Choice(c.sparsity, c.bits) for g, c in self.groups.items()}
        pruned = any(c.sparsity > 0 for c in groups.values())
        return LLMPoint(self.bands, groups, self.compressor if pruned else LLMPoint.compressor, self.head_bits,
                        self.act_bits)

    def asked_key(self) -> str:
        """The point's text as asked, every parameter as given."""
        return json.dumps({"bands": self.bands, **self.to_dict()}, sort_keys=True)

    def key(self) -> str:
        """The canonical text of the point (what results are cached and resumed by): points that make the same
        model share it."""
        return self.canonical().asked_key()

    def compress_key(self) -> str:
        """The part of `key` that changes the compressed weights (act_bits does not)."""
        d = json.loads(self.key())
        d.pop("act_bits")
        return json.dumps(d, sort_keys=True)

    def assignment(self, layers: int) -> dict[str, Choice]:
        """Each decoder linear's `Choice` in a model of `layers` layers."""
        names = [f"model.layers.{i}.{path}" for i in range(layers) for path in LLAMA_LINEARS]
        return {n: self.groups.get(group_of(n, layers, self.bands), Choice()) for n in names}


def search_space(bands: int = 3, *, sparsities: tuple[float, ...] = SPARSITIES, bits: tuple[int, ...] = BITS,
                 groups: tuple[int, ...] = GROUPS, compressors: tuple[str, ...] = COMPRESSORS,
                 head_bits: tuple[int, ...] = HEAD_BITS, act_bits: tuple[int, ...] = ACT_BITS) -> dict[str, Any]:
    """The NNI search space (flat `choice` keys) over `bands` depth bands.

    Example:
        >>> sorted(search_space(1))[:3]
        ['act_bits', 'bits@attn.0', 'bits@mlp.0']
    """
    spec = {"sparsity": sparsities, "bits": bits, "group": groups}
    for what, values in spec.items():
        for v in values:
            _value(what, v, GROUP_KEYS[what])
    out: dict[str, Any] = {}
    for key, values in (("compressor", compressors), ("head_bits", head_bits), ("act_bits", act_bits)):
        out[key] = {"_type": "choice", "_value": [_value(key, v, GLOBAL_KEYS[key]) for v in values]}
    for g in group_names(bands):
        for what, values in spec.items():
            out[f"{what}@{g}"] = {"_type": "choice", "_value": list(values)}
    return dict(sorted(out.items()))


def write_search_space(path: str | Path, bands: int = 3, **choices: Any) -> Path:
    """`search_space(bands, **choices)` as an NNI searchSpaceFile at `path`.

    Example:
        >>> write_search_space("experiments/search_space_llm.json")  # doctest: +SKIP
    """
    path = Path(path)
    path.write_text(json.dumps(search_space(bands, **choices), indent=1) + "\n")
    return path
