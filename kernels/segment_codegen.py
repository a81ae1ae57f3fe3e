"""Segment-major fp32 sparse linear kernels: per K panel, rows with the same kept k's share a tile.

The "rows" layout (bsr_codegen) groups *consecutive* rows that share a pattern, which only
block rows do. Under 1x32 blocks every row has its own pattern, so each row is a group of
one and every FMA needs a fresh x vector (load-bound, about half of peak). This layout
cuts K into panels (32 or 64 k, the pattern's own granularity) and, inside each row chunk
and panel, buckets the rows by their exact kept k's in that panel: any rows of a bucket
form a register tile, so a 1x32 pattern runs like 32x32 blocks (x vectors reused by R rows,
the panel of X in L1). The price: accumulators go through the tile's output buffer once per
panel entry (2 R V memory operations per 32 R V FMAs), and rows start from their bias.

Exact for every pattern; it pays where rows share panel patterns (`sharing` >= 2), which
the measured tile search checks before offering it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparta_explore.kernels.bsr_codegen import (
    _ACTIVATIONS,
    CHUNKS,
    ROWS_IO,
    KernelIO,
    TileConfig,
    fp32_driver,
    fp32_source,
    shape_tables,
)
from sparta_explore.kernels.groups import runs
from sparta_explore.kernels.panels import bucketed
from sparta_explore.kernels.pattern_data import KernelSource, PatternTables


def _segments(kept_cols: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous runs of True in a 1-D bool array, as (start, length)."""
    _, start, length = runs(kept_cols[None, :])
    return list(zip(start.tolist(), length.tolist()))


@dataclass(frozen=True)
class SegmentPlan:
    """Entries (a bucket's rows over one panel) in order panel -> chunk -> bucket."""

    panel: int            # k per panel
    max_rows: int         # rows per entry at most (register tile height)
    chunk_n: np.ndarray   # chunk c owns output rows chunk_n[c]:chunk_n[c + 1]
    e_ptr: np.ndarray     # [p * (chunks + 1) + c]: first entry of panel p in chunk c or later
    e_rows: np.ndarray    # (entries, max_rows) output rows, padded with the entry's first row
    e_nrows: np.ndarray   # rows in each entry
    e_piece: np.ndarray   # entry e's pieces are e_piece[e]:e_piece[e + 1]
    p_k0: np.ndarray      # first k of each piece
    p_len: np.ndarray     # k count of each piece
    e_woff: np.ndarray    # offset of entry e's packed weights


def panel_width(kept: np.ndarray) -> int:
    """64 when every pattern edge falls on a multiple of 64 (1x64, 32x64, 64x64 blocks), else 32.

    Example:
        >>> panel_width(np.repeat(np.eye(4, dtype=bool), 64, axis=1))
        64
    """
    edges = np.flatnonzero((kept[:, 1:] != kept[:, :-1]).any(axis=0)) + 1
    return 64 if not len(edges) or int(np.gcd.reduce(edges)) % 64 == 0 else 32


def sharing(kept: np.ndarray, panel: int | None = None) -> float:
    """Mean number of rows per distinct (panel, kept-k pattern): how many rows a tile can share.

    Example:
        >>> sharing(np.ones((8, 64), dtype=bool))
        8.0
    """
    if not kept.size:
        return 0.0
    # rows per distinct non-zero key of a (row, panel), all panels at once
    _, keys = _panel_keys(kept, panel or panel_width(kept))
    keys = np.sort(keys, axis=0)
    live = keys != np.zeros(1, dtype=keys.dtype)
    pairs = int(live.sum())
    distinct = int(live[:1].sum()) + int(((keys[1:] != keys[:-1]) & live[1:]).sum())
    return pairs / distinct if distinct else 0.0


def row_chunks(kept: np.ndarray, chunks: int = CHUNKS) -> np.ndarray:
    """`chunks` + 1 row bounds, multiples of 8 (whole 8x8 transposes when unpacking), balanced by kept work."""
    n = kept.shape[0]
    work = kept.sum(axis=1).cumsum()
    total = float(work[-1]) if n else 0.0
    bounds = [0]
    for c in range(1, chunks):
        row = int(np.searchsorted(work, total * c / chunks))
        bounds.append(min(n, max(bounds[-1], -(-row // 8) * 8)))
    bounds.append(n)
    return np.asarray(bounds, dtype=np.int64)


def _panel_keys(kept: np.ndarray, panel: int) -> tuple[np.ndarray, np.ndarray]:
    """(bits, keys): `kept` padded to whole panels as (rows, panels, panel) bools, and each (row, panel)'s bits as
    one key: an unsigned integer ordered like the bytes `np.packbits` makes of them (big-endian) where those bytes
    make one (sorting integers was 10x faster than bytes, a third of a second of planning BERT-base), else the
    bytes themselves."""
    n, k = kept.shape
    width = -(-k // panel) * panel
    if width == k:  # whole panels: a view of the mask, no padded copy
        bits = np.ascontiguousarray(kept, dtype=bool).reshape(n, width // panel, panel)
    else:
        bits = np.zeros((n, width), dtype=bool)
        bits[:, :k] = kept
        bits = bits.reshape(n, width // panel, panel)
    packed = np.ascontiguousarray(np.packbits(bits, axis=2))
    size = packed.shape[2]
    if size not in (1, 2, 4, 8):
        return bits, packed.view(np.dtype((np.void, size))).reshape(n, width // panel)
    return bits, packed.view(np.dtype(f">u{size}")).reshape(n, width // panel).astype(np.uint64)


def plan_segments(kept: np.ndarray, max_rows: int, panel: int | None = None) -> SegmentPlan:
    """Bucket every chunk's rows per panel by their kept k's there; cut buckets into entries.

    Array code over every (row, panel) at once: entries sort by panel, chunk, the panel's
    bit pattern (as bytes) and row, so a bucket's rows are consecutive and in row order; a
    Python loop per panel and chunk was most of a BERT-base 32x32 layer's kernel build.

    Example:
        >>> kept = np.zeros((4, 64), dtype=bool); kept[[0, 2], :32] = True; kept[1, 32:] = True
        >>> p = plan_segments(kept, max_rows=4)
        >>> p.e_nrows.tolist(), p.p_k0.tolist()
        ([2, 1], [0, 32])
    """
    if panel is None:
        panel = panel_width(kept)
    if panel not in (32, 64):
        raise ValueError(f"segment panels are 32 or 64 k wide, got {panel}")
    chunk_n = row_chunks(kept)
    chunks = len(chunk_n) - 1
    bits, keys = _panel_keys(kept, panel)
    n_panels = bits.shape[1]
    row, pan = np.nonzero(keys)  # live (row, panel) pairs
    chunk = np.searchsorted(chunk_n, row, side="right") - 1
    key = keys[row, pan]
    order = np.lexsort((row, key, chunk, pan))
    row, pan, chunk, key = row[order], pan[order], chunk[order], key[order]
    # buckets: runs of one (panel, chunk, pattern); entries: a bucket cut every max_rows rows
    new_bucket = np.ones(len(row), dtype=bool)
    new_bucket[1:] = (pan[1:] != pan[:-1]) | (chunk[1:] != chunk[:-1]) | (key[1:] != key[:-1])
    bucket_start = np.maximum.accumulate(np.where(new_bucket, np.arange(len(row)), 0))
    first = (np.arange(len(row)) - bucket_start) % max_rows == 0
    starts = np.flatnonzero(first)
    nrows = np.diff(np.append(starts, len(row)))
    slot = np.arange(max_rows)[None, :]
    e_rows = row[starts[:, None] + np.where(slot < nrows[:, None], slot, 0)]  # short entries repeat their first row
    e_pan, e_chunk = pan[starts], chunk[starts]
    e_ptr = np.searchsorted(e_pan * chunks + e_chunk, np.arange(n_panels * (chunks + 1)) // (chunks + 1) * chunks
                            + np.arange(n_panels * (chunks + 1)) % (chunks + 1))
    # pieces: the runs of each entry's panel pattern (its first row's bits there)
    owner, k0, length = runs(bits[e_rows[:, 0], e_pan]) if len(starts) else (np.zeros(0, np.int64),) * 3
    e_piece = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=len(starts)), out=e_piece[1:])
    span = np.bincount(owner, weights=length, minlength=len(starts)).astype(np.int64)
    e_woff = np.zeros(len(starts), dtype=np.int64)
    np.cumsum((span * nrows)[:-1], out=e_woff[1:])
    as_i = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return SegmentPlan(panel, max_rows, chunk_n, as_i(e_ptr), as_i(e_rows).reshape(-1, max_rows), as_i(nrows),
                       e_piece, as_i(e_pan[owner] * panel + k0), as_i(length), e_woff)


def pack_segment_weights(weight: np.ndarray, kept: np.ndarray, plan: SegmentPlan) -> np.ndarray:
    """Kept weights in kernel order: per entry, per piece, per k, the entry's rows.

    Example:
        >>> kept = np.ones((2, 32), dtype=bool)
        >>> pack_segment_weights(np.arange(64.0).reshape(2, 32), kept, plan_segments(kept, 2))[:4].tolist()
        [0.0, 32.0, 1.0, 33.0]
    """
    if not len(plan.e_nrows):
        return np.zeros(1, dtype=np.float32)
    # every k of every piece, with its entry; then every row of the entry for each
    piece_owner = np.repeat(np.arange(len(plan.e_nrows)), np.diff(plan.e_piece))
    k_piece = np.repeat(np.arange(len(plan.p_len)), plan.p_len)
    k = plan.p_k0[k_piece] + np.arange(len(k_piece)) - np.repeat(np.cumsum(plan.p_len) - plan.p_len, plan.p_len)
    k_entry = piece_owner[k_piece]
    reps = plan.e_nrows[k_entry]
    slot_k = np.repeat(k, reps)
    slot_i = np.arange(len(slot_k)) - np.repeat(np.cumsum(reps) - reps, reps)
    slot_row = plan.e_rows[np.repeat(k_entry, reps), slot_i]
    return np.where(kept[slot_row, slot_k], weight[slot_row, slot_k], 0.0).astype(np.float32)


def _tile_function(r: int, v: int) -> str:
    """r scattered rows x v vectors of M over one entry: load the partial sums, accumulate, store."""
    rows = " ".join(f"float *y{i} = yb + rw[{i}] * TILE + t;" for i in range(r))
    acc = " ".join(f"vf a{i}{j} = LD(y{i} + {j} * VEC);" for i in range(r) for j in range(v))
    loads = " ".join(f"const vf x{j} = LD(x + {j} * VEC);" for j in range(v))
    fmas = " ".join(f"a{i}{j} += w[{i}] * x{j};" for i in range(r) for j in range(v))
    stores = " ".join(f"ST(y{i} + {j} * VEC, a{i}{j});" for i in range(r) for j in range(v))
    return f"""
static inline void stile{r}(const float *xb, float *yb, long t, long e, const float *W,
                          const struct pattern *restrict P) {{
    (void)P;
    const long *rw = E_ROWS + e * R_ROWS;
    {rows}
    {acc}
    const float *w = W + E_WOFF[e];
    for (long p = E_PIECE[e]; p < E_PIECE[e + 1]; ++p) {{
        const float *x = xb + P_K0[p] * TILE + t;
        for (long k = P_LEN[p]; k > 0; --k, x += TILE, w += {r}) {{
            {loads}
            {fmas}
        }}
    }}
    {stores}
}}
"""


def generate_segment_source(plan: SegmentPlan, n_out: int, n_in: int, vec: int, act: str, name: str,
                            cfg: TileConfig, io: KernelIO = ROWS_IO, as_data: bool = False) -> KernelSource:
    """C source of `void {name}(X, Y, M, W, bias, P)` for the segment layout (same call as the rows layout).

    Rows start at their bias in the tile buffer, entries add their panels, the activation
    runs over the rows, and they are transposed into Y. When K <= N this goes chunk by chunk
    (a chunk's rows stay in cache while X panels stream); when K > N, panel by panel over all
    chunks of the item (the larger packed X is read once).
    """
    if act not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {act!r}")
    if io.one_word:
        raise ValueError("the segment layout reads runs of k: it cannot run a one-k-per-piece kernel I/O")
    if plan.max_rows > cfg.rows:
        raise ValueError(f"plan has {plan.max_rows} rows per entry, the tile {cfg.rows}")
    n_panels = len(plan.e_ptr) // len(plan.chunk_n)
    # with the pattern as data, the panel loop's literal count is bucketed: one library serves every K of a bucket
    e_ptr, n_panels = bucketed(plan.e_ptr, n_panels, len(plan.chunk_n)) if as_data else (plan.e_ptr, n_panels)
    tables = (PatternTables().scalar("N_CHUNKS", len(plan.chunk_n) - 1).array("C_N", plan.chunk_n)
              .array("E_PTR", e_ptr).array("E_ROWS", plan.e_rows.reshape(-1)).array("E_NR", plan.e_nrows)
              .array("E_PIECE", plan.e_piece).array("P_K0", plan.p_k0).array("P_LEN", plan.p_len)
              .array("E_WOFF", plan.e_woff))
    calls = {r: " ".join(f"stile{r}(xt, yb, {j} * {cfg.vectors_for(r)} * VEC, e, W, P);"
                         for j in range(cfg.tile_vectors // cfg.vectors_for(r))) for r in range(1, plan.max_rows + 1)}
    dispatch = "\n".join(f"                            case {r}: {call} break;" for r, call in calls.items())
    shape = shape_tables(io, as_data, n_in, n_out)
    tables = shape + tables
    act_rows = "" if act == "none" else f"""
                for (long n = C_N[c]; n < C_N[c + 1]; ++n)
                    for (long t = 0; t < TILE; t += VEC) {{ vf v = LD(yb + n * TILE + t); {_ACTIVATIONS[act]}
                        ST(yb + n * TILE + t, v); }}"""
    start = """
                for (long n = C_N[c]; n < C_N[c + 1]; ++n) {  /* every row starts at its bias */
                    const vf b = zero + bias_of(bias, n);
                    for (long t = 0; t < TILE; t += VEC) ST(yb + n * TILE + t, b);
                }"""
    finish = f"""{act_rows}
                if (Y) unpack_tile(yb, Y, m0, mt, C_N[c], C_N[c + 1], P);  /* NULL: fused, yb read */"""

    def entries(first: str, last: str) -> str:
        return f"""
                for (long p = 0; p < {n_panels}; ++p)
                    for (long e = E_PTR[p * (N_CHUNKS + 1) + {first}]; e < E_PTR[p * (N_CHUNKS + 1) + {last}]; ++e)
                        switch (E_NR[e]) {{
{dispatch}
                        }}"""
    if n_in > n_out:  # the packed X tile outgrows the output buffer: stream X once, keep all rows' sums
        body = f"""            for (long c = c0; c < c1; ++c) {{{start}
            }}
            {{{entries("c0", "c1")}
            }}
            for (long c = c0; c < c1; ++c) {{{finish}
            }}
"""
    else:  # chunk by chunk: the chunk's rows of the output buffer stay in L2 while X panels stream
        body = f"""            for (long c = c0; c < c1; ++c) {{{start}{entries("c", "c + 1")}{finish}
            }}
"""
    tiles = "".join(_tile_function(r, cfg.vectors_for(r)) for r in range(1, plan.max_rows + 1))
    text = fp32_source(vec, cfg, n_in, n_out, tables.c(as_data) + tiles, fp32_driver(name, body),
                       f"#define R_ROWS {plan.max_rows}L\n", io, shape_in_tables=bool(shape.scalars))
    return KernelSource(text, tables, as_data)
