"""A kernel's pattern tables, baked into its C source or handed to it at run time as data.

The generated kernels walk tables (row groups, panel entries, pieces of k; `bsr_codegen`,
`int8_codegen`). *Baked*, they are constant arrays inside the source: every pattern is its
own library, one gcc run each. *As data*, the source holds only the tables' declarations (a
`struct pattern` of pointers the kernel reads through `P`), so it depends on the shape,
tiling, precision and ISA alone: every layer and every trial of one shape class shares one
library, and a new mask costs no build at all (issue 27: compile in seconds). Both forms name
the tables the same way in C (`E_G[e]`, `N_CHUNKS`), so the kernel text is written once.

Example:
    >>> t = PatternTables().scalar("N_CHUNKS", 2).array("E_G", np.arange(3))
    >>> "#define E_G (P->E_G)" in t.c(as_data=True), "static const long E_G[]" in t.c(as_data=False)
    (True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from sparta_explore.kernels.entry_stream import Headed
from sparta_explore.kernels.word_pairs import Interleaved, WordMap

# Pattern tables longer than this are baked as assembler data: gcc's C parser spent most of a kernel's build
# reading them as initializers (BERT-base 768x3072 at 90%: fp32 1.3 -> 0.35 s, int8 1.25 -> 0.87 s per build);
# inside one `__asm__` string they are a few tokens, the assembler reads them fast, and the code is the same
ASM_TABLE_MIN = 256
_ASM_DATA = {"long": (".quad", 8), "int32_t": (".long", 4)}
_ASM_LINE = 1024  # values per directive line
_BLOBS = {"long": 0, "int32_t": 1}  # which blob holds a table of that C type


def baked_array(name: str, values: np.ndarray, ctype: str = "long") -> str:
    """C of one constant table: an initialized array, or assembler data when it is long.

    Example:
        >>> baked_array("T", np.array([1, 2]))
        'static const long T[] = {1,2};\\n'
    """
    text = [str(v) for v in np.asarray(values, dtype=np.int64).tolist()]
    if len(text) < ASM_TABLE_MIN or ctype not in _ASM_DATA:
        body = ",".join(text) or "0"
        return f"static const {ctype} {name}[] = {{{body}}};\n"
    directive, size = _ASM_DATA[ctype]
    lines = "".join(f'    "{directive} {",".join(text[i:i + _ASM_LINE])}\\n"\n' for i in range(0, len(text), _ASM_LINE))
    # a local label (no .globl): the table stays private to this library, as a static array would
    return (f'__asm__(".section .rodata\\n.balign {size}\\n.type {name}, @object\\n"\n'
            f'    ".size {name}, {len(text) * size}\\n{name}:\\n"\n{lines}    ".previous\\n");\n'
            f'extern const {ctype} {name}[{len(text)}] __attribute__((visibility("hidden")));\n')


@dataclass(frozen=True)
class PatternTables:
    """The scalars (C `long`) and arrays (`long` or `int32_t`) one kernel reads, in declaration order."""

    scalars: tuple[tuple[str, int], ...] = ()
    arrays: tuple[tuple[str, np.ndarray, str], ...] = ()

    def scalar(self, name: str, value: int) -> PatternTables:
        """These tables and one more scalar."""
        return PatternTables(self.scalars + ((name, int(value)),), self.arrays)

    def array(self, name: str, values: np.ndarray, ctype: str = "long") -> PatternTables:
        """These tables and one more array of `ctype` ("long" or "int32_t")."""
        if ctype not in _BLOBS:
            raise ValueError(f"table {name}: C type must be one of {sorted(_BLOBS)}, got {ctype!r}")
        return PatternTables(self.scalars, self.arrays + ((name, np.asarray(values, dtype=np.int64), ctype),))

    def without(self, *names: str) -> PatternTables:
        """These tables less the arrays named (a kernel that reads none of them).

        Example:
            >>> [name for name, _, _ in PatternTables().array("A", [1]).array("B", [2]).without("A").arrays]
            ['B']
        """
        return PatternTables(self.scalars, tuple(a for a in self.arrays if a[0] not in names))

    def __add__(self, other: PatternTables) -> PatternTables:
        return PatternTables(self.scalars + other.scalars, self.arrays + other.arrays)

    def c(self, as_data: bool) -> str:
        """The C that defines every table name: constants (baked) or `struct pattern` fields read through `P`.

        Either way `struct pattern` is declared, so kernel functions take `const struct pattern *P`.
        """
        if not as_data:
            return ("struct pattern;  /* baked: the tables are constants below, P is unused */\n"
                    + "".join(f"#define {name} {value}L\n" for name, value in self.scalars)
                    + "".join(baked_array(name, values, ctype) for name, values, ctype in self.arrays))
        fields = [f"    long {name};\n" for name, _ in self.scalars]
        fields += [f"    const {ctype} *{name};\n" for name, _, ctype in self.arrays]
        names = [name for name, _ in self.scalars] + [name for name, _, _ in self.arrays]
        return ("struct pattern {  /* the pattern as data: filled by kernels/pattern_data.py (pattern_struct) */\n"
                + "".join(fields) + "};\n" + "".join(f"#define {name} (P->{name})\n" for name in names))

    def blobs(self) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
        """(int64 values, int32 values, layout): every array's values in one tensor per C type, and the
        layout `pattern_struct` reads (the scalars, then per array its blob and offset)."""
        parts: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
        layout = [len(self.scalars), *(value for _, value in self.scalars)]
        sizes = [0, 0]
        for _, values, ctype in self.arrays:
            blob = _BLOBS[ctype]
            layout += [blob, sizes[blob]]
            parts[blob].append(values)
            sizes[blob] += max(1, len(values))  # an empty table still gets a valid address
            if not len(values):
                parts[blob].append(np.zeros(1, dtype=np.int64))
        joined = [np.concatenate(p) if p else np.zeros(1, dtype=np.int64) for p in parts]
        if len(joined[1]) and (np.abs(joined[1]) >= 2 ** 31).any():
            raise ValueError("an int32_t pattern table holds a value beyond 32 bits")
        return (torch.from_numpy(joined[0].astype(np.int64)), torch.from_numpy(joined[1].astype(np.int32)),
                tuple(int(v) for v in layout))


def pattern_struct(t64: torch.Tensor, t32: torch.Tensor, layout: tuple[int, ...]) -> np.ndarray:
    """The bytes of `struct pattern` for these blobs (`PatternTables.blobs`): scalars, then one pointer per
    array. The result holds addresses into `t64` / `t32`: keep those alive while a kernel may read it.

    Example:
        >>> t64, t32, layout = PatternTables().scalar("N", 3).array("A", np.arange(2)).blobs()
        >>> s = pattern_struct(t64, t32, layout); int(s[0]), int(s[1]) == t64.data_ptr()
        (3, True)
    """
    n_scalars = layout[0]
    values = list(layout[1:1 + n_scalars])
    bases = (t64.data_ptr(), t32.data_ptr())
    sizes = (8, 4)
    rest = layout[1 + n_scalars:]
    for blob, offset in zip(rest[0::2], rest[1::2]):
        values.append(bases[blob] + offset * sizes[blob])
    return np.asarray(values, dtype=np.uint64).view(np.int64)


@dataclass(frozen=True)
class KernelSource:
    """A generated kernel: its C text and the pattern tables it reads (baked into the text, or `as_data`), and where
    the kernel reads its weight array in another order than the weights were packed, or with other words among
    them (`words`: kernels/word_pairs.py; kernel's array = `kernel_words(packed)`)."""

    text: str
    tables: PatternTables
    as_data: bool
    words: WordMap | Interleaved | Headed | None = field(default=None, compare=False)

    def kernel_words(self, packed: np.ndarray) -> np.ndarray:
        """The float32 array the kernel reads as W, from the weights packed in groups' order."""
        return packed if self.words is None else self.words.apply(packed)
