"""The fixed C text of the kernels lives in `templates/*.c`, filled with `string.Template`.

Python generates only what depends on the pattern or the CPU (unrolled register tiles,
baked tables, the dot-product prelude of a VNNI mode); everything else is plain C you can
read, and each built kernel's full `.c` is kept beside its cached `.so` (see `build.py`).
Placeholders are `${name}`; a template that names a value nobody filled raises `KeyError`.

Example:
    >>> "row_scale" in c_text("row_scale.c")
    True
    >>> c_fill("vnni_256.c", intrinsic="_mm256_dpbusd_avx_epi32(a, x, w)").count("dpbusd")
    1
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).parent / "templates"


@cache
def c_text(name: str) -> str:
    """The text of `templates/<name>` as it is (for files without placeholders).

    Example:
        >>> c_text("unpack_tile.c").count("unpack_tile(") >= 1
        True
    """
    return (TEMPLATES / name).read_text()


def c_fill(template: str, /, **values: object) -> str:
    """`templates/<template>` with every `${key}` replaced by `str(values[key])`.

    Example:
        >>> "void k(" in c_fill("fp32_driver.c", name="k", body="")
        True
    """
    return Template(c_text(template)).substitute({k: str(v) for k, v in values.items()})
