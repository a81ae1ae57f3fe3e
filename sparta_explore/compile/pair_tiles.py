"""Remembered pair timings: the second op of an fp32 chain built in the first's tiling from the start.

Two chained fp32 sparse kernels fuse only in one tiling (`kernel_pairs.py`). Where each op's
tile search chose its own, the fusion pass built the second op again in the first's tiling
and timed the pair against the two apart: BERT-base at 90% unstructured rebuilt its 12 FC2s
(0.4 s) and timed a pair in every compile whose searches parted (about half of them). The
verdict is a property of the pair's class on this machine (`retile_key`: the first kernel,
its tiling, both patterns' classes, the rows), so it is kept beside the tile searches'
records; a later compile that finds "faster fused" builds the second op in the first's tiling
at once (`first_tiling`), and the fusion pass then fuses the pair without timing it.

Example:
    >>> key = retile_key(fc1, kept, 1, "none", 1024)                  # doctest: +SKIP
    >>> remember(cache_dir, key, True, "apart 2.1 ms, fused 1.8 ms")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from torch import nn

from sparta_explore.cache import content_key, resolve_cache_dir
from sparta_explore.kernels.bsr_codegen import TileConfig
from sparta_explore.kernels.groups import shared_rows
from sparta_explore.kernels.sparse_linear import SparseLinear
from sparta_explore.kernels.tuning import TUNING_VERSION, m_bucket, shape_and_pattern
from sparta_explore.plan import OpPlan
from sparta_explore.plan.execution_plan import FP32


def retile_key(first: SparseLinear, kept: np.ndarray, block_rows: int, activation: str, rows: int) -> str:
    """The class of a pair led by `first` whose second op reads `kept` (bool, (N, K)) in `block_rows`-row blocks
    with `activation`, at `rows` rows: the second's own tiling follows from its class (its tile search).

    Example:
        >>> retile_key(fc1, np.ones((768, 3072), dtype=bool), 1, "none", 1024)  # doctest: +SKIP
        '3f0c...'
    """
    lead = (type(first).__name__, first.tile, first.activation, shape_and_pattern(first.kept.numpy(), first.block_rows))
    return content_key({"retiled pair": [repr(lead), repr((activation, shape_and_pattern(kept, block_rows)))],
                        "m": m_bucket(rows), "version": TUNING_VERSION})


def _path(cache_dir: str | os.PathLike | None, key: str) -> Path:
    return resolve_cache_dir(cache_dir, "tuning") / f"pair-{key}.json"


def remember(cache_dir: str | os.PathLike | None, key: str, faster: bool, said: str) -> None:
    """Keep a retiled pair's verdict (`faster` fused, what its timing said) for later compiles.

    Example:
        >>> remember(cache_dir, key, True, "apart 2.1 ms, fused 1.8 ms")  # doctest: +SKIP
    """
    path = _path(cache_dir, key)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"faster": bool(faster), "said": said}))
    tmp.replace(path)  # whole or absent: a reader never sees half a record


def recall(cache_dir: str | os.PathLike | None, key: str) -> tuple[bool, str] | None:
    """(fused faster, what its timing said) of a pair class timed before, or None.

    Example:
        >>> recall(cache_dir, "no such key") is None  # doctest: +SKIP
        True
    """
    path = _path(cache_dir, key)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        return bool(record["faster"]), str(record["said"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # torn or foreign: the pair is timed again and the record rewritten


def first_tiling(first: nn.Module | None, second: OpPlan, in_shape: Sequence[int],
                 cache_dir: str | os.PathLike | None) -> TileConfig | None:
    """`first`'s tiling, when `second` (the op reading `first`'s output; `in_shape`: `first`'s input's shape) would
    be an fp32 `SparseLinear` whose pair with `first` was timed faster fused in its first's tiling by an earlier
    compile; else None.

    Example:
        >>> first_tiling(compiled["fc1"], plan.ops["fc2"], (8, 128, 768), cache_dir)  # doctest: +SKIP
        TileConfig(...)
    """
    if type(first) is not SparseLinear or first._fn is None:
        return None
    rows = math.prod(in_shape) // max(1, first.in_features)
    sparse = next((c for c in second.candidates if c.name == "sparse"), None)
    if sparse is None or len(sparse.parts) != 1 or sparse.parts[0].kernel != "sparse" \
            or sparse.parts[0].weight_bits != FP32 or first.out_features != sparse.parts[0].mask.shape[1]:
        return None
    kept = sparse.parts[0].mask.cpu().numpy().astype(bool)
    key = retile_key(first, kept, shared_rows(kept, sparse.parts[0].block[0]), second.activation, rows)
    verdict = recall(cache_dir, key)
    return first.tile if verdict is not None and verdict[0] else None
