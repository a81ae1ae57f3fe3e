"""The block-pruner search space of a workload: per-layer sparsity x block shape x bits (x scope).

Every key is a `TrialParams` field, so `nni_trial` feeds NNI's parameters to `run_trial`
unchanged, and every value is one TrialParams accepts, so TPE, Evolution, Random and
`ParetoTuner` all search the same space:

* ``sparsity@<layer>`` (one per prunable layer, `BlockSpaceConfig.per_layer`, the default) or
  one ``sparsity`` for all: the share of blocks the block pruner removes;
* ``block``: the pruning block ("RxC"); only shapes that tile every prunable layer's GEMM
  view (out x in*kernel) exactly are offered, so no layer gets ragged edge blocks;
* ``bits``: 32 (fp32 kernels) or an integer width the int8 kernels run;
* ``scope`` (only if `BlockSpaceConfig.scopes` offers both): "layer" prunes `sparsity` of each
  layer; "global" ranks the blocks of all layers together, so each layer's own sparsity is
  chosen by weight magnitude.

The workload's head is not a prunable layer (trials leave it dense: pruning its rows
deletes outputs). `experiments/search_space.json` is this module's output for the
default config; a test checks the file has not drifted from it.

Regenerate it with ``sparta-explore space --out experiments/search_space.json``.

Example:
    >>> space = block_search_space(BlockSpaceConfig(workload="digits-mlp", blocks=("1x32", "32x32", "96x32")))
    >>> space["block"]["_value"]
    ['1x32', '32x32']
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparta_explore.cache import atomic_write
from sparta_explore.errors import ConfigError
from sparta_explore.explore.search.layers import prunable_layers
from sparta_explore.explore.trial.params import LAYER_KEY, TrialParams, format_block, parse_block
from sparta_explore.workload import load_workload

SEARCH_SPACE_FILE = Path("experiments") / "search_space.json"


@dataclass(frozen=True)
class BlockSpaceConfig:
    """The candidate values of each key; `block_search_space` keeps those the model allows.

    Example:
        >>> BlockSpaceConfig(bits=(32, 16))
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


def block_search_space(config: BlockSpaceConfig | None = None) -> dict[str, Any]:
    """The NNI search space (choices only) for `config.workload`; keys with one value are left out.

    A left-out key takes the trial's default (or the value on the trial command line).

    Example:
        >>> sorted(block_search_space(BlockSpaceConfig(workload="digits-mlp", per_layer=False)))
        ['bits', 'block', 'sparsity']
        >>> sorted(block_search_space(BlockSpaceConfig(workload="digits-mlp")))[2:]
        ['sparsity@layers.0', 'sparsity@layers.1']
    """
    cfg = config or BlockSpaceConfig()
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


def write_search_space(path: str | os.PathLike, config: BlockSpaceConfig | None = None) -> Path:
    """Write the search space of `config` (default: the embedded default) to `path`, atomically.

    Example:
        >>> write_search_space("/tmp/space-doc/space.json", BlockSpaceConfig(workload="digits-mlp")).exists()
        True
    """
    text = format_search_space(block_search_space(config)).encode()
    return atomic_write(Path(path), lambda f: f.write(text))
