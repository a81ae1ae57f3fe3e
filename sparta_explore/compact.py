"""Broadcast-compact masks: a tensor constant along some dims is stored once and expanded (stride 0).

Most attributes of a transformer's activations are the same for every sample and token: a
batch x tokens x 3072 mask is one 3072-row repeated. Keeping such masks as stride-0
expansions of their *core* (the tensor with those dims at size 1) makes every elementwise
step of propagation cost the core's size instead of the full size. These helpers compute
on cores and expand the result, so a compact input stays compact; a full input simply
gives a full result. Values are never changed by compaction, only memory and time.

Example:
    >>> row = torch.tensor([True, False, True])
    >>> m = row.expand(4, 3)                   # 4 identical rows, 3 bools of memory
    >>> core(m).shape, either(m, ~row).shape   # cores computed on, results expanded
    (torch.Size([1, 3]), torch.Size([4, 3]))
    >>> count_true(m)
    8
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def core(t: torch.Tensor) -> torch.Tensor:
    """`t` with every stride-0 dim narrowed to size 1 (a view; `t` itself when nothing is expanded).

    Example:
        >>> core(torch.zeros(5).expand(2, 5)).shape
        torch.Size([1, 5])
    """
    if 0 not in t.stride() or not any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
        return t
    return t[tuple(slice(0, 1) if st == 0 and n > 1 else slice(None) for st, n in zip(t.stride(), t.shape))]


def any_true(mask: torch.Tensor, dim: int | tuple[int, ...] | None = None, keepdim: bool = False) -> torch.Tensor:
    """`mask.any(dim, keepdim)`, for a bool mask as the max of its bytes: torch 2.13's bool `any` on CPU takes
    30-150x as long (a 3072 x 768 mask along its rows: 2.8 ms against 0.03 ms; propagation and planning ask it
    thousands of times). Other dtypes, empty tensors and dims of size 0 go to `any` itself.

    Example:
        >>> any_true(torch.tensor([[True, False], [False, False]]), dim=1).tolist()
        [True, False]
        >>> bool(any_true(torch.zeros(0, 3, dtype=torch.bool)))
        False
    """
    dims = () if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
    if mask.dtype != torch.bool or mask.numel() == 0 or any(mask.shape[d] == 0 for d in dims):
        return mask.any() if dim is None else mask.any(dim=dim, keepdim=keepdim)
    as_bytes = mask.view(torch.uint8)  # bools are bytes 0 or 1: the same values, a vectorized reduction
    return (as_bytes.amax() if dim is None else as_bytes.amax(dim=dim, keepdim=keepdim)).bool()


def byte_counts(values: torch.Tensor, size: int) -> list[int]:
    """How many elements of the uint8 tensor `values` hold each value below `size`.

    Most TeSAs hold one kept key beside pruned zeros (a weight pruned at one width): three
    passes of NumPy over the bytes answer that, 20x faster than `torch.bincount` (which
    needs int32 values first: a BERT-base compile counted 700 TeSAs, half a second).

    Example:
        >>> byte_counts(torch.tensor([0, 131, 131], dtype=torch.uint8), 132)[131]
        2
    """
    flat = values.detach().contiguous().view(-1).numpy()
    counts = [0] * size
    top = int(flat.max()) if flat.size else 0
    kept = int(np.count_nonzero(flat))
    if kept == 0 or int(np.count_nonzero(flat == top)) == kept:
        counts[top] += kept
        counts[0] += flat.size - kept
        return counts
    return np.bincount(flat, minlength=size).tolist()


def spread(small: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """`small` broadcast to `shape` as a stride-0 view (no copy).

    Example:
        >>> spread(torch.ones(1, 2), (3, 2)).stride()
        (0, 1)
    """
    return small.expand(tuple(shape))


def _bytewise(op, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`op(a, b)` for two bool masks as bytes: torch 2.13's bool kernels broadcast along the last dim at a
    byte a step (a 3072 x 768 mask & a (3072, 1) column: 1.35 ms against 0.04 ms on uint8 views)."""
    if a.dtype == torch.bool and b.dtype == torch.bool:
        return op(a.view(torch.uint8), b.view(torch.uint8)).view(torch.bool)
    return op(a, b)


def both(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a & b` with broadcasting, computed on the cores.

    Example:
        >>> both(torch.tensor([True, True]).expand(3, 2), torch.tensor([[True], [False], [True]])).tolist()
        [[True, True], [False, False], [True, True]]
    """
    return spread(_bytewise(torch.bitwise_and, core(a), core(b)), torch.broadcast_shapes(a.shape, b.shape))


def either(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a | b` with broadcasting, computed on the cores.

    Example:
        >>> either(torch.tensor([True, False]).expand(2, 2), torch.tensor([False, True])).tolist()
        [[True, True], [True, True]]
    """
    return spread(_bytewise(torch.bitwise_or, core(a), core(b)), torch.broadcast_shapes(a.shape, b.shape))


def negate(a: torch.Tensor) -> torch.Tensor:
    """`~a` on the core.

    Example:
        >>> negate(torch.tensor([True, False]).expand(2, 2)).tolist()
        [[False, True], [False, True]]
    """
    return spread(~core(a), a.shape)


def keep_where(key: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """`key` where `kept` is True, 0 elsewhere (shape of `key`; `kept` broadcasts to it).

    Example:
        >>> keep_where(torch.tensor([4, 8]), torch.tensor([True, False])).tolist()
        [4, 0]
    """
    ck, cm = core(key), core(kept)
    if key.dtype == torch.uint8 and cm.dtype == torch.bool:  # a product of bytes: torch.where takes 30x as long
        small = ck * cm.view(torch.uint8)
    else:
        small = torch.where(cm, ck, torch.zeros((), dtype=key.dtype))
    return spread(small, torch.broadcast_shapes(key.shape, kept.shape))


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def zero_where_(t: torch.Tensor, mask: torch.Tensor, where: bool = True) -> torch.Tensor:
    """`t.masked_fill_(mask == where, 0)`, in place on `t`'s bits: an AND with 0 where `mask` is `where` and all
    ones elsewhere (`where=False` zeroes what a kept mask does not keep, with no inverted copy of it).

    Exact for every value (NaN and inf become +0.0, as with masked_fill) and 3x faster on CPU:
    torch 2.13's masked_fill_ takes 1.7 ms for a 3072 x 768 float weight, the AND 0.5 ms. The
    AND's operand (0 or all ones, as wide as an element) is made `ZERO_BLOCK` elements at a
    time in one small buffer: made whole it was 9 MB of fresh pages a weight (1.6 ms).
    `mask` is bool and broadcasts to `t`; other cases go to masked_fill_ itself.

    Example:
        >>> zero_where_(torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([False, True, False])).tolist()
        [1.0, 0.0, 3.0]
        >>> zero_where_(torch.tensor([1.0, 2.0]), torch.tensor([True, False]), where=False).tolist()
        [1.0, 0.0]
    """
    ints = _SAME_SIZE_INT.get(t.element_size())
    if ints is None or mask.dtype != torch.bool or t.is_complex() or t.device != mask.device:
        return t.masked_fill_(mask if where else ~mask, 0)
    bits, mask = t.view(ints), mask.expand(t.shape)  # a mask of fewer or size-1 dims: a view, stride 0 there

    def operand(keep: torch.Tensor) -> torch.Tensor:  # mask's bytes (0 / 1) as 0 where zeroed, all ones elsewhere
        return keep.sub_(1) if where else keep.neg_()

    if t.dim() == 0 or t.numel() <= ZERO_BLOCK:
        bits.bitwise_and_(operand(core(mask).view(torch.uint8).to(ints, copy=True)))
        return t
    step = max(1, ZERO_BLOCK // max(1, t[0].numel()))  # whole slices along dim 0
    buffer = torch.empty((min(step, t.shape[0]), *t.shape[1:]), dtype=ints)
    for r0 in range(0, t.shape[0], step):
        keep = buffer[: min(step, t.shape[0] - r0)]
        bits[r0:r0 + step].bitwise_and_(operand(keep.copy_(mask[r0:r0 + step].view(torch.uint8))))
    return t


ZERO_BLOCK = 1 << 16  # elements of `zero_where_`'s buffer: 256 KB of int32, reused, in L2


def kept_only(t: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """A copy of `t` with 0 wherever `kept` (broadcast to `t`; not bool: non-zero is kept) is False: `t * kept`
    without its mixed-dtype product (torch 2.13: 2.1-6.8 ms for a 3072 x 768 weight, this 1.3 with its copy), and
    NaN or inf where pruned become 0 too.

    Example:
        >>> kept_only(torch.tensor([1.0, float("inf")]), torch.tensor([True, False])).tolist()
        [1.0, 0.0]
    """
    return zero_where_(t.clone(memory_format=torch.contiguous_format), kept.bool(), where=False)


def count_true(mask: torch.Tensor) -> int:
    """Number of True (non-zero) elements of the full tensor, counted on the core.

    Example:
        >>> count_true(torch.tensor([True, False, True]).expand(10, 3))
        20
    """
    c = core(mask)
    return int(torch.count_nonzero(c)) * (mask.numel() // c.numel()) if c.numel() else 0


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and values; compares cores when both are expanded alike.

    Example:
        >>> equal(torch.ones(3).expand(2, 3), torch.ones(2, 3))
        True
    """
    if a.shape != b.shape:
        return False
    ca, cb = core(a), core(b)
    if a.dtype == b.dtype and a.element_size() == 1:
        if ca.data_ptr() == cb.data_ptr() and ca.shape == cb.shape and ca.stride() == cb.stride():
            return True  # one tensor's bytes (propagation asks this of every TeSA a visit left as it was)
        if ca.shape == cb.shape and ca.is_contiguous() and cb.is_contiguous() and ca.numel() > EQUAL_BLOCK:
            return _bytes_equal(ca.view(torch.uint8).reshape(-1), cb.view(torch.uint8).reshape(-1))
        # bytes: no position differs (on the cores broadcast together, which cover every position of a and b);
        # torch.equal on bytes takes 12x as long (a 3072 x 768 mask: 0.8 ms against 0.06 ms)
        return ca.numel() == 0 or cb.numel() == 0 or not bool(
            torch.bitwise_xor(ca.view(torch.uint8), cb.view(torch.uint8)).amax())
    if ca.shape == cb.shape:
        return torch.equal(ca, cb)
    return torch.equal(a, b)


EQUAL_BLOCK = 1 << 18  # bytes `equal` XORs at a time into one buffer (L2-sized) before it looks for a difference


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two flat uint8 tensors of one length are equal: their XOR a block at a time into one buffer, stopping
    at the first block that differs. XORed whole, a 3072 x 768 mask's 2.4 MB of result were fresh pages on every
    call (1-3 ms on a VM; propagation compares hundreds of masks per run)."""
    buffer = torch.empty(min(EQUAL_BLOCK, a.numel()), dtype=torch.uint8)
    for i in range(0, a.numel(), EQUAL_BLOCK):
        part = buffer[: min(EQUAL_BLOCK, a.numel() - i)]
        if bool(torch.bitwise_xor(a[i:i + EQUAL_BLOCK], b[i:i + EQUAL_BLOCK], out=part).amax()):
            return False
    return True


def any_of_both(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
    """`any_true(both(a, b), dim)` for a 2-d bool `a`, `b` broadcasting to it and `dim` 0 or 1, a block of rows at
    a time through one buffer: the product is never whole (a 3072 x 768 mask's was 2.4 MB of fresh pages).

    Example:
        >>> any_of_both(torch.tensor([[True, False], [False, True]]), torch.tensor([True, False]), 1).tolist()
        [True, False]
    """
    n, k = a.shape
    if a.dtype != torch.bool or b.dtype != torch.bool or not n or not k:
        return any_true(both(a, b), dim=dim)
    au, bu = a.view(torch.uint8), b.expand(n, k).view(torch.uint8)
    rows = max(1, EQUAL_BLOCK // k)
    buffer = torch.empty(min(rows, n), k, dtype=torch.uint8)
    out = torch.empty(n, dtype=torch.uint8) if dim in (1, -1) else torch.zeros(k, dtype=torch.uint8)
    for r0 in range(0, n, rows):
        part = torch.bitwise_and(au[r0:r0 + rows], bu[r0:r0 + rows], out=buffer[: min(rows, n - r0)])
        if dim in (1, -1):
            torch.amax(part, dim=1, out=out[r0:r0 + rows])
        else:
            torch.maximum(out, part.amax(dim=0), out=out)
    return out.view(torch.bool)


def rows_like(rows: torch.Tensor, i: int) -> torch.Tensor:
    """Which rows of a 2-d tensor of 1-byte elements equal row `i` (bool per row): XORs with it a block of rows at
    a time through one buffer.

    Example:
        >>> rows_like(torch.tensor([[1, 0], [0, 1], [1, 0]], dtype=torch.uint8), 0).tolist()
        [True, False, True]
    """
    n, k = rows.shape
    if rows.element_size() != 1 or not k:
        return (rows == rows[i]).all(dim=1) if k else torch.ones(n, dtype=torch.bool)
    u = rows.view(torch.uint8)
    step = max(1, EQUAL_BLOCK // k)
    buffer = torch.empty(min(step, n), k, dtype=torch.uint8)
    differs = torch.empty(n, dtype=torch.uint8)
    for r0 in range(0, n, step):
        part = torch.bitwise_xor(u[r0:r0 + step], u[i], out=buffer[: min(step, n - r0)])
        torch.amax(part, dim=1, out=differs[r0:r0 + step])
    return differs == 0


def any_over(mask: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """Logical or over `dims`, kept as size-1 dims; dims already of size 1 in the core cost nothing.

    Example:
        >>> any_over(torch.tensor([[True, False]]).expand(5, 2), [0]).tolist()
        [[True, False]]
    """
    reduced = {d % mask.dim() for d in dims}
    out = core(mask)
    for d in sorted(reduced):
        if out.shape[d] > 1:
            out = any_true(out, dim=d, keepdim=True)
    return spread(out, [1 if d in reduced else n for d, n in enumerate(mask.shape)])
