"""Measured choice of the register tiling and loop order for a class of weight patterns, cached per machine.

A handful of `TileConfig` candidates are generated, built and timed on the actual shape
with a representative M; the fastest wins and is remembered in the cache folder under a
key of shape (to half an octave), *pattern class* (`pattern_class`: block height, density, run length and row
sharing, not the exact mask), activation, M bucket, CPU flags and compiler. The twelve
layers of a model pruned alike, and every trial of a search, share one search: the tiling
follows the pattern's statistics, and timing every new mask cost most of a compile (BERT-base,
72 linears: 38 of 98 s). The segment layout is a candidate only where rows share panel
patterns (`segment_codegen.sharing`). The search that builds `SparseLinear` candidates is
`sparse_linear.search`: it hands its builder to `search_tiles` here, so this module never
imports the layer that calls it.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sparta_explore.cache import atomic_write, content_key, resolve_cache_dir
from sparta_explore.kernels.bsr_codegen import TileConfig
from sparta_explore.kernels.build import compiler_version, cpu_flags, vector_width
from sparta_explore.kernels.segment_codegen import sharing

CANDIDATES = (TileConfig(4, 3, 6), TileConfig(4, 2, 4), TileConfig(2, 3, 6), TileConfig(4, 3, 3), TileConfig(2, 4, 8),
              TileConfig(6, 2, 6), TileConfig(4, 3, 6, panel=True), TileConfig(2, 4, 8, panel=True))
# measured on BERT FFN shapes: 6x2 wins at M=4096 and for 768->3072, 2x4 for 3072->768 at M=128
# segment-major (rows sharing panels, e.g. 1x32): 6x2x6 for many rows, 6x2x2 (an M tile of 2 vectors) for few. Zen 4,
# 1x32 at 90%, 768 <-> 3072: at M = 128 6x2x2 took 0.42 / 0.49 ms against 0.55 / 0.55 for the searches' picks (AVX2
# builds 0.43 / 0.51 against 0.59 / 0.88), at M = 4096 level with 6x2x6 (AVX2: 1.08-1.18x it); 2x4x8, the second
# candidate before, was never the fastest there (up to 1.85x the best)
SEGMENT_CANDIDATES = (TileConfig(6, 2, 6, layout="segments"), TileConfig(6, 2, 2, layout="segments"))
MIN_SHARING = 2.0  # rows per (panel, pattern) below which the segment layout only adds spills
TUNING_VERSION = 20  # 10: long runs and sharing capped; 11: shapes to half an octave; 12: split flat-loop sums;
# 13: 16-float kernels pack X and unpack Y in 8 x 8 register blocks; 14: K panels fill L1, scattered sets per width;
# 15: K-panel tilings on 16 floats apply their activation as a pass over rows; 16: one-word segments below 8 words;
# 17: tall blocks on 8-row (AVX2: 6-row) tiles of 2 vectors, segments' 6x2x2 for few rows
# 18: fp32 K panels of 48 KiB or more (`panels.fp32_budget`); 19: scattered one-row entries read (offset, weight)
# words (`word_pairs`), work items handed to threads one at a time (`schedule(dynamic, 1)`); 20: kernels whose entries
# are all such rows walk them from header words (`entry_stream`)


# Blocks of 8 rows or more, per vector width. Zen 5, the old set (8x8 .. 32x32 at 90%, BERT shapes, with and
# without GELU): 4x3x3 won for few rows on AVX-512, 6x2x6 otherwise, of 10 tilings none with 8 rows or an M tile of
# 2 vectors. Zen 4 (2 threads, 8x8 and 32x32 at 90%, 768 <-> 3072, M 1 to 4096): 8 rows over an M tile of 2 vectors
# (`single_vectors` 2: the M tile is the lcm of both counts) ran 1.4-1.8x faster than 4x3x3 at M = 16 to 512 (32x32
# 768->3072 at M = 128: 0.35 against 0.52 ms; 128 rows are 2.7 tiles of 48 but 4 of 32), level with 6x2x6 at 4096;
# 8x2x4 beat it at M = 48 and 4096 once each, but a third candidate cost 1.7 s of an empty-cache BERT-base compile
# (tile search 4.4 -> 6.1 s). On 8 floats (AVX2 builds, 16 registers) 6x2x2 was the fastest at
# every M (M = 128: 0.48 / 0.34 against 0.56 / 0.48 ms for 6x2x6; 8-row tiles spill). The first is `default_tile`.
BLOCK_ROWS_NARROW = 8
BLOCK_CANDIDATES = {
    16: (TileConfig(8, 2, 2), TileConfig(6, 2, 6)),
    8: (TileConfig(6, 2, 2), TileConfig(6, 2, 6)),
}
# Scattered one-row patterns (unstructured, `scattered`), per vector width. 8 floats (AVX2): 72 searches over 5%,
# 10% and 25% kept, BERT shapes 768 and 3072 square and FFN, with and without GELU, M 128 and 2048: these 4 held the
# best of all 8 in 65 (ties counted), within 4% of it in the other 7; 2x4x8 wins for many rows, its K-panel form at
# 25% kept. 16 floats (AVX-512), since panels fill L1 (`panels.l1_budget`; 16 searches of 7 tilings at 10% and 25%
# kept, those shapes, M 128 and 2048, Zen 5): 4x2x4 wins for few rows at 10%, the panel forms of 4x2x2, 4x3x3 and
# 2x4x8 otherwise; these 4 held the best within 2% in all 16 (the 8-float set within 5%; its 4x3x3 without panels,
# the old default for many rows, was 1.02-1.26x the best at M 2048).
SCATTERED_CANDIDATES = {
    8: (TileConfig(4, 2, 4), TileConfig(4, 3, 3), TileConfig(2, 4, 8), TileConfig(2, 4, 8, panel=True)),
    16: (TileConfig(4, 2, 4), TileConfig(4, 3, 3, panel=True), TileConfig(4, 2, 2, panel=True),
         TileConfig(2, 4, 8, panel=True)),
}


def block_candidates() -> tuple[TileConfig, ...]:
    """The tilings timed for blocks of `BLOCK_ROWS_NARROW` rows or more on this CPU's vector width (the first:
    the default).

    Example:
        >>> block_candidates()[0].vectors
        2
    """
    return BLOCK_CANDIDATES[vector_width()]


def scattered_candidates() -> tuple[TileConfig, ...]:
    """The tilings timed for scattered patterns on this CPU's vector width (the first: the default for few rows).

    Example:
        >>> scattered_candidates()[0]
        TileConfig(rows=4, vectors=2, single_vectors=4, panel=False, layout='rows')
    """
    return SCATTERED_CANDIDATES[vector_width()]


SCATTERED_RUN = 2.0  # kept runs along k shorter than this on average: scattered (1.1 at 90% unstructured, 1.33 at 75%)


def mean_run(kept: np.ndarray) -> float:
    """The mean length of the runs of kept weights along k (0 with none kept).

    Example:
        >>> mean_run(np.array([[1, 1, 0, 1], [0, 0, 0, 0]], dtype=bool))
        1.5
    """
    kept = np.asarray(kept, dtype=bool)
    total = int(np.count_nonzero(kept))  # not `sum`: a bool sum converts (0.4 ms a BERT mask, count 0.08)
    starts = total - int(np.count_nonzero(kept[:, 1:] & kept[:, :-1]))
    return total / starts if starts else 0.0


def scattered(kept: np.ndarray, block_rows: int, shared: float | None = None) -> bool:
    """Whether `kept` is one-row blocks in short runs, rows sharing no panel pattern: unstructured pruning
    (`shared`: `segment_codegen.sharing(kept)`, when known).

    Example:
        >>> scattered(np.eye(64, dtype=bool), 1), scattered(np.ones((64, 64), dtype=bool), 1)
        (True, False)
    """
    if block_rows != 1:
        return False
    return mean_run(kept) < SCATTERED_RUN and (sharing(kept) if shared is None else shared) < MIN_SHARING


def candidates(kept: np.ndarray, block_rows: int = 1) -> tuple[TileConfig, ...]:
    """The tilings worth timing for this (N, K) bool pattern of `block_rows`-row blocks.

    Example:
        >>> len(candidates(np.ones((64, 64), dtype=bool))) == len(CANDIDATES) + len(SEGMENT_CANDIDATES)
        True
        >>> candidates(np.eye(64, dtype=bool)) == scattered_candidates()
        True
        >>> candidates(np.ones((64, 64), dtype=bool), block_rows=32)[:2] == block_candidates()[:2]
        True
    """
    share = sharing(kept)
    shared = share >= MIN_SHARING
    if block_rows >= BLOCK_ROWS_NARROW:
        return block_candidates() + (SEGMENT_CANDIDATES[:1] if shared else ())
    if scattered(kept, block_rows, share):
        return scattered_candidates()
    return CANDIDATES + (SEGMENT_CANDIDATES if shared else ())


def default_tile(kept: np.ndarray, block_rows: int, m: int | None = None) -> TileConfig:
    """The tiling to use without a search, for about `m` rows of input (None: unknown, taken as few).

    One-row blocks whose rows share panels (1x32) go segment-major (6x2x2 for few rows, else 6x2x6). Blocks of
    `BLOCK_ROWS_NARROW` rows or more take the first of `block_candidates()` at any M: 8 rows over M tiles of 2
    vectors (6 rows on 8 floats), 1.4-1.8x faster than 4x3x3 for few rows and level with 6x2x6 for many (Zen 4, see
    `BLOCK_CANDIDATES`).
    Scattered patterns (unstructured) take 4x3x3 in L1-sized K panels for many rows on 16-float
    vectors (10% kept, BERT FFN shapes, Zen 5: 0.90-0.95x the time of 4x3x3 without panels at M = 1024 and 4096,
    within 1.03x of 4x2x2 in panels, which wins at M = 1024), else 4x2x4 (at 5-10% kept within 1.03x of the best at
    AVX-512 and 1.12x at AVX2 but once; 4x3x6 was up to 2.1x).

    Example:
        >>> default_tile(np.ones((64, 64), dtype=bool), block_rows=1).layout
        'segments'
        >>> default_tile(np.ones((64, 64), dtype=bool), block_rows=32, m=4096) == block_candidates()[0]
        True
    """
    few = m is None or m_bucket(m) == "small"
    if block_rows >= BLOCK_ROWS_NARROW:
        return block_candidates()[0]
    if block_rows != 1:
        return TileConfig()
    share = sharing(kept)  # one-row blocks only: a pass over the mask
    if share >= MIN_SHARING:
        return SEGMENT_CANDIDATES[1] if few else SEGMENT_CANDIDATES[0]
    if scattered(kept, block_rows, share):
        offered = scattered_candidates()
        return offered[1] if not few and vector_width() == 16 else offered[0]
    return TileConfig()


CLASS_CAP = 16.0  # run lengths and row sharing past this are all "long" (see `pattern_class`)


def pattern_class(kept: np.ndarray, block_rows: int) -> dict:
    """What decides a pattern's best tiling, coarse enough that masks pruned alike share it.

    Density to 5% (a 90% mask of BERT-base's 2304 32x32 tiles keeps 9.4-10.6% of them), the mean
    length of kept runs along k (1.1 unstructured at 90%, 32+ for 1x32 blocks) and rows sharing a
    panel pattern (`segment_codegen.sharing`), both to half an octave: masks drawn alike land in
    one class (layers of one BERT-base pruned at 90%: 1x32 sharing 300-330 rows). Both stop at
    `CLASS_CAP`: past it a tile's rows and runs are long whatever they are (32x32 sharing: 64-90).

    Example:
        >>> pattern_class(np.ones((4, 8), dtype=bool), 4)
        {'block_rows': 4, 'density': 1.0, 'run': 8.0, 'sharing': 4.0}
    """
    run = mean_run(kept)
    share = sharing(kept)
    density = np.count_nonzero(kept) / kept.size if kept.size else 0.0  # `mean` of bools: 10x as long, same value
    return {"block_rows": int(block_rows), "density": round(float(density) * 20) / 20,
            "run": _half_octave(min(run, CLASS_CAP)), "sharing": _half_octave(min(share, CLASS_CAP))}


def _half_octave(value: float) -> float:
    return round(2.0 ** (round(2 * math.log2(value)) / 2), 2) if value > 0 else 0.0


def m_bucket(m: int) -> str:
    """Tilings behave differently for a few rows (threads split the outputs) and for many."""
    return "small" if m <= 512 else "large"


KEEP_WITHIN = 1.25  # after DROP_AFTER rounds, a tiling slower than this times the best median is timed no further
DROP_AFTER = 3


def _time_interleaved(layers: dict, x: torch.Tensor, repeats: int, budget_s: float = 0.02) -> dict:
    """Median time of each layer, candidates taken in turn (machine drift hits all alike).

    Sub-millisecond calls (small M) get more rounds, up to `budget_s` per candidate, so the
    choice is not decided by noise (M=128, 90% unstructured: the old 5 sequential runs kept
    a tiling 1.3x slower than the best). After `DROP_AFTER` rounds only the tilings within
    `KEEP_WITHIN` of the best median go on (their medians keep their first rounds): the rounds
    left decide between close ones, and the far ones were most of a search's timing.
    """
    if not layers:
        return {}
    first = {cfg: _time(layer, x, 1) for cfg, layer in layers.items()}
    rounds = min(50, max(repeats, int(budget_s / max(min(first.values()), 1e-6))))
    ys = {cfg: torch.empty(x.shape[0], layer.out_features) for cfg, layer in layers.items()}
    times: dict = {cfg: [] for cfg in layers}
    racing = list(layers)
    for done in range(1, rounds + 1):
        for cfg in racing:
            start = time.perf_counter()
            layers[cfg]._run(x, ys[cfg])
            times[cfg].append(time.perf_counter() - start)
        if done == DROP_AFTER:
            best = min(statistics.median(times[cfg]) for cfg in racing)
            racing = [cfg for cfg in racing if statistics.median(times[cfg]) <= KEEP_WITHIN * best]
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


def shape_and_pattern(kept: np.ndarray, block_rows: int) -> dict:
    """The (N, K) shape to half an octave and the `pattern_class`: what the masks sharing one tile search share.

    Shapes to half an octave: a shrink pass leaves every layer its own (3072 -> 2749, 2806, ...) and the best
    tiling does not move with a few rows.

    Example:
        >>> shape_and_pattern(np.ones((3000, 768), dtype=bool), 1)["shape"]
        [2896.31, 724.08]
    """
    return {"shape": [_half_octave(d) for d in kept.shape], "pattern": pattern_class(kept, block_rows)}


def _record_path(kept: np.ndarray, block_rows: int, activation: str, m: int,
                 cache_dir: str | os.PathLike | None) -> Path:
    key = content_key({**shape_and_pattern(kept, block_rows), "act": activation,
                       "bucket": m_bucket(m), "cpu": sorted(cpu_flags()), "cc": compiler_version(),
                       "threads": torch.get_num_threads(), "version": TUNING_VERSION})
    return resolve_cache_dir(cache_dir, "tuning") / f"{key}.json"


def _read(path: Path) -> TileConfig | None:
    if not path.exists():
        return None
    try:
        return TileConfig(**json.loads(path.read_text())["best"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a torn or foreign cache entry: search again and overwrite it


def searched(kept: np.ndarray, block_rows: int, activation: str, m: int,
             cache_dir: str | os.PathLike | None = None) -> TileConfig | None:
    """The tiling a search already found for this pattern's class (`search`'s cache), or None: nothing is timed.

    Example:
        >>> import tempfile
        >>> searched(np.ones((4, 4), dtype=bool), 4, "none", 64, cache_dir=tempfile.mkdtemp()) is None
        True
    """
    return _read(_record_path(kept, block_rows, activation, m, cache_dir))


def search_tiles(kept: torch.Tensor, make: Callable[[TileConfig], Any], *, block_rows: int, activation: str, m: int,
                 cache_dir: str | os.PathLike | None = None, repeats: int = 5) -> TileConfig:
    """The fastest candidate tiling for this pattern's class at about `m` rows of input, each built by `make` (cached).

    `make(cfg)` builds the layer to time with tiling `cfg` (its `fallback_reason` None when its kernel works):
    `sparse_linear.search` passes a `SparseLinear` builder, so this module never imports the layer that calls it.

    Example:
        >>> cfg = search_tiles(kept, lambda cfg: SparseLinear(w, b, kept, tile=cfg), block_rows=32,
        ...                    activation="none", m=4096)  # doctest: +SKIP
    """
    kept_np = kept.cpu().numpy().astype(bool)
    path = _record_path(kept_np, block_rows, activation, m, cache_dir)
    found = _read(path)
    if found is not None:
        return found
    x = torch.randn(min(m, 2048), kept.shape[1], generator=torch.Generator().manual_seed(0))
    offered = candidates(kept_np, block_rows)
    # built side by side: each is mostly a gcc process (the codegen is array code), so the cores share them
    with ThreadPoolExecutor(max_workers=max(1, min(len(offered), os.cpu_count() or 1))) as pool:
        built = list(pool.map(make, offered))
    layers = {cfg: layer for cfg, layer in zip(offered, built) if layer.fallback_reason is None}
    timings = _time_interleaved(layers, x, repeats)
    best = min(timings, key=timings.get) if timings else TileConfig()
    record = {"best": asdict(best), "seconds": {str(asdict(c)): t for c, t in timings.items()}}
    atomic_write(path, lambda f: f.write(json.dumps(record).encode()))
    return best
