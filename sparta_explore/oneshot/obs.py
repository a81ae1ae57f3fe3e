"""The Optimal Brain Surgeon sweep SparseGPT and GPTQ share: compress one column at a time, fix up the rest.

For a linear's (out, in) weight W and its input Hessian H, columns are processed left to
right in blocks of `blocksize`. Each column is pruned (its weight set to 0) where the mask
says so and/or rounded to its grid; the error that leaves, divided by the Cholesky
factor's diagonal, is spread over the not-yet-processed columns through the upper
Cholesky factor of H^-1 (Frantar & Alistarh 2022, 2023). Within a block updates are
eager; to the columns after it they are applied once per block ("lazy batch" updates).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from sparta_explore.errors import ConfigError
from sparta_explore.oneshot.grid import GroupGrid, QuantSpec, fit_grid, quantize_to_grid


@dataclass(frozen=True)
class OBSResult:
    """One compressed (out, in) weight: the new values, the kept mask, the grids if quantized, the OBS loss.

    Example:
        >>> r = obs_compress(torch.randn(4, 8), torch.eye(8), sparsity=0.5)
        >>> int(r.keep.sum()), bool((r.weight[~r.keep] == 0).all())
        (16, True)
    """

    weight: torch.Tensor
    keep: torch.Tensor
    grid: GroupGrid | None
    loss: float


def inverse_hessian_factor(hessian: torch.Tensor, damp: float, name: str = "weight") -> torch.Tensor:
    """The upper Cholesky factor of (H + damp * mean(diag H) * I)^-1.

    Example:
        >>> inverse_hessian_factor(4 * torch.eye(2), 0.0).diagonal()
        tensor([0.5000, 0.5000])
    """
    h = hessian.clone()
    h.diagonal().add_(damp * h.diagonal().mean())
    try:
        inv = torch.cholesky_inverse(torch.linalg.cholesky(h))
        return torch.linalg.cholesky(inv, upper=True)
    except torch.linalg.LinAlgError as e:
        raise ConfigError(f"the input Hessian of {name!r} is not positive definite after dampening damp={damp}: "
                          "raise damp, use hessian_dtype='float64', or calibrate on more samples") from e


def _prune_lowest(saliency: torch.Tensor, count: int) -> torch.Tensor:
    """A bool mask of `saliency`'s shape, True at its `count` lowest entries."""
    out = torch.zeros(saliency.numel(), dtype=torch.bool, device=saliency.device)
    if count > 0:
        out[saliency.flatten().topk(count, largest=False).indices] = True
    return out.reshape(saliency.shape)


def _static_grids(w: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = w.shape
    size = spec.group_size or cols
    pairs = [fit_grid(w[:, g:g + size], spec) for g in range(0, cols, size)]
    return torch.stack([p[0] for p in pairs], 1), torch.stack([p[1] for p in pairs], 1)


def obs_compress(weight: torch.Tensor, hessian: torch.Tensor, *, sparsity: float = 0.0,
                 nm: tuple[int, int] | None = None, keep: torch.Tensor | None = None,
                 quant: QuantSpec | None = None, act_order: bool = False, damp: float = 0.01,
                 blocksize: int = 128, name: str = "weight") -> OBSResult:
    """Prune and/or quantize an (out, in) `weight` against its input `hessian`, OBS-updating what is kept.

    * `sparsity`: SparseGPT's adaptive mask: in each block of columns, the `sparsity` share
      with the lowest saliency `w^2 / [H^-1]_jj^2` is pruned (rows share the budget).
    * `nm=(n, m)`: keep the `n` most salient of every `m` consecutive columns, per row.
    * `keep`: a fixed mask (True = kept); weights outside it end exactly 0 (a pruned model
      quantized by GPTQ stays pruned).
    * `quant`: round each kept column onto its group's grid. Groups are fitted on the
      current (already updated) weights when a group starts; with `act_order` (columns
      in order of decreasing Hessian diagonal) or one group per row, they are fitted once
      up front, so each group stays a contiguous run of original columns.

    Works in the Hessian's dtype; returns the weight in the input's dtype and column order.

    Example:
        >>> r = obs_compress(torch.randn(4, 8), torch.eye(8), quant=QuantSpec(4, 4))
        >>> bool((r.grid.dequantize(r.grid.codes(r.weight)) == r.weight).all())
        True
    """
    if nm is not None and weight.shape[1] % nm[1]:
        raise ConfigError(f"N:M with m={nm[1]} does not divide the input width {weight.shape[1]} of {name!r}")
    with flushed_subnormals():
        return _obs_sweep(weight, hessian, sparsity, nm, keep, quant, act_order, damp, blocksize, name)


@contextmanager
def flushed_subnormals() -> Iterator[None]:
    """Subnormal floats read and computed as 0 inside, the caller's setting restored after.

    The OBS updates drive many weights of a real LLM's Hessian sweep into the subnormal range,
    where every x86 multiply takes a microcode assist: SparseGPT on SmolLM2-135M ran 612 s with
    them and 84 s flushed. A subnormal's contribution to a weight is below fp32's resolution of
    any normal weight, so flushing changes no kept value's rounding in practice.

    Example:
        >>> with flushed_subnormals():
        ...     float(torch.tensor([1e-40]) * 1.0)
        0.0
    """
    was = _flushing()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(was)


def _flushing() -> bool:
    # torch has no getter: a subnormal times one reads as 0 exactly when denormals are flushed
    return float(torch.tensor([1e-40]) * 1.0) == 0.0


def _obs_sweep(weight: torch.Tensor, hessian: torch.Tensor, sparsity: float, nm: tuple[int, int] | None,
               keep: torch.Tensor | None, quant: QuantSpec | None, act_order: bool, damp: float,
               blocksize: int, name: str) -> OBSResult:
    rows, cols = weight.shape
    dtype = hessian.dtype
    w = weight.detach().to(dtype).clone()
    h = hessian.clone()
    dead = h.diagonal() == 0
    # a column whose input is always 0 cannot matter: fix its Hessian so Cholesky works, zero it
    h[dead, dead] = 1
    w[:, dead] = 0
    fixed = None if keep is None else keep.to(torch.bool).clone()

    size = (quant.group_size or cols) if quant is not None else cols
    static = quant is not None and (act_order or quant.group_size is None)
    scale = zero = None
    if quant is not None:
        scale = torch.zeros(rows, quant.groups(cols), dtype=dtype, device=w.device)
        zero = torch.zeros_like(scale)
        if static:
            scale, zero = _static_grids(w, quant)

    perm = None
    if act_order:
        perm = torch.argsort(h.diagonal(), descending=True)
        w, h = w[:, perm], h[perm][:, perm]
        fixed = fixed[:, perm] if fixed is not None else None
    hinv = inverse_hessian_factor(h, damp, name)

    if nm is not None:
        # an N:M group must not straddle two column blocks: its saliencies are taken together
        blocksize = max(nm[1], blocksize // nm[1] * nm[1])
    out = torch.zeros_like(w)
    pruned = torch.zeros(rows, cols, dtype=torch.bool, device=w.device)
    loss = torch.zeros((), dtype=dtype, device=w.device)
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        w1 = w[:, i1:i2].clone()
        q1, err1 = torch.zeros_like(w1), torch.zeros_like(w1)
        h1 = hinv[i1:i2, i1:i2]
        d = h1.diagonal()
        prune1 = torch.zeros_like(w1, dtype=torch.bool)
        if fixed is not None:
            prune1 |= ~fixed[:, i1:i2]
        if sparsity > 0 and nm is None:
            prune1 |= _prune_lowest(w1.square() / d.square(), round(w1.numel() * sparsity))
        for i in range(i2 - i1):
            col = i1 + i
            if nm is not None and i % nm[1] == 0:
                saliency = w1[:, i:i + nm[1]].square() / d[i:i + nm[1]].square()
                drop = saliency.topk(nm[1] - nm[0], dim=1, largest=False).indices
                prune1.scatter_(1, i + drop, True)
            original = int(perm[col]) if perm is not None else col
            if quant is not None and not static and col % size == 0:
                ahead = torch.cat([w1[:, i:], w[:, i2:]], dim=1)[:, :size]
                scale[:, col // size], zero[:, col // size] = fit_grid(ahead, quant)
            col_w = w1[:, i]
            q = col_w.masked_fill(prune1[:, i], 0.0)
            if quant is not None:
                g = original // size
                q = quantize_to_grid(q, scale[:, g], zero[:, g], quant.maxq).masked_fill(prune1[:, i], 0.0)
            q1[:, i] = q
            err = (col_w - q) / d[i]
            loss += err.square().sum() / 2
            w1[:, i:] -= err.unsqueeze(1) * h1[i, i:].unsqueeze(0)
            err1[:, i] = err
        out[:, i1:i2] = q1
        pruned[:, i1:i2] = prune1
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]

    if perm is not None:
        inverse = torch.argsort(perm)
        out, pruned = out[:, inverse], pruned[:, inverse]
    keep_out = ~pruned
    grid = None
    if quant is not None:
        # store the grids in the weight's dtype and de-quantize with them, so the weight lies
        # exactly on `scale * (q - zero)` as a kernel would compute it
        grid = GroupGrid(scale.to(weight.dtype), zero.to(weight.dtype), quant.bits, size, quant.sym)
        codes = grid.codes(out.to(weight.dtype))
        out = grid.dequantize(codes).masked_fill(pruned, 0.0)
    return OBSResult(out.to(weight.dtype), keep_out, grid, float(loss))
