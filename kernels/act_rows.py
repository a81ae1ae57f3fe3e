"""An activation as a pass of its own over rows of an N x TILE output buffer (instead of in every tile's finish).

`act_rows` is that pass on the kernel's vectors; `act_rows_wide` on 16-float vectors for kernels
whose vectors are 8 floats on a CPU that has 16-float registers (`widen` rewrites the vector
prelude's names for that).

Example:
    >>> "static void act_rows(" in act_rows_wide("gelu")
    True
"""

from __future__ import annotations

import re

from sparta_explore.activations import ACTIVATIONS
from sparta_explore.kernels.c_templates import c_text

PRELUDE = c_text("vector_prelude.c")

_WIDE_NAMES = {"vf": "wf", "vi": "wi", "vsel": "wsel", "vrcp": "wrcp", "vmax": "wmax", "vexp_neg": "wexp_neg",
               "vgelu": "wgelu", "vsilu": "wsilu",
               "LD": "WLD", "ST": "WST"}


def widen(c: str) -> str:
    """The vector prelude's C (or an activation statement) on 16-float vectors: wf, wsel, wexp_neg, wgelu.

    For kernels whose vectors are 8 floats on a CPU with 16-float registers: their activation
    can run as a separate pass over rows at twice the width (`act_rows_wide`).

    Example:
        >>> widen("v = vsel(v > zero, v, zero);")
        'v = wsel(v > zero, v, zero);'
    """
    out = re.sub(r"\b(" + "|".join(_WIDE_NAMES) + r")\b", lambda m: _WIDE_NAMES[m.group(1)], c)
    # a wide vector is 16 floats whatever VEC says (the prelude's `#if VEC == ...` picks its intrinsics)
    return out.replace("VEC * 4", "64").replace("VEC == 16", "1").replace("VEC == 8", "0")


def _act_rows_loop(act: str, step: str) -> str:
    """C of `act_rows(yb, r0, r1)` on `vf` vectors, `step` floats at a time (`widen` makes it 16-float)."""
    return f"""
static void act_rows(float *yb, long r0, long r1) {{
    const vf zero = {{0}}; const vf one = zero + 1.0f; (void)one;
    for (float *p = yb + r0 * TILE, *end = yb + r1 * TILE; p < end; p += {step}) {{
        vf v = LD(p); {ACTIVATIONS[act].c} ST(p, v);
    }}
}}
"""


def act_rows_wide(act: str) -> str:
    """C of `act_rows(yb, r0, r1)`: `act` over rows r0..r1 of the N x TILE buffer, 16 floats at a time.

    TILE must be a multiple of 16. Uses the widened prelude (`widen`), which it includes.
    """
    prelude = "\n".join(line for line in widen(PRELUDE).splitlines() if not line.startswith("#include"))
    return prelude + widen(_act_rows_loop(act, "16"))


def act_rows(act: str) -> str:
    """C of `act_rows(yb, r0, r1)`: `act` over rows r0..r1 of the N x TILE buffer, in place, VEC floats at a time.

    A K-panel tiling on 16-float vectors applies its activation this way, after the chunk's last panel, instead of
    in every tile's finish: 90% unstructured 768 -> 3072 at M = 4096 (4x3x3 in panels, Zen 5) with GELU 11.8 ->
    11.5 ms, with ReLU 11.4 -> 10.7 (10.6 with none). Elsewhere it measured no better or worse (AVX2's generic
    GELU on unstructured rows 17.2 -> 18.9 ms), so other tilings keep it in the tile.

    Example:
        >>> "static void act_rows(" in act_rows("relu")
        True
    """
    return _act_rows_loop(act, "VEC")
