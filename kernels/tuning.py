"""Measured choice of the register tiling and loop order for one weight pattern, cached per pattern and machine.

A handful of `TileConfig` candidates are generated, built and timed on the actual shape
with a representative M; the fastest wins and is remembered in the cache folder under a
key of shape, pattern, activation, M bucket, CPU flags and compiler. The segment layout
is a candidate only where rows share panel patterns (`segment_codegen.sharing`).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict

import numpy as np
import torch

from sparta_explore.cache import atomic_write, content_key, resolve_cache_dir
from sparta_explore.kernels.bsr_codegen import TileConfig
from sparta_explore.kernels.build import compiler_version, cpu_flags
from sparta_explore.kernels.segment_codegen import sharing

CANDIDATES = (TileConfig(4, 3, 6), TileConfig(4, 2, 4), TileConfig(2, 3, 6), TileConfig(4, 3, 3), TileConfig(2, 4, 8),
              TileConfig(6, 2, 6), TileConfig(4, 3, 6, panel=True), TileConfig(2, 4, 8, panel=True))
# measured on BERT FFN shapes: 6x2 wins at M=4096 and for 768->3072, 2x4 for 3072->768 at M=128
SEGMENT_CANDIDATES = (TileConfig(6, 2, 6, layout="segments"), TileConfig(2, 4, 8, layout="segments"))
MIN_SHARING = 2.0  # rows per (panel, pattern) below which the segment layout only adds spills
TUNING_VERSION = 7  # 5: scattered rows loop one k at a time; 6: interleaved timing; 7: flat loop for one-k pieces


def candidates(kept: np.ndarray) -> tuple[TileConfig, ...]:
    """The tilings worth timing for this (N, K) bool pattern.

    Example:
        >>> len(candidates(np.ones((64, 64), dtype=bool))) == len(CANDIDATES) + len(SEGMENT_CANDIDATES)
        True
    """
    return CANDIDATES + (SEGMENT_CANDIDATES if sharing(kept) >= MIN_SHARING else ())


def default_tile(kept: np.ndarray, block_rows: int) -> TileConfig:
    """The tiling to use without a search: one-row blocks whose rows share panels (1x32) go segment-major.

    Example:
        >>> default_tile(np.ones((64, 64), dtype=bool), block_rows=1).layout
        'segments'
    """
    if block_rows == 1 and sharing(kept) >= MIN_SHARING:
        return SEGMENT_CANDIDATES[0]
    return TileConfig()


def m_bucket(m: int) -> str:
    """Tilings behave differently for a few rows (threads split the outputs) and for many."""
    return "small" if m <= 512 else "large"


def _time_interleaved(layers: dict, x: torch.Tensor, repeats: int, budget_s: float = 0.02) -> dict:
    """Median time of each layer, candidates taken in turn (machine drift hits all alike).

    Sub-millisecond calls (small M) get more rounds, up to `budget_s` per candidate, so the
    choice is not decided by noise (M=128, 90% unstructured: the old 5 sequential runs kept
    a tiling 1.3x slower than the best).
    """
    if not layers:
        return {}
    first = {cfg: _time(layer, x, 1) for cfg, layer in layers.items()}
    rounds = min(50, max(repeats, int(budget_s / max(min(first.values()), 1e-6))))
    ys = {cfg: torch.empty(x.shape[0], layer.out_features) for cfg, layer in layers.items()}
    times: dict = {cfg: [] for cfg in layers}
    for _ in range(rounds):
        for cfg, layer in layers.items():
            start = time.perf_counter()
            layer._run(x, ys[cfg])
            times[cfg].append(time.perf_counter() - start)
    return {cfg: statistics.median(t) for cfg, t in times.items()}


def _time(layer, x: torch.Tensor, repeats: int) -> float:
    # into one preallocated output: first-touch page faults of fresh outputs would drown the difference
    y = torch.empty(x.shape[0], layer.out_features)
    layer._run(x, y)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        layer._run(x, y)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def search(weight: torch.Tensor, bias: torch.Tensor | None, kept: torch.Tensor, *, block_rows: int, activation: str,
           m: int, cache_dir: str | os.PathLike | None = None, repeats: int = 5) -> TileConfig:
    """The fastest candidate tiling for this pattern at about `m` rows of input (cached).

    Example:
        >>> cfg = search(w, b, kept, block_rows=32, activation="none", m=4096)  # doctest: +SKIP
    """
    from sparta_explore.kernels.sparse_linear import SparseLinear  # the module under test builds through us

    kept_np = kept.cpu().numpy().astype(bool)
    pattern = hashlib.sha256(kept_np.tobytes()).hexdigest()[:16]
    key = content_key({"shape": list(kept.shape), "pattern": pattern, "block_rows": block_rows, "act": activation,
                       "bucket": m_bucket(m), "cpu": sorted(cpu_flags()), "cc": compiler_version(),
                       "threads": torch.get_num_threads(), "version": TUNING_VERSION})
    path = resolve_cache_dir(cache_dir, "tuning") / f"{key}.json"
    if path.exists():
        try:
            return TileConfig(**json.loads(path.read_text())["best"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a torn or foreign cache entry: search again and overwrite it
    x = torch.randn(min(m, 2048), kept.shape[1], generator=torch.Generator().manual_seed(0))
    layers = {}
    for cfg in candidates(kept_np):
        layer = SparseLinear(weight, bias, kept, block_rows=block_rows, activation=activation, cache_dir=cache_dir,
                             tile=cfg, check=False)
        if layer.fallback_reason is None:
            layers[cfg] = layer
    timings = _time_interleaved(layers, x, repeats)
    best = min(timings, key=timings.get) if timings else TileConfig()
    record = {"best": asdict(best), "seconds": {str(asdict(c)): t for c, t in timings.items()}}
    atomic_write(path, lambda f: f.write(json.dumps(record).encode()))
    return best
