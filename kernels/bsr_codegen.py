"""C source generation for pattern-specialized sparse fp32 linear kernels.

The kernel computes Y^T = W X^T with activations K-major (X^T is K x M) so that the
vector dimension is M: every kept weight w[n, k] is one broadcast-FMA of a row of X^T.
Outputs are processed in *row groups* (up to R rows that share a k pattern: the rows of
one block row), and each group's kept k indices are merged into contiguous segments.
The group and segment tables are baked into the source as constant arrays (the paper's
*dismantle*: empty blocks do not exist in the code, there is no per-element test), and
the kept weights are packed group by group, R values per k, in the order the kernel reads.

The source uses GCC vector extensions, so the same text compiles to AVX2 (8 lanes) or
AVX-512 (16 lanes) with -march=native; register tile: R rows x V vectors of M.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sparta_explore.activations import ACTIVATIONS
from sparta_explore.kernels.act_rows import PRELUDE as _PRELUDE
from sparta_explore.kernels.act_rows import act_rows
from sparta_explore.kernels.c_templates import c_fill, c_text
from sparta_explore.kernels.entry_stream import HIGH_FLOAT, headed, paired_loop, stream_function, stream_walk
from sparta_explore.kernels.groups import R_MAX, Groups
from sparta_explore.kernels.kernel_io import KernelIO
from sparta_explore.kernels.panels import (
    ONE_WORD,
    Panels,
    bucketed,
    by_length,
    cache_bytes,
    cut_panels,
    fp32_budget,
    panel_rows,
)
from sparta_explore.kernels.pattern_data import KernelSource, PatternTables
from sparta_explore.kernels.scattered import is_scattered, scattered_panels
from sparta_explore.kernels.word_pairs import pair_offsets

V = 3  # vectors of M per register tile (default)
LAYOUTS = ("rows", "segments")


@dataclass(frozen=True)
class TileConfig:
    """Register tiling of the generated kernel, chosen by `sparse_linear.search` or left at the default.

    `rows`: output rows per group (register tile height); `vectors`: vectors of M per tile
    for multi-row groups; `single_vectors`: for one-row groups, which are load-bound and
    want more. The M tile is their least common multiple, in vectors. `panel` processes K in
    L1-sized panels (see panels.py). `layout` is the loop order: "rows" groups consecutive
    rows that share a pattern (block rows); "segments" regroups, per K panel, any rows whose
    kept k's in that panel are identical (see segment_codegen.py: 1xK blocks become blocks).
    """

    rows: int = R_MAX
    vectors: int = V
    single_vectors: int = 2 * V
    panel: bool = False  # cut K into L1-sized panels (helps one-row groups, costs spills for blocks)
    layout: str = "rows"

    def __post_init__(self) -> None:
        if not (1 <= self.rows <= 8 and 1 <= self.vectors <= 8 and 1 <= self.single_vectors <= 12):
            raise ValueError(f"unsupported tile config {self}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"tile layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def tile_vectors(self) -> int:
        return math.lcm(self.vectors, self.single_vectors)

    def vectors_for(self, r: int) -> int:
        return self.single_vectors if r == 1 else self.vectors


# activation name -> C statement (the one table: sparta_explore/activations.py)
_ACTIVATIONS = {name: act.c for name, act in ACTIVATIONS.items()}


def _vectors(r: int) -> int:
    # one-row groups are load-bound (one broadcast per V loads), so they get more vectors
    return TileConfig().vectors_for(r)


FMA_CHAINS = 8  # independent accumulators that keep two FMA pipes of latency 4 busy


def _ways(r: int, v: int) -> int:
    """Pieces a flat loop runs at a time, each into its own r x v accumulators (FMA_CHAINS chains in all)."""
    return max(1, min(4, -(-FMA_CHAINS // (r * v))))


def _flat_loop(r: int, v: int) -> str:
    """C of a tile's flat loop over one-k pieces (scattered rows), accumulating into a{i}{j}.

    A one-row tile of three vectors has three accumulators: each FMA waits for the one before it
    (latency 4, two pipes), so it ran at 3 of 8 FMAs in flight. Here `ways` pieces go into
    `ways` sets of accumulators at once (FMA_CHAINS chains in all), summed at the end. One-row
    tiles read their pieces as (offset, weight) words (`word_pairs.pair_offsets`).
    """
    ways = _ways(r, v)
    if r == 1:
        return "        const uint64_t *q = (const uint64_t *)w;\n        const long n = E_P1[e] - E_P0[e];\n" + \
            paired_loop(v, ways)
    one = (" ".join(f"const vf x{j} = LD(x + {j} * VEC);" for j in range(v)) + " "
           + " ".join(f"a{i}{j} += w[{i}] * x{j};" for i in range(r) for j in range(v)))
    single = f"""        for (; p < E_P1[e]; ++p, w += {r}) {{
            const float *x = xb + P_X[p] + t;
            {one}
        }}"""
    if ways == 1:
        return f"        long p = E_P0[e];\n{single}"
    names = [[[f"a{i}{j}" if s == 0 else f"s{s}_{i}{j}" for j in range(v)] for i in range(r)] for s in range(ways)]
    decl = " ".join(f"vf {names[s][i][j]} = zero;" for s in range(1, ways) for i in range(r) for j in range(v))
    body = []
    for s in range(ways):
        body.append(f"const float *x{s}_ = xb + P_X[p + {s}] + t;")
        body += [f"const vf x{s}_{j} = LD(x{s}_ + {j} * VEC);" for j in range(v)]
        body += [f"{names[s][i][j]} += w[{s * r + i}] * x{s}_{j};" for i in range(r) for j in range(v)]
    sums = " ".join(f"a{i}{j} += {' + '.join(names[s][i][j] for s in range(1, ways))};"
                    for i in range(r) for j in range(v))
    return f"""        long p = E_P0[e];
        {decl}
        for (; p + {ways} <= E_P1[e]; p += {ways}, w += {ways * r}) {{
            {" ".join(body)}
        }}
{single}
        {sums}"""


def _tile_function(r: int, act: str, v: int) -> str:
    """One register tile (r rows x v vectors) over one panel entry: start, accumulate, spill or finish."""
    acc_decl = " ".join(f"vf a{i}{j} = first ? zero : LD(yb + (n0 + {i}) * TILE + t + {j} * VEC);"
                        for i in range(r) for j in range(v))
    loads = " ".join(f"const vf x{j} = LD(x + {j} * VEC);" for j in range(v))
    fmas = " ".join(f"a{i}{j} += w[{i}] * x{j};" for i in range(r) for j in range(v))
    flat = _flat_loop(r, v)
    finish, spill = [], []
    for i in range(r):
        for j in range(v):
            finish.append(f"{{ vf v = a{i}{j} + bias_of(bias, n0 + {i}); {_ACTIVATIONS[act]} "
                          f"ST(yb + (n0 + {i}) * TILE + t + {j} * VEC, v); }}")
            spill.append(f"ST(yb + (n0 + {i}) * TILE + t + {j} * VEC, a{i}{j});")
    return f"""
static inline void tile{r}(const float *xb, float *yb, long t, long e, const float *W, const float *bias,
                         const struct pattern *restrict P) {{
    (void)P;
    const vf zero = {{0}}; const vf one = zero + 1.0f; (void)one;
    const long n0 = G_ROW0[E_G[e]];
    const int first = (E_FLAGS[e] & 1) != 0, last = (E_FLAGS[e] & 2) != 0;
    {acc_decl}
    const float *w = W + E_WOFF[e];
    if (E_FLAGS[e] & {ONE_WORD}) {{  /* scattered: every piece is one k, so one flat loop over the pieces */
{flat}
    }} else {{
        for (long p = E_P0[e]; p < E_P1[e]; ++p) {{
            const float *x = xb + P_X[p] + t;
            for (long k = P_LEN[p]; k > 0; --k, x += TILE, w += {r}) {{
                {loads}
                {fmas}
            }}
        }}
    }}
    if (last) {{ {" ".join(finish)} }} else {{ {" ".join(spill)} }}
}}
"""


CHUNKS = 8  # row chunks baked into every kernel; small M splits work over them


def _chunks(groups: Groups, n_out: int, empty: np.ndarray) -> tuple[list[int], ...]:
    """Split groups into up to CHUNKS contiguous runs of similar kept work; each owns a row range."""
    n_groups = len(groups.row0)
    # kept work of each group: its rows times the k its segments cover (sums of integers: exact as floats)
    k_sums = np.concatenate([[0], np.cumsum(groups.seg_len)])
    per_group = ((k_sums[groups.seg_ptr[1:]] - k_sums[groups.seg_ptr[:-1]]) * groups.rows).astype(np.float64)
    acc = np.cumsum(per_group)
    total = float(acc[-1]) if n_groups else 0.0
    cuts, after = [0], 0
    while len(cuts) < CHUNKS:  # chunk j ends after the first group (past the last cut) whose running work reaches j/8
        g = max(after, int(np.searchsorted(acc, total * len(cuts) / CHUNKS, side="left")))
        if g + 1 >= n_groups:
            break
        cuts.append(g + 1)
        after = g + 1
    cuts.append(n_groups)
    g0, g1, n0, n1 = [], [], [], []
    for i in range(len(cuts) - 1):
        a, b = cuts[i], cuts[i + 1]
        g0.append(a)
        g1.append(b)
        n0.append(0 if i == 0 else int(groups.row0[a]))
        n1.append(n_out if i == len(cuts) - 2 else int(groups.row0[b]))
    ep = np.searchsorted(empty, n0 + [n_out]).tolist() if len(empty) else [0] * (len(n0) + 1)
    return g0, g1, n0, n1, ep


UNPACK_TILE = c_text("unpack_tile.c")


def entry_loop(n_panels: int, dispatch: str, finish: str, panel_outer_bytes: int = 0,
               walk: Callable[[str, str], str] | None = None) -> str:
    """C that runs a work item's panel entries chunk by chunk (`dispatch`: the switch cases on G_ROWS),
    then `finish` (see `finish_tile`) on each chunk's rows: they are still in L2 when they go to Y,
    while X's panels pass through L1.

    With `panel_outer_bytes`, a kernel of several panels whose item outputs (N_OUT x TILE floats) fit in that many
    bytes runs panel by panel over all its chunks instead, then finishes every chunk: each panel of X comes into L1
    once, not once per chunk, and the outputs wait in L2 (`panels.cache_bytes(2)`). 90% unstructured 3072 -> 768 at
    M = 4096 (12 panels, 4x3x3): 11.6 -> 11.3 ms; the BERT FFN block, fused, 20.1 -> 19.6 ms (in-process A/B);
    768 -> 3072, whose outputs fill more than half of L2, measured the same either way and keeps chunks outer.

    `walk` ((first, last) -> C) runs each range E_PTR[first]..E_PTR[last] in place of its per-entry switch: a
    kernel whose entries are all headed one-row streams (`entry_stream.stream_walk`).
    """
    def entries(first: str, last: str) -> str:  # E_PTR[first]..E_PTR[last]: each entry's switch, or `walk`
        if walk is not None:
            return walk(first, last)
        return f"""for (long e = E_PTR[{first}]; e < E_PTR[{last}]; ++e) {{
                        switch (G_ROWS[E_G[e]]) {{
{dispatch}
                        }}
                    }}"""
    finish_each = f"""                {{
                    const long c0 = c, c1 = c + 1;  /* finish this chunk alone */
{finish}
                }}"""
    chunks_outer = f"""            for (long c = c0; c < c1; ++c) {{
                for (long p = 0; p < {n_panels}; ++p)
                    {entries("p * (N_CHUNKS + 1) + c", "p * (N_CHUNKS + 1) + c + 1")}
{finish_each}
            }}
"""
    if not panel_outer_bytes or n_panels == 1:
        return chunks_outer
    return f"""            if (N_OUT * TILE * (long)sizeof(float) <= {panel_outer_bytes}L) {{  /* outputs wait in L2 */
                for (long p = 0; p < {n_panels}; ++p)
                    {entries("p * (N_CHUNKS + 1) + c0", "p * (N_CHUNKS + 1) + c1")}
                for (long c = c0; c < c1; ++c) {{
{finish_each}
                }}
            }} else {{
{chunks_outer}            }}
"""


def finish_tile(act: str, before_unpack: str = "") -> str:
    """C that ends a work item: rows no kept weight reaches get act(bias), then the tile goes to Y.

    `before_unpack` runs on the item's rows of `yb` first (an activation pass, for example).
    """
    return f"""            for (long e = C_EPTR[c0]; e < C_EPTR[c1]; ++e) {{  /* rows no kept weight reaches */
                const long n = EMPTY_ROWS[e];
                for (long t = 0; t < TILE; t += VEC) {{ vf v = zero + bias_of(bias, n); {_ACTIVATIONS[act]}
                    ST(yb + n * TILE + t, v); }}
            }}
{before_unpack}            if (Y) unpack_tile(yb, Y, m0, mt, C_N0[c0], C_N1[c1 - 1], P);  /* NULL: fused, yb read */"""


PACK_TILE = c_text("pack_tile_fp32.c")
ROWS_IO = KernelIO(PACK_TILE, UNPACK_TILE)




def fp32_driver(name: str, body: str) -> str:
    """C of `void {name}(X, Y, M, W, bias)`: work items of (tile of M) x (run of row chunks c0..c1).

    Each item packs its tile of X K-major (`xt`) and runs `body`, which fills the private
    N x TILE buffer `yb` for chunks c0..c1 and writes those rows of Y. Large M takes all
    chunks per item (one pack per tile); small M packs every tile once into a shared buffer
    and splits the chunks over threads.
    """
    return c_fill("fp32_driver.c", name=name, body=body)


def fp32_source(vec: int, cfg: TileConfig, n_in: int, n_out: int, specialized: str, driver: str,
                defines: str = "", io: KernelIO = ROWS_IO, shape_in_tables: bool = False) -> str:
    """A whole fp32 kernel source: shape macros (or none: `shape_in_tables`, K_IN and N_OUT are fields of the
    pattern), prelude, the pattern's tables and tiles, pack/unpack, driver."""
    shape = "" if shape_in_tables else f"#define K_IN {n_in}L\n#define N_OUT {n_out}L\n"
    return c_fill("fp32_kernel.c", vec=vec, tile_vectors=cfg.tile_vectors, shape=shape,
                  defines=io.defines + defines, prelude=_PRELUDE, specialized=specialized, unpack=io.unpack,
                  pack=io.pack, driver=driver)


def shape_tables(io: KernelIO, as_data: bool, n_in: int, n_out: int) -> PatternTables:
    """The shape's tables: for a linear's kernel with its pattern as data, K_IN and N_OUT are fields too, so one
    library per tiling serves every shape (the 24 shapes a shrink pass leaves in BERT-base, and every class of a
    tile search); else none. The panel count stays a literal (1 unless `TileConfig.panel`; bucketed, see
    `panels.bucketed`): read at run time, its loop cost 3% at K = 3072, M = 1024, where K_IN and N_OUT as fields
    measured within noise."""
    if not (as_data and io == ROWS_IO):  # a convolution's geometry is baked whatever its pattern
        return PatternTables()
    return PatternTables().scalar("K_IN", n_in).scalar("N_OUT", n_out)


def pattern_tables(groups: Groups, n_out: int, act: str) -> tuple[PatternTables, list[int]]:
    """The tables every kernel of a pattern reads (chunk count, group rows, empty rows, chunk row ranges)."""
    if act not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {act!r}")
    empty_rows = np.ones(n_out, dtype=bool)
    before = np.cumsum(groups.rows) - groups.rows  # rows of the groups before each: row0 + j sits at before + j
    covered = np.repeat(groups.row0 - before, groups.rows) + np.arange(int(groups.rows.sum()))
    empty_rows[covered] = False
    empty = np.flatnonzero(empty_rows)
    g0, _, n0, n1, ep = _chunks(groups, n_out, empty)
    # segments reach the C as panel entries and pieces (`entry_tables`), not as G_SEG* tables
    tables = (PatternTables().scalar("N_CHUNKS", len(g0)).array("G_ROW0", groups.row0).array("G_ROWS", groups.rows)
              .array("EMPTY_ROWS", empty).array("C_N0", n0).array("C_N1", n1).array("C_EPTR", ep))
    return tables, g0


def entry_tables(panels: Panels, e_ptr: np.ndarray | None = None) -> PatternTables:
    """The tables of panel entries (E_*; kernels/panels.py; `e_ptr` in place of the panels' own, e.g. `bucketed`);
    the pieces' tables are the caller's."""
    return (PatternTables().array("E_G", panels.e_group).array("E_P0", panels.e_piece0).array("E_P1", panels.e_piece1)
            .array("E_WOFF", panels.e_woff).array("E_FLAGS", panels.e_flags)
            .array("E_PTR", panels.e_ptr if e_ptr is None else e_ptr))


def generate_source(groups: Groups, n_out: int, n_in: int, vec: int, act: str, name: str,
                    cfg: TileConfig = TileConfig(), io: KernelIO = ROWS_IO, as_data: bool = False) -> KernelSource:
    """C source of `void {name}(X, Y, M, W, bias, P)`: X is M x K row-major, Y is M x N row-major.

    Work items are (tile of TILE rows of X) x (run of row chunks): each packs its tile of X
    K-major into a private buffer, runs its groups into a private N x TILE buffer, fills the
    rows no weight reaches, and writes its rows of that tile of Y. Large M takes all chunks
    per item (one pack per tile); small M splits chunks over threads. `io` says how tiles
    are read and written (row-major X and Y, or a convolution's NCHW tensors). `as_data`: the
    pattern's tables come at run time through `P` (kernels/pattern_data.py) and the source
    depends on the shape, tiling and activation only; else they are baked in and `P` is unused.
    """
    tables, chunk_g0 = pattern_tables(groups, n_out, act)
    rows = panel_rows(4 * cfg.tile_vectors * vec, budget=fp32_budget()) if cfg.panel else max(1, n_in)
    word_order = None
    # scattered rows cut into K panels: short loops, ordered by length so that their exits are guessed (`by_length`;
    # whole rows, without panels, loop long enough: there the order measured -3% to +5%). Unstructured patterns
    # get those tables in one counting pass (`scattered_panels`: 10-17 -> 3 ms a BERT-base FFN weight)
    if cfg.panel and len(groups.seg_k0) and is_scattered(groups):
        panels, word_order = scattered_panels(groups, n_in, rows, chunk_g0)
    else:
        panels = cut_panels(groups, n_in, rows, chunk_g0)
        if io.one_word and int(panels.p_len.max(initial=1)) > 1:
            raise ValueError("this kernel I/O reads one k per piece: give it one-word segments (unit_segments)")
        if cfg.panel and panels.e_flags.size and bool((panels.e_flags & ONE_WORD).all()):
            panels, word_order = by_length(panels, chunk_g0, groups.rows)
    p_x = io.offsets(panels.p_k0, cfg.tile_vectors * vec)
    # scattered one-row entries read (offset, weight) pairs out of W: one load a kept weight instead of two
    panels, p_x, words = pair_offsets(panels, groups.rows, p_x, word_order)
    # and where every entry is such a row, a header word before each finds its row: no per-entry tables (entry_stream)
    stream = headed(panels, groups.row0, words)
    if stream is not None:
        panels, words = stream
    # with the pattern as data, the panel loop's literal count is bucketed: one library serves every K of a bucket
    e_ptr, n_panels = bucketed(panels.e_ptr, panels.count, len(chunk_g0) + 1) if as_data and cfg.panel else \
        (panels.e_ptr, panels.count)
    # offsets as int32 (int8's P_XOFF too): a scattered pattern streams one per kept weight, 4 bytes instead of 8
    if stream is None:
        tables += entry_tables(panels, e_ptr).array("P_X", p_x, "int32_t").array("P_LEN", panels.p_len)
    else:  # a walk reads where its range starts; rows, counts and flags are in the headers
        starts = PatternTables().array("E_WOFF", panels.e_woff).array("E_PTR", e_ptr)
        tables = tables.without("G_ROW0", "G_ROWS") + starts
    dispatch = "\n".join(
        f"{' ' * 24}case {r}: " + " ".join(f"tile{r}(xt, yb, {j} * {cfg.vectors_for(r)} * VEC, e, W, bias, P);"
                                         for j in range(cfg.tile_vectors // cfg.vectors_for(r))) + " break;"
        for r in range(1, cfg.rows + 1))
    if act != "none" and cfg.panel and vec == 16:  # the activation as a pass over each chunk's rows: see act_rows
        extra, tile_act = act_rows(act), "none"
        finish = finish_tile("none", before_unpack="            act_rows(yb, C_N0[c0], C_N1[c1 - 1]);\n")
    else:
        extra, finish, tile_act = "", finish_tile(act), act
    v1 = cfg.vectors_for(1)
    if stream is None:
        tiles = HIGH_FLOAT + "".join(_tile_function(r, tile_act, cfg.vectors_for(r)) for r in range(1, cfg.rows + 1))
        walk = None
    else:  # only one-row entries, walked from their headers: no tile functions
        tiles, walk = HIGH_FLOAT + stream_function(v1, tile_act, _ways(1, v1)), stream_walk(cfg.tile_vectors, v1)
    shape = shape_tables(io, as_data, n_in, n_out)
    tables = shape + tables
    body = entry_loop(n_panels, dispatch, finish, panel_outer_bytes=cache_bytes(2) // 2, walk=walk)
    text = fp32_source(vec, cfg, n_in, n_out, tables.c(as_data) + extra + tiles, fp32_driver(name, body), io=io,
                       shape_in_tables=bool(shape.scalars))
    return KernelSource(text, tables, as_data, words)
