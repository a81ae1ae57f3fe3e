"""Uniform integer grids per group of input columns: what GPTQ (and SparseGPT's joint quantization) round onto.

A weight row's group of `group_size` consecutive input columns shares one grid,
`scale * (q - zero)` with integer codes `q` in `0 .. 2^bits - 1`. Symmetric grids put the
zero point in the middle, `2^(bits-1)`; asymmetric ones fit min..max (both always hold 0,
so a pruned weight stays exactly 0 once quantized). When `group_size` does not divide the
input width the last group is shorter (SmolLM2's 576 = 4 x 128 + 64), as in GPTQ's
reference code. `mse=True` shrinks each grid's range to the one with the least
`|w - q(w)|^2.4` among 80 candidates (100% .. 21% of it), as GPTQ's `Quantizer(mse=True)`:
clipping a few outliers buys a finer step for all the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparta_explore.errors import ConfigError


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize a weight: `bits` (2..8), `group_size` input columns per grid (None: a row), `sym`.

    Example:
        >>> QuantSpec(4, 128).maxq
        15
    """

    bits: int
    group_size: int | None = None
    sym: bool = False
    mse: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.bits, int) or isinstance(self.bits, bool) or not 2 <= self.bits <= 8:
            raise ConfigError(f"bits must be an int in 2..8, got {self.bits!r}")
        if self.group_size is not None and (not isinstance(self.group_size, int) or self.group_size < 1):
            raise ConfigError(f"group_size must be a positive int or None (one group per row), got "
                              f"{self.group_size!r}")

    @property
    def maxq(self) -> int:
        """The largest code, 2^bits - 1."""
        return 2 ** self.bits - 1

    def groups(self, columns: int) -> int:
        """How many groups an input width of `columns` has (the last one shorter when the size does not divide it).

        Example:
            >>> QuantSpec(4, 128).groups(576)
            5
        """
        return 1 if self.group_size is None else -(-columns // self.group_size)


def fit_grid(w: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (scale, zero) of the min-max grid over the columns of `w`, (rows, cols).

    The range always holds 0. A row of zeros gets the range [-1, 1], so its scale is not 0.
    With `spec.mse` the range is shrunk per row to the candidate with the least error (`SHRINKS`).

    Example:
        >>> scale, zero = fit_grid(torch.tensor([[-1.0, 0.5, 2.0]]), QuantSpec(2))
        >>> scale, zero
        (tensor([1.]), tensor([1.]))
    """
    xmin = w.min(dim=1).values.clamp(max=0)
    xmax = w.max(dim=1).values.clamp(min=0)
    if spec.sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = -xmax
    empty = (xmin == 0) & (xmax == 0)
    xmin = torch.where(empty, -torch.ones_like(xmin), xmin)
    xmax = torch.where(empty, torch.ones_like(xmax), xmax)
    scale, zero = _range_grid(xmin, xmax, spec)
    if spec.mse:
        scale, zero = _least_error_grid(w, xmin, xmax, scale, zero, spec)
    return scale, zero


SHRINKS = tuple(1 - i / 100 for i in range(80))  # candidate ranges: 100%, 99%, ... 21% of min..max (GPTQ's)
ERROR_NORM = 2.4  # GPTQ's: between squared error and max error, so outliers still count


def _range_grid(xmin: torch.Tensor, xmax: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (xmax - xmin) / spec.maxq
    zero = torch.full_like(scale, (spec.maxq + 1) / 2) if spec.sym else torch.round(-xmin / scale)
    return scale, zero


def _least_error_grid(w: torch.Tensor, xmin: torch.Tensor, xmax: torch.Tensor, scale: torch.Tensor,
                      zero: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    best = None
    err = torch.empty_like(w)
    for shrink in SHRINKS:
        s, z = _range_grid(xmin * shrink, xmax * shrink, spec)
        # clamp(round(w / s) + z, 0, maxq) - z as one clamp between per-row bounds (z is an integer), in place
        torch.div(w, s[:, None], out=err).round_()
        err.clamp_(min=-z[:, None], max=spec.maxq - z[:, None]).mul_(s[:, None]).sub_(w).abs_().pow_(ERROR_NORM)
        total = err.sum(1)
        if best is None:
            best, scale, zero = total, s, z
            continue
        better = total < best
        best = torch.where(better, total, best)
        scale, zero = torch.where(better, s, scale), torch.where(better, z, zero)
    return scale, zero


def quantize_to_grid(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """`w` rounded to its grid and de-quantized: `scale * (clamp(round(w / scale) + zero, 0, maxq) - zero)`.

    `scale` and `zero` broadcast against `w` (per row: shape (rows, 1) for an (rows, k) `w`).

    Example:
        >>> quantize_to_grid(torch.tensor([0.4, 0.6, 9.0]), torch.tensor(0.5), torch.tensor(1.0), 3)
        tensor([0.5000, 0.5000, 1.0000])
    """
    q = torch.clamp(torch.round(w / scale) + zero, 0, maxq)
    return scale * (q - zero)


@dataclass(frozen=True)
class GroupGrid:
    """The grids of one quantized (out, in) weight: `scale` and `zero` are (out, groups).

    Group g covers input columns `g * group_size .. (g + 1) * group_size` in the weight's own
    column order (GPTQ's activation order never scatters a group); the last one may be shorter. `codes(w)` gives the
    integer codes, `dequantize(codes)` the weight back; a weight on its grids round-trips.

    Example:
        >>> g = GroupGrid(torch.tensor([[0.5]]), torch.tensor([[1.0]]), bits=2, group_size=2, sym=False)
        >>> g.codes(torch.tensor([[0.5, -0.5]]))
        tensor([[2, 0]], dtype=torch.uint8)
        >>> g.dequantize(g.codes(torch.tensor([[0.5, -0.5]])))
        tensor([[ 0.5000, -0.5000]])
    """

    scale: torch.Tensor
    zero: torch.Tensor
    bits: int
    group_size: int
    sym: bool

    @property
    def maxq(self) -> int:
        """The largest code, 2^bits - 1."""
        return 2 ** self.bits - 1

    def _expand(self, t: torch.Tensor, columns: int) -> torch.Tensor:
        return t.repeat_interleave(self.group_size, dim=1)[:, :columns]

    def codes(self, weight: torch.Tensor) -> torch.Tensor:
        """The integer codes (uint8) of an (out, in) weight on these grids."""
        scale, zero = self._expand(self.scale, weight.shape[1]), self._expand(self.zero, weight.shape[1])
        q = torch.clamp(torch.round(weight.to(scale.dtype) / scale) + zero, 0, self.maxq)
        return q.to(torch.uint8)

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """The weight the codes stand for: `scale * (codes - zero)` per group."""
        columns = codes.shape[1]
        return self._expand(self.scale, columns) * (codes.to(self.scale.dtype) - self._expand(self.zero, columns))

    def on_grid(self, weight: torch.Tensor) -> bool:
        """Whether every element of `weight` is exactly a value of its group's grid.

        Example:
            >>> g = GroupGrid(torch.tensor([[0.5]]), torch.tensor([[1.0]]), bits=2, group_size=2, sym=False)
            >>> g.on_grid(torch.tensor([[0.5, -0.5]])), g.on_grid(torch.tensor([[0.4, -0.5]]))
            (True, False)
        """
        return bool((self.dequantize(self.codes(weight)) == weight).all())


def round_to_grids(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """`w` (rows, cols) rounded to nearest on each group's own grid (`fit_grid`): round-to-nearest, the
    quantization without calibration that GPTQ improves on.

    Example:
        >>> round_to_grids(torch.tensor([[0.0, 0.4, 1.0, 3.0]]), QuantSpec(2, 2)).tolist()
        [[0.0, 0.40000003576278687, 1.0, 3.0]]
    """
    size = spec.group_size or w.shape[1]
    parts = []
    for start in range(0, w.shape[1], size):
        block = w[:, start:start + size]
        scale, zero = fit_grid(block, QuantSpec(spec.bits, None, spec.sym, spec.mse))
        parts.append(quantize_to_grid(block, scale[:, None], zero[:, None], spec.maxq))
    return torch.cat(parts, dim=1)
