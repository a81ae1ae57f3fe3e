"""Weights that read few bytes a step: a quantized weight's integer codes, recovered from its values, and packed.

A quantizer (GPTQ, the uniform quantizers, `quantize_output_head`) leaves a weight on grids:
per group of `group` input columns of a row, `2^bits` evenly spaced levels. The model holds
the de-quantized values, so the grids are read back from them: per group, the smallest gap
between distinct values (or a fraction of it) is the step, the group's minimum the offset,
and every value must sit on `offset + step * code` with `code < 2^bits`. A weight that is not
on such grids stays float32: packing never changes what a weight computes beyond rounding.

Layouts the decode kernels read (`templates/decode_step.c`):

* `f32`: the rows as they are;
* `u8`: one signed byte a column, the code - 128 (signed bytes meet int8 activations in
  `vpmaddubsw` through the sign trick), rows of a multiple of 32 columns;
* `u4`: 32 bytes a run of 64 columns, byte j holding column j (low nibble) and j + 32 (high),
  so a mask and a shift give 32 consecutive columns' codes in order;
* `s32`: a pruned weight off any grid (at most `bitmask_rows.MAX_DENSITY` kept), its kept float32 values and a
  mask bit a column (`bitmask_rows.py`);
* either in tiles (`PackedWeight.to_tiles`, `tiled`), the layout int8 activations read: rows in
  tiles of `TILE`, each 4-column chunk of a tile's rows one 32-byte vector (row i's four at 4i).
  A weight is held in one layout at a time; `codes()` reads either.

Both keep a (scale, offset) pair per group of a multiple of 32 columns (or one per row), in
float16 where every value still lands within `TOLERANCE` of the weight (a GGUF's Q4_1 and Q8_0
blocks: their scales are float16 to begin with) and the CPU converts halves (F16C), else in
float32. An 8-bit symmetric grid (Q8_0) is first re-centred so code 128 is zero: its offset,
-128 x scale, is then a float16 as exact as the scale. The grids of a 4-bit g32 weight are a
third of its bytes in float32, a fifth in float16.

Example:
    >>> w = torch.tensor([[0.0, 0.5, 1.0, 1.5] * 8])
    >>> packed = pack_weight(w)
    >>> packed.fmt, packed.bits, packed.group, torch.equal(packed.dequantize(), w)
    ('u8', 4, 32, True)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from sparta_explore.kernels.bitmask_rows import bitmask_rows, dense_rows, fits_bitmask
from sparta_explore.kernels.build import cpu_flags

FORMATS = ("f32", "u8", "u4", "s32")
WIDTH = {"u8": 8, "u4": 4}  # bits a code takes in its word
TRIES = ((4, None), (4, 128), (4, 64), (4, 32), (8, None), (8, 128), (8, 64), (8, 32))  # (bits, group: None = row)
SAMPLE_ROWS = 8  # rows a grid is tried on before the whole weight (a float weight fails them at once)
STEP_FRACTIONS = (1, 2, 3, 4)  # the smallest gap may be several steps when levels are skipped
TOLERANCE = 1e-4  # of a group's largest magnitude: fp32 rounding of scale * (q - zero) stays far below
TILE = 8  # weight rows a tile holds (decode_rows.c's TILE)
TILE_RUN = 32  # columns a tile's run spans: 8 chunks of 4 (decode_rows.c's QBLOCK)


@dataclass(frozen=True)
class PackedWeight:
    """One (n, k) weight in a decode layout: `fmt` in FORMATS, `bits` (32 for f32 and s32), `group` columns per
    (scale, offset); `data` is the f32 rows, the s32 kept values (with `mask` and `starts`) or the codes (in
    rows, or in tiles of `TILE` rows when `tiles`), `scale` / `offset` (n, groups), float32 or float16."""

    fmt: str
    n: int
    k: int
    bits: int
    group: int
    data: torch.Tensor
    scale: torch.Tensor | None = None
    offset: torch.Tensor | None = None
    tiles: bool = False
    mask: torch.Tensor | None = None
    starts: torch.Tensor | None = None

    @property
    def has_codes(self) -> bool:
        """Whether the weight is held as integer codes on grids (u8, u4), not as float32 values."""
        return self.fmt in WIDTH

    @property
    def can_tile(self) -> bool:
        """Whether the codes can be held in tiles: a quantized weight of whole 32-column runs."""
        return self.has_codes and self.k % TILE_RUN == 0

    def to_tiles(self) -> PackedWeight:
        """The same weight with its codes in tiles of `TILE` rows (`tiled`); itself if already so or `can_tile`
        is false.

        Example:
            >>> w = pack_weight(torch.arange(64.0).expand(8, 64) % 16)
            >>> w.to_tiles().tiles, torch.equal(w.to_tiles().dequantize(), w.dequantize())
            (True, True)
        """
        if self.tiles or not self.can_tile:
            return self
        return replace(self, data=tiled(self.codes(), self.fmt), tiles=True)

    def to_rows(self) -> PackedWeight:
        """The same weight with its codes in rows (`fmt`'s layout); itself if already so.

        Example:
            >>> w = pack_weight(torch.arange(64.0).expand(8, 64) % 16)
            >>> torch.equal(w.to_tiles().to_rows().data, w.data)
            True
        """
        return replace(self, data=_pack(self.codes(), self.fmt), tiles=False) if self.tiles else self

    @property
    def groups(self) -> int:
        """Groups per row (the last may be shorter)."""
        return -(-self.k // self.group)

    @property
    def nbytes(self) -> int:
        """Bytes a step reads for this weight: codes or values, plus scales and offsets."""
        extra = 0 if self.scale is None else 2 * self.scale.numel() * self.scale.element_size()
        extra += sum(t.numel() * t.element_size() for t in (self.mask, self.starts) if t is not None)
        return self.data.numel() * self.data.element_size() + extra

    @property
    def half_grids(self) -> bool:
        """Whether the scales and offsets are float16."""
        return self.scale is not None and self.scale.dtype == torch.float16

    def codes(self) -> torch.Tensor:
        """The integer codes (n, k) as uint8 (0 .. 2^bits - 1), unpacked from the layout; an f32 or s32 weight has
        none."""
        if not self.has_codes:
            raise ValueError(f"an {self.fmt} weight has no codes")
        if self.tiles:
            return untiled(self.data, self.fmt, self.n, self.k)
        if self.fmt == "u8":
            return (self.data.to(torch.int16) + 128).to(torch.uint8)
        runs = self.data.reshape(self.n, self.k // 64, 32)
        return torch.cat([runs & 15, runs >> 4], dim=2).reshape(self.n, self.k)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight the kernels compute with: `scale * code + offset` per group.

        Example:
            >>> pack_weight(torch.tensor([[1.0, 2.0]]), bits=32).dequantize().tolist()
            [[1.0, 2.0]]
        """
        if self.fmt == "f32":
            return self.data
        if self.fmt == "s32":
            return dense_rows(self.data, self.mask, self.starts, self.k)
        per_column = torch.arange(self.k) // self.group
        return self.scale.float()[:, per_column] * self.codes().float() + self.offset.float()[:, per_column]


def tiled(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """(n, k) codes (uint8, below 16 for "u4"; k a multiple of 32) of layout `fmt`, in decode_rows.c's tiles
    (`tile_int8`): rows in tiles of `TILE` (the last padded with zero codes); per tile and 32-column run, chunk c
    of 4 columns as 32 bytes, row i's four at 4i. "u8" codes are stored as code - 128; "u4" chunks c and c + 4
    share bytes (low, high nibble).

    Example:
        >>> tiled(torch.arange(32, dtype=torch.uint8).expand(8, 32) % 16, "u4")[:8].tolist()
        [0, 17, 34, 51, 0, 17, 34, 51]
    """
    n, k = codes.shape
    padded = torch.zeros(-(-n // TILE) * TILE, k, dtype=torch.int16)
    padded[:n] = codes.to(torch.int16)
    # (tile, row, run, chunk, column) -> (tile, run, chunk, row, column)
    chunks = padded.reshape(-1, TILE, k // TILE_RUN, 8, 4).permute(0, 2, 3, 1, 4)
    if fmt == "u8":
        return (chunks - 128).to(torch.int8).contiguous().reshape(-1)
    return (chunks[:, :, :4] | (chunks[:, :, 4:] << 4)).to(torch.uint8).contiguous().reshape(-1)


def untiled(data: torch.Tensor, fmt: str, n: int, k: int) -> torch.Tensor:
    """The (n, k) uint8 codes that `tiled(codes, fmt)` laid out as `data`.

    Example:
        >>> codes = torch.randint(0, 16, (9, 64), dtype=torch.uint8)
        >>> torch.equal(untiled(tiled(codes, "u4"), "u4", 9, 64), codes)
        True
    """
    tiles, runs = -(-n // TILE), k // TILE_RUN
    if fmt == "u8":
        chunks = data.to(torch.int16).reshape(tiles, runs, 8, TILE, 4) + 128
    else:
        packed = data.reshape(tiles, runs, 4, TILE, 4)
        chunks = torch.cat([packed & 15, packed >> 4], dim=2)
    # (tile, run, chunk, row, column) -> (tile, row, run, chunk, column)
    return chunks.permute(0, 3, 1, 2, 4).reshape(tiles * TILE, k)[:n].to(torch.uint8).contiguous()


def _group_view(w: torch.Tensor, group: int) -> torch.Tensor:
    """(n, groups, group) with the ragged last group padded by repeating its first value (no new level)."""
    n, k = w.shape
    pad = -k % group
    if pad:
        last = w[:, k - (k % group):k - (k % group) + 1].expand(n, pad)
        w = torch.cat([w, last], dim=1)
    return w.reshape(n, -1, group)


def recover_grid(w: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Codes (n, k) uint8, scale and offset (n, groups) with `scale * code + offset` == `w` within
    `TOLERANCE`, codes below 2^bits; None when `w` is not on such grids.

    Example:
        >>> codes, scale, offset = recover_grid(torch.tensor([[-0.5, 0.0, 1.0]]), 2, 3)
        >>> codes.tolist(), scale.tolist(), offset.tolist()
        ([[0, 1, 3]], [[0.5]], [[-0.5]])
    """
    n, k = w.shape
    levels = (1 << bits) - 1
    g = _group_view(w.float(), group)
    ordered = g.sort(dim=2).values
    low, high = ordered[..., 0], ordered[..., -1]
    gaps = ordered.diff(dim=2)
    gaps = torch.where(gaps > 0, gaps, torch.full_like(gaps, float("inf"))).min(dim=2).values
    span = high - low
    flat = torch.isinf(gaps)  # one value: any step, code 0
    limit = TOLERANCE * torch.maximum(high.abs(), low.abs()).clamp_min(torch.finfo(torch.float32).tiny)
    best_codes = best_scale = None
    fits = torch.zeros_like(low, dtype=torch.bool)
    # steps: the smallest gap or a fraction of it (levels skipped); or the whole range over the top code (a
    # min-max grid puts the group's extremes at codes 0 and 2^bits - 1; a symmetric one at 1 and 2^bits - 1)
    tops = [torch.round(span / gaps * f) for f in STEP_FRACTIONS]
    tops += [torch.full_like(span, t) for t in (levels, levels - 1)]
    for top in tops:
        top = torch.where(flat, torch.zeros_like(span), top)
        scale = torch.where(top > 0, span / top.clamp_min(1), torch.ones_like(span))
        codes = torch.round((g - low[..., None]) / scale[..., None])
        error = (codes * scale[..., None] + low[..., None] - g).abs().amax(dim=2)
        ok = (error <= limit) & (top <= levels)
        new = ok & ~fits
        best_codes = codes if best_codes is None else torch.where(new[..., None], codes, best_codes)
        best_scale = scale if best_scale is None else torch.where(new, scale, best_scale)
        fits |= ok
        if bool(fits.all()):
            break
    if not bool(fits.all()):
        return None
    codes = best_codes.reshape(n, -1)[:, :k].to(torch.uint8)
    # a group of one value is all offset: scale 0, so no kernel adds and subtracts large code terms for it
    return codes, torch.where(flat, torch.zeros_like(best_scale), best_scale).contiguous(), low.contiguous()


@functools.cache
def converts_halves() -> bool:
    """Whether this CPU converts float16 grids in registers (F16C; every AVX2 + FMA CPU has it).

    Example:
        >>> isinstance(converts_halves(), bool)
        True
    """
    return "f16c" in cpu_flags()


def _recentred(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int, group: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An 8-bit grid whose zero is a level (offset = -z x scale) moved, group by group, so code 128 is zero; a
    group of zeros (scale 0) reads 128 too; any other group stays as it was."""
    if bits != 8:
        return codes, scale, offset
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-offset / safe)  # the code that is 0.0
    per_column = torch.arange(codes.shape[1]) // group
    moved = codes.to(torch.int16) + (128 - zero).to(torch.int16)[:, per_column]
    lowest = torch.full_like(scale, 256.0).scatter_reduce(1, per_column.expand_as(moved), moved.float(), "amin")
    highest = torch.full_like(scale, -1.0).scatter_reduce(1, per_column.expand_as(moved), moved.float(), "amax")
    ok = (scale > 0) & ((offset + zero * scale).abs() <= TOLERANCE * scale) & (lowest >= 0) & (highest <= 255)
    zeros = (scale == 0) & (offset == 0)
    new_codes = torch.where(ok[:, per_column], moved, torch.where(zeros[:, per_column], 128, codes.to(torch.int16)))
    return new_codes.to(torch.uint8), scale, torch.where(ok | zeros, -128 * scale, offset)


def _half_grids(w: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group: int
                ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(scale, offset) as float16 when every value of `w` stays within `TOLERANCE` of its group's largest
    magnitude with them (as `recover_grid` asks of the float32 ones), else None."""
    s16, o16 = scale.half(), offset.half()
    if not (torch.isfinite(s16).all() and torch.isfinite(o16).all()):
        return None
    n, k = w.shape
    per_column = torch.arange(k) // group
    values = s16.float()[:, per_column] * codes.float() + o16.float()[:, per_column]
    g = _group_view(w.float(), group)
    limit = TOLERANCE * g.abs().amax(dim=2).clamp_min(torch.finfo(torch.float32).tiny)
    error = _group_view((values - w).abs(), group).amax(dim=2)
    return (s16.contiguous(), o16.contiguous()) if bool((error <= limit).all()) else None


def _pack(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """(n, k) codes in `fmt`'s layout (module docstring)."""
    n, k = codes.shape
    if fmt == "u8":
        return (codes.to(torch.int16) - 128).to(torch.int8).contiguous()
    runs = codes.reshape(n, k // 64, 2, 32)
    return (runs[:, :, 0] | (runs[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def _layout(bits: int, k: int, group: int) -> str | None:
    for fmt, run in (("u4", 64), ("u8", 32)):
        if bits <= WIDTH[fmt] and k % run == 0 and (group % 32 == 0 or group == k):
            return fmt
    return None


def pack_weight(w: torch.Tensor, bits: int | None = None, group: int | None = None, half: bool | None = None
                ) -> PackedWeight:
    """`w` (n, k) in the narrowest layout its values fit: given `bits` / `group` (None: per row), or the
    first of `TRIES` whose grids hold every value; else s32 where at most `bitmask_rows.MAX_DENSITY` of it is kept, else
    f32. `bits=32` keeps it f32. `half`: float16 grids where they fit (None: where this CPU converts them,
    `converts_halves`; False: never).

    Example:
        >>> pack_weight(torch.randn(4, 64)).fmt
        'f32'
    """
    w = w.detach().float().contiguous()
    n, k = w.shape
    tries = [(bits, group)] if bits is not None else list(TRIES)
    for b, g in tries:
        g = k if g is None or g >= k else int(g)
        fmt = _layout(b, k, g) if b <= 8 else None
        if fmt is None or (len(tries) > 1 and n > SAMPLE_ROWS and recover_grid(w[:SAMPLE_ROWS], b, g) is None):
            continue
        grid = recover_grid(w, b, g)
        if grid is None:
            continue
        codes, scale, offset = _recentred(*grid, b, g)
        if half if half is not None else converts_halves():
            scale, offset = _half_grids(w, codes, scale, offset, g) or (scale, offset)
        return PackedWeight(fmt, n, k, b, g, _pack(codes, fmt), scale, offset)
    if bits is None and fits_bitmask(w):  # pruned, off any grid: the kept values and a bit a column
        values, mask, starts = bitmask_rows(w)
        return PackedWeight("s32", n, k, 32, k, values, mask=mask, starts=starts)
    return PackedWeight("f32", n, k, 32, k, w)
