"""The register tile every int8 variant shares: one row group x one M tile, over one panel entry's k words.

int16 pairs (`vpmaddwd`), u8 quads (`vpmaddubsw`) and VNNI quads (`vpdpbusd`) differ only in
the word (2 or 4 k), the element type of the packed X, and the C inside the loop and around
it; the walk over an entry's pieces and words is `templates/qtile.c`. An entry is one group's
k inside one K panel (kernels/panels.py): the first entry of a group starts its int32 sums
from zero, later ones reload them from the output buffer, the last one dequantizes and stores.

Example:
    >>> "qtile2(" in qtile(2, "int16_t", 2, body="", stores="", acc="", spill="")
    True
"""

from __future__ import annotations

from sparta_explore.kernels.c_templates import c_fill
from sparta_explore.kernels.panels import ONE_WORD


def int32_slot(i: int, offset: str) -> str:
    """C address of row i's int32 sums at M offset `offset` inside the tile's output buffer."""
    return f"yi + (n0 + {i}) * TILE + t + {offset}"


def qtile(r: int, elem: str, word: int, *, acc: str, body: str, stores: str, spill: str, head: str = "",
          consts: str = "", counters: str = "", after: str = "") -> str:
    """C of `qtile{r}`: `acc` declares the accumulators (from zero when `first`, else reloaded from `yi`),
    `body` runs per word (x points at it, w at the group's r weights), `stores` writes the results of
    the group's last entry, `spill` saves the int32 sums of the others; `head`, `consts`, `counters` and
    `after` are whole lines (indented, newline-terminated) placed before the zero vector, after it,
    before the loop and after it.

    Example:
        >>> qtile(1, "uint8_t", 4, acc="", body="", stores="", spill="").count("x += 4 * TILE")
        1
    """
    return c_fill("qtile.c", r=r, elem=elem, word=word, one_word=ONE_WORD, acc=acc, body=body, stores=stores,
                  spill=spill, head=head, consts=consts, counters=counters, after=after)
