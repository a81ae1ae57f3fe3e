"""Scattered one-row entries read as one stream: a header word, then the entry's (offset, weight) words.

An unstructured fp32 kernel in K panels runs one entry per (row, panel): 1.6 M of them in a
BERT FFN at M = 4096, about 26 kept weights each. Each entry found its place through tables
(`E_G`, `G_ROWS`, `G_ROW0`, `E_FLAGS`, `E_WOFF`, `E_P0`, `E_P1`: seven loads, two of them
dependent, and a switch on the group's rows) before its first FMA. Where every entry of a
kernel is one row of (offset, weight) words (`word_pairs.Interleaved`), the weight array here
holds, before each entry's words, one 64-bit header: the row in the low half, the piece count
and the first / last flags in the high half. A (panel, chunk)'s entries are consecutive in the
array, so the kernel walks them from the first entry's header on, with no table but `E_PTR`
and `E_WOFF` for where the walk starts.

Measured on Zen 4: a C model of both walks (one thread, 3 panels of 256 k, 25.5 pieces an entry)
2.27-2.51 -> 2.72-2.86 FMAs a ns; the kernels, in-process against their table twins (2 threads,
90% unstructured, bit for bit the same sums): the fused BERT FFN 39.7 -> 34.3 ms at M = 4096 and
1.72 -> 1.43 at M = 128, 768 -> 3072 1.09-1.18x, 3072 -> 768 1.09-1.27x, AVX2 builds 1.08-1.60x,
implicit-GEMM 3x3 convs 1.06-1.16x. The tables such a kernel keeps are `E_WOFF` and `E_PTR`.

Example:
    >>> from sparta_explore.kernels.word_pairs import Interleaved, WordMap
    >>> heads = Headed(Interleaved(np.array([8, 24, 40], np.int32)), np.array([3, 0]), np.array([2, 1]),
    ...                np.array([1, 2]))
    >>> w = heads.apply(np.array([0.5, 0.25, 2.0], np.float32)).view(np.int32)
    >>> w[:2].tolist(), w[2:6].view(np.float32)[1::2].tolist(), w[6:8].tolist()
    ([3, 1073741826], [0.5, 0.25], [0, -2147483647])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from sparta_explore.activations import ACTIVATIONS
from sparta_explore.kernels.groups import _exclusive_cumsum
from sparta_explore.kernels.panels import Panels
from sparta_explore.kernels.word_pairs import Interleaved, WordMap

FIRST, LAST = 1 << 30, 1 << 31  # header flags in the high half, beside the piece count (< 2^30)

HIGH_FLOAT = """
/* the float whose bits are the high half of q: a weight stored beside its int32 X offset (kernels/word_pairs.py) */
static inline float high_float(uint64_t q) {
    const uint32_t u = (uint32_t)(q >> 32); float f; memcpy(&f, &u, 4); return f;
}
"""


def paired_loop(v: int, ways: int) -> str:
    """C of a one-row tile's flat loop over the `n` (offset, weight) words at `q` (kernels/word_pairs.py), into
    a0{j}: `ways` words at a time into as many sets of accumulators, summed at the end.

    Example:
        >>> "i += 3" in paired_loop(3, 3) and "s2_02" in paired_loop(3, 3)
        True
    """
    names = [[f"a0{j}" if s == 0 else f"s{s}_0{j}" for j in range(v)] for s in range(ways)]

    def piece(s: int, at: str) -> str:
        return (f"const uint64_t q{s}_ = q[{at}]; const float *x{s}_ = xb + (int32_t)q{s}_ + t; "
                f"const float w{s}_ = high_float(q{s}_); "
                + " ".join(f"{names[s][j]} += w{s}_ * LD(x{s}_ + {j} * VEC);" for j in range(v)))

    decl = " ".join(f"vf {names[s][j]} = zero;" for s in range(1, ways) for j in range(v))
    sums = " ".join(f"a0{j} += {' + '.join(names[s][j] for s in range(1, ways))};" for j in range(v)) \
        if ways > 1 else ""
    return f"""        long i = 0;
        {decl}
        for (; i + {ways} <= n; i += {ways}) {{
            {" ".join(piece(s, f"i + {s}") for s in range(ways))}
        }}
        for (; i < n; ++i) {{
            {piece(0, "i")}
        }}
        {sums}"""


@dataclass(frozen=True)
class Headed:
    """A kernel's weight array with a header before each entry's words: `Interleaved`'s words (two per piece), and
    before entry e's, the int32 pair (row[e], count[e] | FIRST | LAST as its flags say). `word_pairs.WordMap`'s
    interface (`apply`); its index arrays are made once, here.
    """

    words: Interleaved
    row: np.ndarray  # each entry's output row
    count: np.ndarray  # each entry's pieces, in piece order (entry e's are those after entry e - 1's)
    flags: np.ndarray  # each entry's E_FLAGS (1: first, 2: last)

    def __post_init__(self) -> None:
        count = np.asarray(self.count, dtype=np.int64)
        entry = np.repeat(np.arange(count.size, dtype=np.int64), count)
        # piece i of entry e sits after the e + 1 headers up to and including its entry's
        object.__setattr__(self, "_piece_at", 2 * (np.arange(entry.size, dtype=np.int64) + entry + 1))
        object.__setattr__(self, "_head_at", 2 * (_exclusive_cumsum(count)[:-1] + np.arange(count.size)))
        flags = np.asarray(self.flags, dtype=np.int64)
        high = count | np.where(flags & 1, FIRST, 0) | np.where(flags & 2, LAST, 0)
        object.__setattr__(self, "_high", high.astype(np.uint32).view(np.int32))

    def apply(self, words: np.ndarray) -> np.ndarray:
        """The kernel's float32 weight array from the words it would read without pairs."""
        body = self.words.apply(words)
        out = np.empty(body.size + 2 * self.count.size, dtype=np.float32)
        out[self._piece_at] = body[0::2]
        out[self._piece_at + 1] = body[1::2]
        bits = out.view(np.int32)
        bits[self._head_at] = np.asarray(self.row, dtype=np.int32)
        bits[self._head_at + 1] = self._high
        return out


def headed(panels: Panels, row0: np.ndarray, words: WordMap | Interleaved | None) -> tuple[Panels, Headed] | None:
    """(`panels` whose E_WOFF skip each entry's header, the map of the weight array with headers) where every entry
    is one row of (offset, weight) pairs in entry order (`words` is `Interleaved` and entry e's pieces follow entry
    e - 1's), else None: the kernel keeps its tables.

    Example:
        >>> from sparta_explore.kernels.word_pairs import Interleaved, WordMap
        >>> p = Panels(rows=4, e_group=np.array([1, 0]), e_piece0=np.array([0, 0]), e_piece1=np.array([2, 1]),
        ...            e_woff=np.array([0, 4]), e_flags=np.array([7, 7]), p_k0=np.zeros(0, np.int64),
        ...            p_len=np.zeros(0, np.int64), e_ptr=np.array([0, 2]), count=1)
        >>> new, heads = headed(p, np.array([5, 9]), Interleaved(np.array([0, 48, 96], np.int32)))
        >>> new.e_woff.tolist(), heads.row.tolist(), heads.count.tolist()
        ([2, 8], [9, 5], [2, 1])
    """
    if not isinstance(words, Interleaved) or not panels.e_group.size:
        return None
    count = (panels.e_piece1 - panels.e_piece0).astype(np.int64)
    if int(count.max()) >= FIRST or not np.array_equal(np.asarray(panels.e_woff), 2 * _exclusive_cumsum(count)[:-1]):
        return None
    new_woff = 2 * (_exclusive_cumsum(count)[:-1] + np.arange(count.size) + 1)
    heads = Headed(words, np.asarray(row0, dtype=np.int64)[panels.e_group], count, panels.e_flags)
    return replace(panels, e_woff=new_woff), heads


def stream_function(v: int, act: str, ways: int) -> str:
    """C of `stream1(xb, yb, t, s, count, bias)`: `count` headed entries from `s` on, each a one-row tile of `v`
    vectors at column t of the tile: start (zero or the spilled sums), accumulate, then spill, or add the bias
    and `act` where the entry is its row's last.

    Example:
        >>> "static inline void stream1(" in stream_function(3, "none", 3)
        True
    """
    starts = " ".join(f"vf a0{j} = first ? zero : LD(y + {j} * VEC);" for j in range(v))
    finish = " ".join(f"{{ vf v = a0{j} + b; {ACTIVATIONS[act].c} ST(y + {j} * VEC, v); }}" for j in range(v))
    spill = " ".join(f"ST(y + {j} * VEC, a0{j});" for j in range(v))
    return f"""
static inline void stream1(const float *xb, float *yb, long t, const uint64_t *s, long count, const float *bias) {{
    const vf zero = {{0}}; const vf one = zero + 1.0f; (void)one;
    for (; count > 0; --count) {{  /* one entry: its header, then its n (offset, weight) words */
        const uint64_t h = *s;
        const long n0 = (long)(uint32_t)h, n = (long)((h >> 32) & {FIRST - 1}u);
        const int first = (int)((h >> 62) & 1), last = (int)(h >> 63);
        float *y = yb + n0 * TILE + t;
        {starts}
        const uint64_t *q = s + 1;
{paired_loop(v, ways)}
        s = q + n;
        if (last) {{ const float b = bias_of(bias, n0); {finish} }} else {{ {spill} }}
    }}
}}
"""


def stream_walk(tile_vectors: int, v: int) -> Callable[[str, str], str]:
    """A function (first, last) -> C that runs the entries E_PTR[first]..E_PTR[last] as streams: one walk per
    `v` vectors of the tile's `tile_vectors` (`bsr_codegen.entry_loop`'s `walk`).

    Example:
        >>> "stream1(xt, yb, 3 * VEC" in stream_walk(6, 3)("a", "b")
        True
    """
    def walk(first: str, last: str) -> str:
        calls = " ".join(f"stream1(xt, yb, {j * v} * VEC, s, e1 - e0, bias);" for j in range(tile_vectors // v))
        return f"""{{
                        const long e0 = E_PTR[{first}], e1 = E_PTR[{last}];
                        if (e1 > e0) {{ const uint64_t *s = (const uint64_t *)(W + E_WOFF[e0]) - 1; {calls} }}
                    }}"""
    return walk
