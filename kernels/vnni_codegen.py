"""The VNNI int8 kernel variant: u8 x s8 products summed straight into int32 by `vpdpbusd`.

AVX-512 VNNI (Intel since Cascade Lake, AMD since Zen 4) and AVX-VNNI have one instruction,
`vpdpbusd`, that multiplies 4 unsigned bytes of x by 4 signed bytes of w and adds the four
products to an int32 lane: 64 exact products per 512-bit instruction, no int16 partial
sums, so every 8-bit weight grid runs it (the AVX2 u8 variant of lowbit_codegen needs a
narrow grid to avoid int16 saturation). Data layout and arithmetic are the u8 variant's:
activations quantized per row and stored as q + 128 in k quads, weights as int8 quads,
the offset removed per output row by `offset_correction`.

The dot product is one entry of `DOT_MODES` (vector type, load, broadcast, dot, half
extraction as C macros), chosen from the CPU flags; `emulate=True` swaps the one
instruction for exact portable C over GCC vectors of the same width, so every VNNI kernel
is built and checked on any x86-64 CPU (AVX2 still packs the activations).

Example:
    >>> native_dot_mode(frozenset({"avx2", "avx512f", "avx512_vnni"})).name
    'avx512_vnni'
    >>> native_dot_mode(frozenset({"avx2"})) is None
    True
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, replace

from sparta_explore.kernels.bsr_codegen import _ACTIVATIONS
from sparta_explore.kernels.c_templates import c_fill
from sparta_explore.kernels.qtile import int32_slot, qtile


@dataclass(frozen=True)
class DotMode:
    """One way to run `vpdpbusd`: its vector width, register tile and the C that defines it.

    `lanes` int32 lanes per vector; a register tile is `rows` output rows x `vectors`
    vectors of M; `needs` are the /proc/cpuinfo flags the native instruction requires;
    `intrinsic` is the C expression of VDOT(a, x, w); `cost` the time per padded product
    relative to the int16 `vpmaddwd` kernels, which decides quads vs pairs in
    `int8_codegen.prepare_groups` (measured on BERT FFN shapes, AMD Zen 5).
    """

    name: str
    lanes: int
    vectors: int
    rows: int
    needs: frozenset[str]
    intrinsic: str
    cost: float
    single_vectors: int = 0  # vectors of a one-row tile (0: `vectors`); more M per weight broadcast

    def vectors_for(self, r: int) -> int:
        """Vectors of M per tile of `r` rows."""
        return self.single_vectors if r == 1 and self.single_vectors else self.vectors


DOT_MODES: dict[str, DotMode] = {}


def register_dot_mode(mode: DotMode) -> DotMode:
    """Add a dot mode to the table, preferred in registration order when the CPU has its flags."""
    DOT_MODES[mode.name] = mode
    return mode


# Geometry and cost measured on AMD Zen 5 (2 threads, 768 x 3072, M = 4096): the 512-bit
# tile ran dense in 0.56x and 90% 32x32 in 0.45x the int16 kernel's time (6 rows: 30.8 ms
# dense vs 34.5 ms with 4). VEX AVX-VNNI has only 16 ymm registers: 3 x 3 ran 1.02x dense
# and 0.89x at 32x32 (4 x 2: 1.41x and 0.66x), so it is taken only where quads do not pad.
register_dot_mode(DotMode("avx512_vnni", lanes=16, vectors=3, rows=6, needs=frozenset({"avx512f", "avx512_vnni"}),
                          intrinsic="_mm512_dpbusd_epi32(a, x, w)", cost=0.6))
# One-row tiles of 6 ymm vectors (6 accumulators + 6 x + 1 weight = 13 of 16 registers) halve the
# steps per M of 3: 90% unstructured 34.6 -> 19.3 ms, 1x32 6.9 -> 5.5 ms (3072 x 768, M = 4096).
register_dot_mode(DotMode("avx_vnni", lanes=8, vectors=3, rows=3, needs=frozenset({"avx_vnni"}),
                          intrinsic="_mm256_dpbusd_avx_epi32(a, x, w)", cost=0.95, single_vectors=6))


# Below this many rows per call the wide tiles waste their ragged last tile and leave threads idle:
# 90% unstructured, 2 threads, M = 128: wide 0.40 / 0.47 ms vs narrow 0.32 / 0.34 ms (3072x768 / 768x3072);
# M = 384: wide 0.84 vs 0.89 ms; M = 1024: even.
WIDE_MIN_M = 384


def for_scattered(mode: DotMode) -> DotMode:
    """`mode` with one-row tiles twice as wide in M, for patterns whose loops step one quad at a time.

    A scattered row's cost is its steps (address, weight broadcast); covering 2x the M per
    step halves them. The work item grows to the wider tile, which costs block patterns
    7-9% (X no longer in L1), so only scattered patterns take it: avx512_vnni, 3072 x 768,
    M = 4096, 90% unstructured 17.9 -> 13.9 ms; 1x32 4.5 -> 4.8 ms.

    Example:
        >>> for_scattered(DOT_MODES["avx512_vnni"]).vectors_for(1)
        6
    """
    return replace(mode, single_vectors=max(mode.vectors_for(1), 2 * mode.vectors))


def native_dot_mode(flags: Set[str]) -> DotMode | None:
    """The first registered mode whose instructions the CPU has, or None (no VNNI: AVX2 kernels)."""
    for mode in DOT_MODES.values():
        if mode.needs <= flags:
            return mode
    return None


def dot_mode(name: str) -> DotMode:
    """The registered mode `name`; a clear error naming the choices otherwise."""
    if name not in DOT_MODES:
        raise ValueError(f"unknown VNNI dot mode {name!r}; choose from {sorted(DOT_MODES)}")
    return DOT_MODES[name]


def _native_prelude(mode: DotMode) -> str:
    if mode.lanes == 16:
        return c_fill("vnni_512.c", intrinsic=mode.intrinsic)
    return c_fill("vnni_256.c", intrinsic=mode.intrinsic)


def _emulated_prelude(lanes: int) -> str:
    # exact vpdpbusd in portable C: per int32 lane, 4 u8 x s8 products added in int32
    return c_fill("vnni_emulated.c", bytes=4 * lanes, lanes=lanes)


def vnni_prelude(mode: DotMode, emulate: bool) -> str:
    """The C that defines VI, VZERO, VLOAD, VBCAST, vdot and vhalf for `mode` (portable when `emulate`)."""
    return _emulated_prelude(mode.lanes) if emulate else _native_prelude(mode)


def vnni_tile(r: int, act: str, mode: DotMode) -> str:
    """One register tile: r output rows x mode.vectors vectors of mode.lanes rows of M."""
    v, lanes = mode.vectors_for(r), mode.lanes
    cells = [(i, j) for i in range(r) for j in range(v)]
    acc = " ".join(f"VI a{i}{j} = first ? VZERO() : VLOAD({int32_slot(i, str(j * lanes))});" for i, j in cells)
    spill = " ".join(f"VSTORE({int32_slot(i, str(j * lanes))}, a{i}{j});" for i, j in cells)
    loads = " ".join(f"const VI x{j} = VLOAD(x + {j * lanes * 4});" for j in range(v))
    dots = " ".join(f"{{ const VI b = VBCAST(w[{i}]); "
                    + " ".join(f"a{i}{j} = vdot(a{i}{j}, x{j}, b);" for j in range(v)) + " }"
                    for i in range(r))
    stores = " ".join(
        f"{{ vf v = __builtin_convertvector(vhalf(a{i}{j}, {h}) - corr[n0 + {i}], vf)"
        f" * LD(sx + t + {j * lanes + 8 * h}) * ws[n0 + {i}] + bias_of(bias, n0 + {i}); {_ACTIVATIONS[act]} "
        f"ST(yb + (n0 + {i}) * TILE + t + {j * lanes + 8 * h}, v); }}"
        for i, j in cells for h in range(lanes // 8))
    return qtile(r, "uint8_t", 4, acc=acc, body=f"{loads}\n            {dots}", stores=stores, spill=spill)
