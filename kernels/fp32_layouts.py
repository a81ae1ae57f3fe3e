"""The fp32 kernel's two loop orders (`TileConfig.layout`): a pattern -> its C source and packed weights.

"rows" groups a block row's rows in registers (`bsr_codegen`), "segments" buckets rows by
their kept k's per K panel (`segment_codegen`); `SparseLinear` picks by its tile.

Example:
    >>> from sparta_explore.kernels.bsr_codegen import ROWS_IO
    >>> src, packed = FP32_LAYOUTS["rows"](np.ones((4, 8), np.float32), np.ones((4, 8), bool), 4, TileConfig(), 8,
    ...                                   "none", "k", ROWS_IO, True)
    >>> src.as_data, packed.size
    (True, 32)
"""

from __future__ import annotations

import math

import numpy as np

from sparta_explore.kernels.bsr_codegen import KernelIO, TileConfig, generate_source
from sparta_explore.kernels.groups import SHORT_SEGMENTS, pack_weights, plan_groups, unit_segments
from sparta_explore.kernels.pattern_data import KernelSource
from sparta_explore.kernels.scattered import scattered_groups
from sparta_explore.kernels.segment_codegen import generate_segment_source, pack_segment_weights, plan_segments


def _rows_layout(weight: np.ndarray, kept: np.ndarray, block_rows: int, cfg: TileConfig, vec: int, act: str,
                 name: str, io: KernelIO, as_data: bool) -> tuple[KernelSource, np.ndarray]:
    # scattered rows: a predictable loop; an I/O whose k rows are not evenly spaced reads one k per piece
    short = math.inf if io.one_word else SHORT_SEGMENTS
    groups = scattered_groups(kept, short) if block_rows == 1 else None  # unstructured: one pass (same groups)
    if groups is None:
        groups = unit_segments(plan_groups(kept, block_rows, cfg.rows), 1, short)
    source = generate_source(groups, kept.shape[0], kept.shape[1], vec, act, name, cfg, io, as_data=as_data)
    packed = pack_weights(weight, kept, groups)
    return source, source.kernel_words(packed)


def _segments_layout(weight: np.ndarray, kept: np.ndarray, block_rows: int, cfg: TileConfig, vec: int, act: str,
                     name: str, io: KernelIO, as_data: bool) -> tuple[KernelSource, np.ndarray]:
    plan = plan_segments(kept, cfg.rows)
    source = generate_segment_source(plan, kept.shape[0], kept.shape[1], vec, act, name, cfg, io, as_data=as_data)
    return source, pack_segment_weights(weight, kept, plan)


# TileConfig.layout -> (C source, packed weights) of the fp32 kernel
FP32_LAYOUTS = {"rows": _rows_layout, "segments": _segments_layout}
