"""The TeSA algebra the rules are built from, vectorized (no Python loops over elements).

Pruned/kept is a boolean semiring: for a multilinear op with non-negative coefficients
(matmul, conv, linear without bias, elementwise mul, sum/avg pooling, ...), an output
element can be non-zero only if some product term has all its factors kept. Evaluating
the op on 0/1 float tensors gives, per output, the *number* of such terms, so `> 0` is the
forward rule; the gradient of that evaluation weighted by the kept outputs counts, per
input element, the kept outputs it reaches through a term whose other factors are kept,
so `> 0` is the backward (and input-to-input) rule. Counts are small integers, exact in
float32.

Data-movement ops (view, permute, cat, getitem, ...) are replayed on the packed TeSA keys,
so bits and formats flow through them unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from sparta_explore.compact import any_of_both, any_true, both, core, count_true, either, rows_like, spread
from sparta_explore.tesa import TeSA


def kept_of(value: TeSA | None, like: torch.Tensor | None = None) -> torch.Tensor | None:
    """The bool kept mask of a TeSA (None passes through)."""
    if value is None:
        return None
    return value.kept


def any_to(mask: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Reduce a broadcast bool mask back to `shape` with logical or (autograd's sum_to_size)."""
    shape = tuple(shape)
    if tuple(mask.shape) == shape:
        return mask
    lead = mask.dim() - len(shape)
    if lead < 0 or any(n not in (1, m) for n, m in zip(shape, mask.shape[lead:])):
        raise RuntimeError(f"mask of shape {tuple(mask.shape)} does not reduce to {shape}")
    # on the core: dims a broadcast mask repeats along need no reduction
    out = core(mask)
    dims = [d for d in range(lead)] + [lead + i for i, n in enumerate(shape) if n == 1]
    for d in sorted(dims, reverse=True):
        out = any_true(out, dim=d, keepdim=d >= lead) if out.shape[d] > 1 else (out.squeeze(d) if d < lead else out)
    return spread(out, shape)


def multilinear(fn: Callable[..., torch.Tensor], inputs: Sequence[TeSA | None], output: TeSA,
                ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Forward and backward kept masks of a multilinear op with non-negative coefficients.

    `fn(*xs)` is called on 0/1 float tensors (None inputs are passed as None for
    optional operands such as an absent bias). Returns (output kept, [input kept]).

    Example:
        >>> a = TeSA.from_mask(torch.tensor([[1, 0], [0, 0]]))
        >>> b = TeSA.dense((2, 3))
        >>> out, (ka, kb) = multilinear(torch.matmul, [a, b], TeSA.dense((2, 3)))
        >>> out.tolist()
        [[True, True, True], [False, False, False]]
        >>> kb.tolist()  # row 1 of b only meets pruned a[:, 1]
        [[True, True, True], [False, False, False]]
    """
    return multilinear_masks(fn, [kept_of(t) for t in inputs], output.kept)


def multilinear_masks(fn: Callable[..., torch.Tensor], masks: Sequence[torch.Tensor | None], allowed: torch.Tensor,
                      ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """`multilinear` on bool kept masks; `allowed` is the output's kept mask.

    Example:
        >>> a, b = torch.tensor([True, False]), torch.tensor([True, True])
        >>> out, _ = multilinear_masks(torch.mul, [a, b], torch.tensor([True, True]))
        >>> out.tolist()
        [True, False]
    """
    xs = [None if m is None else m.to(torch.float32).requires_grad_(True) for m in masks]
    with torch.enable_grad():
        y = fn(*xs)
        forward = y.detach() > 0
        out_kept = forward & allowed
        live = [x for x in xs if x is not None]
        grads = torch.autograd.grad(y, live, grad_outputs=out_kept.to(y.dtype), allow_unused=True)
    it = iter(grads)
    in_kept = []
    for x in xs:
        if x is None:
            in_kept.append(None)
            continue
        g = next(it)
        in_kept.append(torch.zeros_like(x, dtype=torch.bool) if g is None else g > 0)
    return out_kept, in_kept


def row_wise_linear(x: torch.Tensor, w: torch.Tensor, allowed: torch.Tensor,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`multilinear` of Y = X W^T on kept masks, evaluated once per distinct (X row, allowed Y row) pair.

    Every row of a linear's input is multiplied by the same W, so rows that are equal, with
    equal allowed outputs, have equal forward and input masks, and the weight mask is an OR
    over rows, which duplicates do not change. Activations of a batch x tokens model are
    mostly identical rows: a 1024-row BERT input usually collapses to one row.
    Returns (output kept, X kept, W kept).

    Example:
        >>> x = torch.tensor([[True, False]] * 3)
        >>> out, kx, kw = row_wise_linear(x, torch.ones(2, 2, dtype=torch.bool), torch.ones(3, 2, dtype=torch.bool))
        >>> out.shape, kw[:, 1].tolist()
        (torch.Size([3, 2]), [False, False])
    """
    k, n = x.shape[-1], allowed.shape[-1]
    lead = allowed.shape[:-1]
    xs, ys = x.expand(*lead, k).reshape(-1, k), allowed.reshape(-1, n)
    if _rows_equal(xs) and _rows_equal(ys):  # the usual case: answer for one row, broadcast (no copies)
        out, kx, kw = _one_row_linear(xs[0], w, ys[0])
        return out.reshape(*(1,) * len(lead), n).expand(*lead, n), kx.expand(x.shape), kw
    distinct = _distinct_rows(xs, ys)
    if distinct is not None:  # a few kinds of rows (BERT: 2 of 1024): the one-row rule on each, W's mask their OR
        first, inverse = distinct
        parts = [_one_row_linear(xs[i], w, ys[i]) for i in first]
        out, kx = torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
        kw = parts[0][2]
        for part in parts[1:]:
            kw = either(kw, part[2])
    else:
        rows = torch.cat([xs, ys], dim=1)
        unique, inverse = torch.unique(rows.to(torch.uint8), dim=0, return_inverse=True)
        unique = unique.bool()
        out, (kx, kw) = multilinear_masks(lambda a, b: torch.nn.functional.linear(a, b), [unique[:, :k], w],
                                          unique[:, k:])
    kx_full = kx[inverse].reshape(*lead, k)
    return out[inverse].reshape(*lead, n), any_to(kx_full, x.shape), kw


DISTINCT_MOST = 8  # row_wise_linear answers per distinct row up to this many kinds of rows, else by torch.unique


def _distinct_rows(*parts: torch.Tensor, most: int = DISTINCT_MOST) -> tuple[list[int], torch.Tensor] | None:
    """(the first row of each kind, each row's kind) for 2-d bool or byte tensors of one row count, a row's kind
    being its rows in all of `parts`, where there are at most `most` kinds, else None. One pass per kind and part
    (`rows_like`): `torch.unique(dim=0)` sorted a BERT linear's 1024 rows of 3840 bytes in 24 ms; a pass takes
    0.13 ms.

    Example:
        >>> _distinct_rows(torch.tensor([[1, 0], [0, 1], [1, 0]], dtype=torch.uint8))
        ([0, 1], tensor([0, 1, 0]))
    """
    kind = torch.full((parts[0].shape[0],), -1, dtype=torch.long)
    first: list[int] = []
    while True:
        left = torch.nonzero(kind < 0)
        if not len(left):
            return first, kind
        if len(first) == most:
            return None
        i = int(left[0, 0])
        same = rows_like(parts[0], i)
        for part in parts[1:]:
            same = both(same, rows_like(part, i))
        kind[same] = len(first)  # rows of earlier kinds differ from row i: untouched
        first.append(i)


def _one_row_linear(x: torch.Tensor, w: torch.Tensor, allowed: torch.Tensor,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # the product rule of y = W x on bool masks directly: no float copies of W, no autograd
    # (those cost ~10 ms per BERT linear, most of it first-touch of fresh 9 MB buffers)
    # (`both` on bytes: torch's bool & broadcast along the last dim is 30x slower). A factor kept whole (a dense
    # activation, every output reached) is left out of the products, and W's mask, out (x) x, is then a broadcast
    # view of the other: no n x k pass or fresh 2.4 MB per BERT linear (fresh pages cost 1-3 ms each on a VM)
    n, k = w.shape
    x_whole = count_true(x) == k
    out = both(any_true(w, dim=1) if x_whole else any_of_both(w, x, 1), allowed)
    out_whole = count_true(out) == n
    kx = any_true(w, dim=0) if out_whole else any_of_both(w, out.unsqueeze(1), 0)
    if x_whole:
        return out, kx, out.unsqueeze(1).expand(n, k)
    if out_whole:
        return out, kx, x.unsqueeze(0).expand(n, k)
    return out, kx, both(out.unsqueeze(1), x.unsqueeze(0))


def _rows_equal(rows: torch.Tensor) -> bool:
    """True if every row of a 2-d mask equals the first (a stride-0 expansion is answered without a pass)."""
    if rows.shape[0] <= 1 or rows.stride(0) == 0:
        return True
    # each row against the first as bytes, in blocks (`rows_like`): bool `==` then `all` was 10x slower
    return bool(rows_like(rows, 0).all())


def moved_keys(fn: Callable[..., torch.Tensor | tuple], inputs: Sequence[TeSA]) -> TeSA | tuple[TeSA, ...]:
    """Replay a data-movement op on the packed keys: each output element carries its source's bits.

    A broadcast key usually moves as a view (a reshape or transpose keeps stride 0); an op
    that needs contiguous memory (`view` across an expanded dim) gets the full key.
    """
    out = _replay(fn, [t._key for t in inputs])
    if isinstance(out, (tuple, list)):
        return tuple(TeSA._from_key(o) for o in out)
    return TeSA._from_key(out)


def _replay(fn: Callable[..., Any], xs: list[torch.Tensor]) -> Any:
    try:
        return fn(*xs)
    except RuntimeError:  # e.g. view() of a stride-0 tensor: the same op on contiguous copies
        return fn(*[x.contiguous() for x in xs])


def moved_back(fn: Callable[..., torch.Tensor | tuple], inputs: Sequence[TeSA],
               output: TeSA | tuple[TeSA, ...]) -> list[torch.Tensor]:
    """Backward of a data-movement op: an input element matters iff a kept output reads it."""
    outs = list(output) if isinstance(output, tuple) else [output]
    # float copies of the cores, broadcast like the keys: autograd moves them as views too
    grad_outputs = [spread(core(o.kept).to(torch.float32), o.shape) for o in outs]
    try:
        grads = _moved_grads(fn, [torch.ones((1,) * len(t.shape)).expand(t.shape) for t in inputs], grad_outputs)
    except RuntimeError:  # an op that needs contiguous memory: full-size ones and gradients
        grads = _moved_grads(fn, [torch.ones(t.shape) for t in inputs], [g.contiguous() for g in grad_outputs])
    return [spread(torch.zeros((1,) * len(t.shape), dtype=torch.bool), t.shape) if g is None
            else spread(core(g) > 0, g.shape) for t, g in zip(inputs, grads)]


def _moved_grads(fn: Callable[..., Any], xs: list[torch.Tensor], grad_outputs: list[torch.Tensor]) -> tuple:
    xs = [x.requires_grad_(True) for x in xs]
    with torch.enable_grad():
        y = fn(*xs)
        ys = list(y) if isinstance(y, (tuple, list)) else [y]
        return torch.autograd.grad(ys, xs, grad_outputs=grad_outputs, allow_unused=True)
