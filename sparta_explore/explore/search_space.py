"""The NNI search space of a workload, built from its prunable layers.

Every key is a `TrialParams` field, so `nni_trial` feeds NNI's parameters to `run_trial`
unchanged, and every value is one TrialParams accepts, so TPE, Evolution, Random and
`ParetoTuner` all search the same space:

* ``sparsity@<layer>`` (one per prunable layer, `SpaceConfig.per_layer`, the default) or
  one ``sparsity`` for all: the share of blocks the block pruner removes;
* ``block``: the pruning block ("RxC"); only shapes that tile every prunable layer's GEMM
  view (out x in*kernel) exactly are offered, so no layer gets ragged edge blocks;
* ``bits``: 32 (fp32 kernels) or an integer width the int8 kernels run;
* ``scope`` (only if `SpaceConfig.scopes` offers both): "layer" prunes `sparsity` of each
  layer; "global" ranks the blocks of all layers together, so each layer's own sparsity is
  chosen by weight magnitude.

The workload's head is not a prunable layer (trials leave it dense: pruning its rows
deletes outputs). `experiments/search_space.json` is this module's output for the
default config; a test checks the file has not drifted from it.

Regenerate it with ``python -m sparta_explore.explore.search_space --out experiments/search_space.json``.

Example:
    >>> space = build_search_space(SpaceConfig(workload="digits-mlp", blocks=("1x32", "32x32", "96x32")))
    >>> space["block"]["_value"]
    ['1x32', '32x32']
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from sparta_explore.cache import atomic_write
from sparta_explore.errors import ConfigError
from sparta_explore.explore.params import LAYER_KEY, TrialParams, format_block, parse_block
from sparta_explore.workload import Workload, load_workload

SEARCH_SPACE_FILE = Path("experiments") / "search_space.json"


@dataclass(frozen=True)
class SpaceConfig:
    """The candidate values of each key; `build_search_space` keeps those the model allows.

    Example:
        >>> SpaceConfig(bits=(32, 16))
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: bits must be 32 (float) or 2..8 (integer kernels), got 16
    """

    workload: str = "digits-ffn"
    sparsities: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)
    blocks: tuple[str, ...] = ("1x32", "32x32", "64x64")
    # 4 bits runs at int8 speed (the int8 kernels run 2..8-bit grids) and only loses accuracy
    bits: tuple[int, ...] = (32, 8)
    # global block ranking empties whole layers of digits-ffn at sparsity >= 0.8 (chance accuracy),
    # which wastes a small budget; pass scopes=("layer", "global") to search it anyway
    scopes: tuple[str, ...] = ("layer",)
    # one sparsity choice per prunable layer ("sparsity@<layer>"), or one for all of them
    per_layer: bool = True

    def __post_init__(self) -> None:
        for name in ("sparsities", "blocks", "bits", "scopes"):
            values = getattr(self, name)
            if not values:
                raise ConfigError(f"{name} needs at least one value")
            if len(set(values)) != len(values):
                raise ConfigError(f"{name} repeats a value: {list(values)}")
        # every candidate must be a value TrialParams accepts: a bad one fails here, not in trial 17
        base = TrialParams(workload=self.workload)
        for s in self.sparsities:
            base.replace(sparsity=s)
        for b in self.blocks:
            base.replace(block=format_block(parse_block(b)))
        for bits in self.bits:
            base.replace(bits=bits)
        for scope in self.scopes:
            base.replace(scope=scope)
        if self.per_layer and "global" in self.scopes:
            raise ConfigError("per_layer sparsities and the 'global' scope conflict: pick one")


@dataclass(frozen=True)
class PrunableLayer:
    """A weight the trial's pruner targets, by module name, with its GEMM view (rows, cols).

    Example:
        >>> PrunableLayer("fc", 64, 128).fits((32, 64)), PrunableLayer("fc", 64, 128).fits((1, 48))
        (True, False)
    """

    name: str
    rows: int
    cols: int

    def fits(self, block: tuple[int, int]) -> bool:
        """Whether `block` tiles this weight exactly."""
        return self.rows % block[0] == 0 and self.cols % block[1] == 0


def prunable_layers(workload: Workload | nn.Module) -> list[PrunableLayer]:
    """The weights a trial's pruner targets (the workload's prunable modules), with their GEMM views.

    Example:
        >>> prunable_layers(nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 10)))
        [PrunableLayer(name='0', rows=96, cols=64)]
    """
    from sparta_explore.pruners.selection import gemm_weight

    if isinstance(workload, nn.Module):
        workload = Workload("model", workload, (), metric=lambda m: 0.0)
    model = workload.dense_model()
    out = []
    for name in workload.prunable_modules(model):
        w = gemm_weight(model.get_submodule(name))
        out.append(PrunableLayer(name, int(w.shape[0]), int(w[0].numel())))
    return out


def build_search_space(config: SpaceConfig | None = None) -> dict[str, Any]:
    """The NNI search space (choices only) for `config.workload`; keys with one value are left out.

    A left-out key takes the trial's default (or the value on the trial command line).

    Example:
        >>> sorted(build_search_space(SpaceConfig(workload="digits-mlp", per_layer=False)))
        ['bits', 'block', 'sparsity']
        >>> sorted(build_search_space(SpaceConfig(workload="digits-mlp")))[2:]
        ['sparsity@layers.0', 'sparsity@layers.1']
    """
    cfg = config or SpaceConfig()
    layers = prunable_layers(load_workload(cfg.workload))
    if not layers:
        raise ConfigError(f"workload {cfg.workload!r} has no prunable layer besides its head")
    blocks = [format_block(parse_block(b)) for b in cfg.blocks]
    fitting = [b for b in blocks if all(layer.fits(parse_block(b)) for layer in layers)]
    if not fitting:
        shapes = ", ".join(f"{la.name} {la.rows}x{la.cols}" for la in layers)
        raise ConfigError(f"none of the blocks {blocks} tiles every prunable layer of {cfg.workload!r} ({shapes})")
    sparsities = [float(s) for s in cfg.sparsities]
    per_layer = {f"{LAYER_KEY}{layer.name}": sparsities for layer in layers} if cfg.per_layer else {}
    axes: dict[str, list[Any]] = {**per_layer, **({} if cfg.per_layer else {"sparsity": sparsities}),
                                  "block": fitting, "bits": [int(b) for b in cfg.bits], "scope": list(cfg.scopes)}
    return {key: {"_type": "choice", "_value": values} for key, values in axes.items() if len(values) > 1}


def format_search_space(space: dict[str, Any]) -> str:
    """The space as JSON text, one key per line (what experiments/search_space.json holds).

    Example:
        >>> print(format_search_space({"bits": {"_type": "choice", "_value": [32, 8]}}))
        {
          "bits": {"_type": "choice", "_value": [32, 8]}
        }
    """
    lines = [f"  {json.dumps(key)}: {json.dumps(entry)}" for key, entry in space.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_search_space(path: str | os.PathLike, config: SpaceConfig | None = None) -> Path:
    """Write the search space of `config` (default: the embedded default) to `path`, atomically.

    Example:
        >>> write_search_space("/tmp/space-doc/space.json", SpaceConfig(workload="digits-mlp")).exists()
        True
    """
    text = format_search_space(build_search_space(config)).encode()
    return atomic_write(Path(path), lambda f: f.write(text))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the default search space, or write it with ``--out``.

    Example:
        >>> main(["--workload", "digits-mlp", "--out", "/tmp/space-doc/mlp.json"])
        wrote /tmp/space-doc/mlp.json
        0
        >>> main(["--workload", "digits-mlp", "--families", "--out", "/tmp/space-doc/families.json"])
        wrote /tmp/space-doc/families.json
        0
    """
    parser = argparse.ArgumentParser(prog="python -m sparta_explore.explore.search_space",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--workload", "--model", dest="workload", default=SpaceConfig.workload,
                        help="built-in workload or 'module:attr' / 'file.py:attr'")
    parser.add_argument("--out", type=Path, default=None, help=f"write here (e.g. {SEARCH_SPACE_FILE})")
    parser.add_argument("--families", action="store_true",
                        help="the family space instead (per-layer sparsity x pattern x precision; family_space.py)")
    args = parser.parse_args(argv)
    if args.families:
        from sparta_explore.explore.family_space import FamilySpaceConfig, family_search_space

        space = family_search_space(FamilySpaceConfig(workload=args.workload))
    else:
        space = build_search_space(SpaceConfig(workload=args.workload))
    text = format_search_space(space)
    if args.out is None:
        sys.stdout.write(text)
    else:
        print(f"wrote {atomic_write(Path(args.out), lambda f: f.write(text.encode()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
