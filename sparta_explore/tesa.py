"""TeSA: a tensor's sparsity attribute (per element: kept or pruned, bit width, format).

A TeSA sits beside a real tensor and has its shape (activations may keep batch dims at
size 1, which broadcast). Each element carries a bit width, 0 meaning pruned and 1..32
meaning kept at that many bits, and a number format (float, int, uint, bfloat).

`merge` is the meet of a semilattice: pruned wins, fewer bits win. It is the lexicographic
minimum of the pair (bits, format rank), with pruned elements normalised to one format, so
it is commutative, associative and idempotent; that is why propagation terminates.

`group`: how kept elements share an integer grid. 0: one scale per row (per output row of a
weight, per token of an activation), as the int8 kernels compute; g > 0: a grid per run of g
elements along the last dim, as GPTQ emits (the tensor holds the de-quantized values). Its
meet is the gcd (0 is the identity); ops that keep the values (prune, select) keep it.

Storage: one uint8 per element, ``key = bits * 4 + format rank`` (at most 131), so the
meet is a single elementwise `torch.minimum` and pruned is ``key == 0``. A key constant
along some dims (every sample and token alike) is kept as a stride-0 broadcast of its core
(`sparta_explore.compact`): attributes of batch x tokens activations cost one row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import IntEnum

import numpy as np
import torch

from sparta_explore.compact import any_true, byte_counts, core, count_true, equal, keep_where, negate, spread
from sparta_explore.errors import TeSABitsError, TeSAShapeError
from sparta_explore.tesa_blocks import kept_block_mask

MAX_BITS = 32


class NumberFormat(IntEnum):
    """How a kept element's bits are interpreted.

    The integer value is the rank used by `TeSA.merge` to break ties between equal bit
    widths: the lower rank (the more restrictive format) wins.
    """

    INT = 0
    UINT = 1
    BFLOAT = 2
    FLOAT = 3

    @classmethod
    def parse(cls, value: NumberFormat | str | int) -> NumberFormat:
        """Accept a `NumberFormat`, its name ("int", "float", ...) or its code.

        Example:
            >>> NumberFormat.parse("uint")
            <NumberFormat.UINT: 1>
        """
        if isinstance(value, NumberFormat):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                names = ", ".join(f.name.lower() for f in cls)
                raise TeSABitsError(f"unknown number format {value!r}; expected one of {names}") from None
        try:
            return cls(int(value))
        except ValueError:
            raise TeSABitsError(f"unknown number format code {value!r}") from None


Shape = tuple[int, ...]


def _check_bits(bits: int, what: str) -> int:
    if not isinstance(bits, int) or isinstance(bits, bool) or not 0 <= bits <= MAX_BITS:
        raise TeSABitsError(f"{what}: bit width must be an int in 0..{MAX_BITS}, got {bits!r}")
    return bits


class TeSA:
    """The sparsity attribute of one tensor.

    Attributes are read-only; every operation returns a new TeSA.

    Example:
        >>> a = TeSA.from_mask(torch.tensor([[1, 0], [1, 1]]), bits=8)
        >>> a.sparsity
        0.25
        >>> a.merge(TeSA.dense((2, 2), bits=4)).bit_histogram()
        {0: 1, 4: 3}
    """

    __slots__ = ("_key", "_counts", "_group")  # `_counts`: the key histogram, computed once (a TeSA never changes)
    __hash__ = None  # mutable tensors inside; equality is by value

    def __init__(self, bits: torch.Tensor, fmt: torch.Tensor | NumberFormat | str = NumberFormat.FLOAT,
                 *, name: str = "TeSA") -> None:
        """Build from a bit-width tensor (0 = pruned) and a format (tensor of codes or one format).

        Example:
            >>> TeSA(torch.tensor([0, 8, 8], dtype=torch.uint8), "int").sparsity
            0.3333333333333333
        """
        if not isinstance(bits, torch.Tensor):
            raise TeSABitsError(f"{name}: bits must be a torch.Tensor, got {type(bits).__name__}")
        if bits.is_floating_point() or bits.is_complex() or bits.dtype == torch.bool:
            raise TeSABitsError(f"{name}: bits must be an integer tensor, got {bits.dtype}")
        if bits.numel() and (int(bits.min()) < 0 or int(bits.max()) > MAX_BITS):
            raise TeSABitsError(
                f"{name}: bit widths must lie in 0..{MAX_BITS}, got range "
                f"{int(bits.min())}..{int(bits.max())}")
        bits = bits.detach().to(device="cpu", dtype=torch.uint8)
        if isinstance(fmt, torch.Tensor):
            if fmt.shape != bits.shape:
                raise TeSAShapeError(
                    f"{name}: format tensor has shape {tuple(fmt.shape)}, bits have {tuple(bits.shape)}")
            if fmt.numel() and int(fmt.max()) > max(NumberFormat):
                raise TeSABitsError(f"{name}: unknown number format code {int(fmt.max())}")
            fmt = fmt.detach().to(device="cpu", dtype=torch.uint8)
            key = bits * 4 + fmt
        else:
            key = bits * 4 + int(NumberFormat.parse(fmt))
        # Pruned elements carry no format; normalising them keeps merge a true meet and
        # makes equality ignore what a pruned element "was".
        self._key = key.masked_fill_(bits == 0, 0)

    @classmethod
    def _from_key(cls, key: torch.Tensor, group: int = 0) -> TeSA:
        """Wrap an already valid key tensor (internal fast path: no checks, no copy)."""
        out = cls.__new__(cls)
        out._key = key
        if group:  # unset (read as 0) on most TeSAs
            out._group = group
        return out

    @property
    def group(self) -> int:
        """Elements per grid along the last dim (0: one grid per row). See the module docstring."""
        return getattr(self, "_group", 0)

    def with_group(self, group: int) -> TeSA:
        """A copy whose kept elements sit on grids of `group` consecutive elements (0: per row).

        Example:
            >>> TeSA.dense((2, 256), bits=4, fmt="uint").with_group(128).group
            128
        """
        if not isinstance(group, int) or isinstance(group, bool) or group < 0:
            raise TeSABitsError(f"TeSA.with_group: group must be an int >= 0, got {group!r}")
        return TeSA._from_key(self._key, group)

    # ---- constructors -------------------------------------------------------------
    @classmethod
    def dense(cls, shape: Sequence[int] | torch.Size, bits: int = MAX_BITS,
              fmt: NumberFormat | str = NumberFormat.FLOAT) -> TeSA:
        """Every element kept at `bits` bits.

        Example:
            >>> TeSA.dense((3, 4), bits=8).bit_histogram()
            {8: 12}
        """
        _check_bits(bits, "TeSA.dense")
        key = bits * 4 + int(NumberFormat.parse(fmt)) if bits else 0
        # one stored element, broadcast (stride 0): a dense batch x tokens x 3072 attribute costs nothing
        return cls._from_key(torch.full((1,) * len(tuple(shape)), key, dtype=torch.uint8).expand(tuple(shape)))

    @classmethod
    def from_mask(cls, mask: torch.Tensor, bits: int = MAX_BITS,
                  fmt: NumberFormat | str = NumberFormat.FLOAT) -> TeSA:
        """Kept where `mask` is non-zero (or True), pruned where it is zero.

        Example:
            >>> TeSA.from_mask(torch.tensor([1.0, 0.0])).pruned
            tensor([False,  True])
        """
        if not isinstance(mask, torch.Tensor):
            raise TeSABitsError(f"TeSA.from_mask: mask must be a torch.Tensor, got {type(mask).__name__}")
        _check_bits(bits, "TeSA.from_mask")
        kept = core(mask.detach().cpu()).bool()  # `!= 0` (torch's is 20x slower); an expanded mask stays compact
        key = kept.to(torch.uint8) * (bits * 4 + int(NumberFormat.parse(fmt)) if bits else 0)
        return cls._from_key(spread(key, mask.shape))

    # ---- views -------------------------------------------------------------------
    @property
    def bits(self) -> torch.Tensor:
        """uint8 tensor of bit widths; 0 means pruned. A new tensor: TeSAs are immutable."""
        return self._key >> 2

    @property
    def fmt(self) -> torch.Tensor:
        """uint8 tensor of `NumberFormat` codes (0 where pruned)."""
        return self._key & 3

    @property
    def pruned(self) -> torch.Tensor:
        """bool tensor, True where the element is pruned (read-only: may be a broadcast view)."""
        return spread(~core(self._key).bool(), self._key.shape)  # bool(): torch's `== 0` is 15x slower

    @property
    def kept(self) -> torch.Tensor:
        """bool tensor, True where the element is kept (read-only: may be a broadcast view)."""
        return spread(core(self._key).bool(), self._key.shape)  # bool() is `!= 0`, 20x faster

    @property
    def shape(self) -> Shape:
        return tuple(self._key.shape)

    @property
    def numel(self) -> int:
        return self._key.numel()

    def _key_counts(self) -> tuple[int, ...]:
        # bincount over the 132 possible keys: one pass, no sort (torch.unique sorts); on the core,
        # scaled by how many times a broadcast key repeats it. Kept: planning and the references ask the
        # same TeSAs for their bits thousands of times (BERT-base: 2300 calls, 1.3 s)
        counts = getattr(self, "_counts", None)  # unset on a new or unpickled TeSA
        if counts is None:
            c = core(self._key)
            repeat = self._key.numel() // c.numel() if c.numel() else 0
            counts = tuple(n * repeat for n in byte_counts(c, MAX_BITS * 4 + 4))
            self._counts = counts
        return counts

    @property
    def sparsity(self) -> float:
        """Fraction of pruned elements (0.0 for an empty tensor)."""
        n = self._key.numel()
        return count_true(self.pruned) / n if n else 0.0

    @property
    def density(self) -> float:
        """Fraction of kept elements."""
        return 1.0 - self.sparsity if self._key.numel() else 0.0

    def formats(self) -> set[NumberFormat]:
        """The number formats used by kept elements."""
        counts = self._key_counts()
        return {NumberFormat(k & 3) for k, c in enumerate(counts) if c and k >= 4}

    def kept_bits(self) -> list[int]:
        """Sorted distinct bit widths among kept elements.

        Example:
            >>> TeSA(torch.tensor([0, 4, 8, 8])).kept_bits()
            [4, 8]
        """
        return [b for b, c in self.bit_histogram().items() if b and c]

    def bit_histogram(self) -> dict[int, int]:
        """Number of elements per bit width, pruned elements under 0, ordered by width.

        Example:
            >>> TeSA(torch.tensor([0, 8, 8])).bit_histogram()
            {0: 1, 8: 2}
        """
        counts = self._key_counts()
        hist: dict[int, int] = {}
        for key, c in enumerate(counts):
            if c:
                hist[key >> 2] = hist.get(key >> 2, 0) + c
        return hist

    def mean_bits(self) -> float:
        """Average bit width over all elements (pruned count as 0): storage per element."""
        n = self._key.numel()
        return sum(b * c for b, c in self.bit_histogram().items()) / n if n else 0.0

    # ---- blocks ------------------------------------------------------------------
    def block_mask(self, block: Sequence[int]) -> torch.Tensor:
        """bool tensor over the block grid of the trailing dims: True where a block holds a kept element.

        Example:
            >>> TeSA.from_mask(torch.eye(4)).block_mask((2, 2))
            tensor([[ True, False],
                    [False,  True]])
        """
        return kept_block_mask(self.kept, block, self.shape)

    def block_density(self, block: Sequence[int]) -> float:
        """Fraction of blocks of shape `block` that hold at least one kept element.

        Example:
            >>> TeSA.from_mask(torch.eye(4)).block_density((2, 2))
            0.5
        """
        grid = self.block_mask(block)
        return float(grid.float().mean()) if grid.numel() else 0.0

    # ---- algebra -----------------------------------------------------------------
    def merge(self, other: TeSA) -> TeSA:
        """Meet of two attributes: pruned wins, then fewer bits, then the lower-ranked format.

        Shapes must be equal or broadcast (a size-1 dim stands for any size).

        Example:
            >>> TeSA.dense((2,), bits=8).merge(TeSA.from_mask(torch.tensor([0, 1]), bits=16)).bits
            tensor([0, 8], dtype=torch.uint8)
        """
        if not isinstance(other, TeSA):
            raise TypeError(f"TeSA.merge needs a TeSA, got {type(other).__name__}")
        try:
            small = torch.minimum(core(self._key), core(other._key))
            shape = torch.broadcast_shapes(self._key.shape, other._key.shape)
            # the finer grid wins: a run of gcd(a, b) elements lies inside one grid of each
            return TeSA._from_key(spread(small, shape), math.gcd(self.group, other.group))
        except RuntimeError:
            raise TeSAShapeError(f"cannot merge TeSAs of shapes {self.shape} and {other.shape}") from None

    def prune(self, mask: torch.Tensor) -> TeSA:
        """A copy with the elements where `mask` is True also pruned."""
        try:
            mask = mask.cpu()
            if torch.broadcast_shapes(self._key.shape, mask.shape) != self._key.shape:
                raise RuntimeError("mask larger than the TeSA")
            return TeSA._from_key(keep_where(self._key, negate(mask.bool())), self.group)
        except RuntimeError:
            raise TeSAShapeError(f"prune mask of shape {tuple(mask.shape)} does not fit TeSA {self.shape}") from None

    def with_bits(self, bits: int, fmt: NumberFormat | str | None = None) -> TeSA:
        """A copy whose kept elements all use `bits` bits (and `fmt`, if given); pruned stay pruned.

        Example:
            >>> TeSA.from_mask(torch.tensor([1, 0])).with_bits(8, "int").bit_histogram()
            {0: 1, 8: 1}
        """
        _check_bits(bits, "TeSA.with_bits")
        c = core(self._key)
        if not bits:
            return TeSA._from_key(spread(torch.zeros_like(c), self._key.shape), self.group)
        key = (c & 3) + bits * 4 if fmt is None else torch.full_like(c, bits * 4 + int(NumberFormat.parse(fmt)))
        return TeSA._from_key(spread(key.mul_(c.bool().view(torch.uint8)), self._key.shape), self.group)  # 0: pruned

    def expand(self, shape: Sequence[int]) -> TeSA:
        """Broadcast size-1 dims to `shape` (for activations kept at batch size 1)."""
        try:
            return TeSA._from_key(self._key.expand(tuple(shape)), self.group)
        except RuntimeError:
            raise TeSAShapeError(f"TeSA of shape {self.shape} cannot broadcast to {tuple(shape)}") from None

    def select(self, dim: int, index: torch.Tensor) -> TeSA:
        """The attribute of the tensor's elements at `index` along `dim` (what a shrunk tensor keeps).

        A broadcast (size-1 or stride-0) `dim` stays compact.

        Example:
            >>> TeSA.from_mask(torch.tensor([[1, 0, 1]])).select(1, torch.tensor([0, 2])).sparsity
            0.0
        """
        c = core(self._key)
        dim = dim % len(self.shape)
        index = index.to(torch.long).cpu()
        shape = list(self.shape)
        shape[dim] = len(index)
        if c.shape[dim] == 1:
            small = c
        elif dim == 0:
            small = c.index_select(0, index)
        else:  # NumPy gathers bytes along an inner dim 4x faster than torch's index_select (BERT 3072 x 768: 1.2 ms)
            small = torch.from_numpy(np.take(c.numpy(), index.numpy(), axis=dim))
        return TeSA._from_key(spread(small, shape), self.group)

    def channels_kept(self, dim: int) -> torch.Tensor:
        """Bool per index of `dim`: whether any element there is kept.

        Example:
            >>> TeSA.from_mask(torch.tensor([[1, 0, 0], [1, 0, 1]])).channels_kept(1).tolist()
            [True, False, True]
        """
        c = core(self._key).bool()
        dim = dim % len(self.shape)
        other = [d for d in range(c.dim()) if d != dim]
        kept = any_true(c, dim=other[0], keepdim=True) if other else c
        for d in other[1:]:
            kept = any_true(kept, dim=d, keepdim=True)
        return kept.reshape(-1).expand(self.shape[dim]) if kept.numel() == 1 else kept.reshape(-1)

    def fits(self, shape: Sequence[int]) -> bool:
        """True if this TeSA describes a tensor of `shape` (equal dims, or size 1 here)."""
        shape = tuple(shape)
        return len(shape) == len(self.shape) and all(a in (b, 1) for a, b in zip(self.shape, shape))

    def check_fits(self, shape: Sequence[int], name: str) -> None:
        """Raise `TeSAShapeError` naming `name` unless this TeSA fits a tensor of `shape`."""
        if not self.fits(shape):
            raise TeSAShapeError(f"TeSA for {name!r} has shape {self.shape}, tensor has {tuple(shape)}")

    # ---- comparison and display ----------------------------------------------------
    def equals(self, other: TeSA) -> bool:
        """Same shape, same bits and formats everywhere, same grid groups."""
        return (isinstance(other, TeSA) and self.shape == other.shape and self.group == other.group
                and equal(self._key, other._key))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TeSA) and self.equals(other)

    def __repr__(self) -> str:
        fmts = "/".join(sorted(f.name.lower() for f in self.formats())) or "-"
        return (f"TeSA(shape={self.shape}, sparsity={self.sparsity:.3f}, "
                f"bits={self.kept_bits() or [0]}, fmt={fmts}" + (f", group={self.group})" if self.group else ")"))
