"""The register tile every int8 variant shares: one row group x one M tile, over the group's k words.

int16 pairs (`vpmaddwd`), u8 quads (`vpmaddubsw`) and VNNI quads (`vpdpbusd`) differ only in
the word (2 or 4 k), the element type of the packed X, and the C inside the loop and around
it; the walk over segments and words is `templates/qtile.c`.

Example:
    >>> "qtile2(" in qtile(2, "int16_t", 2, body="", stores="", acc="")
    True
"""

from __future__ import annotations

from sparta_explore.kernels.c_templates import c_fill


def qtile(r: int, elem: str, word: int, *, acc: str, body: str, stores: str, head: str = "", consts: str = "",
          counters: str = "", after: str = "") -> str:
    """C of `qtile{r}`: `acc` declares the accumulators, `body` runs per word (x points at it, w at the
    group's r weights), `stores` writes the results; `head`, `consts`, `counters` and `after` are whole
    lines (indented, newline-terminated) placed before the zero vector, after it, before the loop and
    after it.

    Example:
        >>> qtile(1, "uint8_t", 4, acc="", body="", stores="").count("/ 4")
        2
    """
    return c_fill("qtile.c", r=r, elem=elem, word=word, acc=acc, body=body, stores=stores, head=head,
                  consts=consts, counters=counters, after=after)
