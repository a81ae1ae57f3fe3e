"""Dense-shrink: cut fully pruned output rows and input columns, run PyTorch's dense op on the rest.

The cheapest exploit of structured sparsity: a weight whose pruning removes whole rows
(output channels) or columns (input features) becomes a smaller dense matrix that MKL runs
at full efficiency. Removed outputs equal act(bias) (or act(0)), filled without compute.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sparta_explore.compact import kept_only
from sparta_explore.kernels.compiled_op import CompiledOp, check_act_bits, float_inputs_only, quantized_input
from sparta_explore.kernels.sparse_linear import _ACT, check_linear_args


class ShrunkLinear(CompiledOp):
    """act(x W_kept^T + b) computed as a dense linear over the kept rows and columns only.

    Example:
        >>> kept = torch.ones(6, 4, dtype=torch.bool); kept[1] = False; kept[:, 2] = False
        >>> s = ShrunkLinear(torch.randn(6, 4), torch.randn(6), kept)
        >>> s.weight_small.shape
        torch.Size([5, 3])
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kept: torch.Tensor,
                 activation: str = "none", *, act_bits: int = 32) -> None:
        super().__init__()
        check_linear_args(weight, kept, activation)
        self.out_features, self.in_features = weight.shape
        self.activation = activation
        self.act_bits = check_act_bits(act_bits)
        rows = kept.any(dim=1).nonzero().flatten()
        cols = kept.any(dim=0).nonzero().flatten()
        w = kept_only(weight.detach(), kept).float()
        self.register_buffer("rows", rows)
        self.register_buffer("cols", cols)
        self.register_buffer("weight_small", w[rows][:, cols].contiguous())
        self.register_buffer("bias_small", None if bias is None else bias.detach().float()[rows].contiguous())
        self.register_buffer("bias_full", None if bias is None else bias.detach().float().clone())
        filler = torch.zeros(self.out_features) if bias is None else bias.detach().float().clone()
        self.register_buffer("filler", _ACT[activation](filler))  # what pruned outputs hold
        self.all_rows = len(rows) == self.out_features
        self.all_cols = len(cols) == self.in_features

    @property
    def density(self) -> float:
        """Fraction of the full weight that is nonzero (what effective FLOPs count)."""
        return int(torch.count_nonzero(self.weight_small)) / (self.out_features * self.in_features)

    def as_linear(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias) of the full-size linear this op computes: the kept block among zeros
        (a ValueError for an op that rounds its inputs)."""
        float_inputs_only(self)
        weight = torch.zeros(self.out_features, self.in_features)
        weight[self.rows[:, None], self.cols] = self.weight_small
        return weight, self.bias_full

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        x = quantized_input(x, self.act_bits)  # the whole row's scale, before any column is cut
        xs = x if self.all_cols else x.index_select(-1, self.cols)
        ys = _ACT[self.activation](F.linear(xs, self.weight_small, self.bias_small))
        if self.all_rows:
            return ys
        y = self.filler.expand(*x.shape[:-1], self.out_features).clone()
        y[..., self.rows] = ys
        return y

    def extra_repr(self) -> str:
        return (f"in={self.in_features}->{len(self.cols)}, out={self.out_features}->{len(self.rows)}, "
                f"act={self.activation}")

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The masked dense op (the same PyTorch arithmetic, unshrunk), in `x`'s dtype."""
        w = torch.zeros(self.out_features, self.in_features, dtype=x.dtype)
        w[self.rows.reshape(-1, 1), self.cols.reshape(1, -1)] = self.weight_small.to(x.dtype)
        bias = None if self.bias_full is None else self.bias_full.to(x.dtype)
        return _ACT[self.activation](F.linear(quantized_input(x, self.act_bits), w, bias))
