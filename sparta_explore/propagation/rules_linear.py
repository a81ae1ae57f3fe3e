"""Rules for the ops that multiply: linear, matmul/bmm/@, conv, embedding, attention.

All but embedding are multilinear with non-negative structure, so `multilinear` gives
forward (out kept iff some term has all factors kept), backward (for Y = X W^T the weight
rule is gW = gY^T X on kept masks) and input-to-input (a pruned column of W makes that
column of X irrelevant) in one autograd pass. A kept bias keeps its output channel alive.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.compact import any_over, any_true, both, either
from sparta_explore.propagation.algebra import any_to, multilinear, row_wise_linear
from sparta_explore.propagation.registry import OpUpdate, OpView, Unsupported, register_rule
from sparta_explore.tesa import TeSA


def _with_bias(out_kept: torch.Tensor, bias: TeSA | None, output: TeSA, channel_dim: int) -> tuple:
    """OR a kept bias into the output (bias[c] broadcast along `channel_dim`); bias backward."""
    if bias is None:
        return out_kept, None
    shape = [1] * output.kept.dim()
    shape[channel_dim] = -1
    out = either(out_kept, both(bias.kept.reshape(shape), output.kept))  # on cores: stays compact
    dims = [d for d in range(out.dim()) if d != channel_dim % out.dim()]
    bias_kept = any_over(out, dims).reshape(-1) if dims else out
    return out, bias_kept


def _weighted_module(op: OpView, fn, channel_dim: int) -> OpUpdate:
    """A module computing fn(x, weight) + bias: product rule on (x, weight), bias OR-ed per channel."""
    out, (kx, kw) = multilinear(fn, [op.args[0], op.params["weight"]], op.output)
    out, kb = _with_bias(out, op.params.get("bias"), op.output, channel_dim)
    params = {"weight": kw} | ({"bias": kb} if kb is not None else {})
    return OpUpdate(output=out, args={0: kx}, params=params)


def _linear(op: OpView, x: TeSA, w: TeSA, b: TeSA | None) -> tuple:
    if x.kept.dim() >= 1 and w.kept.dim() == 2:
        out, kx, kw = row_wise_linear(x.kept, w.kept, op.output.kept)
    else:
        out, (kx, kw) = multilinear(lambda xx, ww: F.linear(xx, ww), [x, w], op.output)
    out, kb = _with_bias(out, b, op.output, -1)
    return out, kx, kw, kb


@register_rule(nn.Linear)
def linear_module(op: OpView) -> OpUpdate:
    # Y = X W^T + b: Y[..., n] may be non-zero iff b[n] kept or some k has X[..., k] and W[n, k] kept
    x, w = op.args[0], op.params["weight"]
    out, kx, kw = row_wise_linear(x.kept, w.kept, op.output.kept)
    out, kb = _with_bias(out, op.params.get("bias"), op.output, -1)
    return OpUpdate(output=out, args={0: kx}, params={"weight": kw} | ({"bias": kb} if kb is not None else {}))


@register_rule(F.linear)
def linear_function(op: OpView) -> OpUpdate:
    x, w, b = op.arg(0, "input"), op.arg(1, "weight"), op.arg(2, "bias")
    out, kx, kw, kb = _linear(op, x, w, b if isinstance(b, TeSA) else None)
    args = {op.slot_of(0, "input"): kx, op.slot_of(1, "weight"): kw}
    if kb is not None:
        args[op.slot_of(2, "bias")] = kb
    return OpUpdate(output=out, args=args)


def _binary_multilinear(op: OpView, fn) -> OpUpdate:
    a, b = op.arg(0, "input"), op.arg(1, "other")
    if not (isinstance(a, TeSA) and isinstance(b, TeSA)):
        raise Unsupported("matmul with a non-tensor operand")
    out, (ka, kb) = multilinear(fn, [a, b], op.output)
    return OpUpdate(output=out, args={op.slot_of(0, "input"): ka, op.slot_of(1, "other"): kb})


@register_rule(torch.matmul, operator.matmul, "matmul")
def matmul_rule(op: OpView) -> OpUpdate:
    # boolean matmul with broadcasting; gradients reduce broadcast batch dims back (any)
    return _binary_multilinear(op, torch.matmul)


@register_rule(torch.bmm, "bmm")
def bmm_rule(op: OpView) -> OpUpdate:
    return _binary_multilinear(op, torch.bmm)


@register_rule(torch.mm, "mm")
def mm_rule(op: OpView) -> OpUpdate:
    return _binary_multilinear(op, torch.mm)


@register_rule(torch.einsum)
def einsum_rule(op: OpView) -> OpUpdate:
    equation, operands = op.args[0], op.args[1:]
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        raise Unsupported("einsum with a list operand")
    if not all(isinstance(t, TeSA) for t in operands):
        raise Unsupported("einsum with non-tensor operands")
    out, kept = multilinear(lambda *xs: torch.einsum(equation, *xs), list(operands), op.output)
    return OpUpdate(output=out, args={i + 1: k for i, k in enumerate(kept)})


@register_rule(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def conv_module(op: OpView) -> OpUpdate:
    # groups, depthwise, stride, padding (any mode), dilation: replayed by the module's own conv
    mod = op.module
    return _weighted_module(op, lambda x, w: mod._conv_forward(x, w, None), 1)


@register_rule(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
def conv_transpose_module(op: OpView) -> OpUpdate:
    mod = op.module
    if len(op.args) > 1:
        raise Unsupported("ConvTranspose with output_size")
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[mod.weight.dim() - 2]
    return _weighted_module(op, lambda x, w: fn(x, w, None, mod.stride, mod.padding, mod.output_padding,
                                                mod.groups, mod.dilation), 1)


@register_rule(F.conv1d, F.conv2d, F.conv3d)
def conv_function(op: OpView) -> OpUpdate:
    fn = op.node.target
    x, w, b = op.arg(0, "input"), op.arg(1, "weight"), op.arg(2, "bias")
    extra = {k: op.arg(i, k) for i, k in ((3, "stride"), (4, "padding"), (5, "dilation"), (6, "groups"))
             if op.arg(i, k) is not None}
    out, (kx, kw) = multilinear(lambda xx, ww: fn(xx, ww, None, **extra), [x, w], op.output)
    out, kb = _with_bias(out, b if isinstance(b, TeSA) else None, op.output, 1)
    args = {op.slot_of(0, "input"): kx, op.slot_of(1, "weight"): kw}
    if kb is not None:
        args[op.slot_of(2, "bias")] = kb
    return OpUpdate(output=out, args=args)


def _embedding(weight: TeSA, output: TeSA) -> tuple[torch.Tensor, torch.Tensor]:
    # out[..., d] = W[idx, d]; without relying on the index values, column d is non-zero
    # only if some row keeps it, and W[v, d] matters only if some output keeps column d
    col_kept = any_true(weight.kept, dim=0)
    out = output.kept & col_kept
    used = any_to(out, (1,) * (out.dim() - 1) + (out.shape[-1],)).reshape(-1)
    return out, weight.kept & used.unsqueeze(0)


@register_rule(nn.Embedding)
def embedding_module(op: OpView) -> OpUpdate:
    out, kw = _embedding(op.params["weight"], op.output)
    return OpUpdate(output=out, params={"weight": kw})


@register_rule(F.embedding)
def embedding_function(op: OpView) -> OpUpdate:
    out, kw = _embedding(op.arg(1, "weight"), op.output)
    return OpUpdate(output=out, args={op.slot_of(1, "weight"): kw})


@register_rule(F.scaled_dot_product_attention)
def sdpa_rule(op: OpView) -> OpUpdate:
    # softmax(q k^T * scale + mask) v, decomposed: probabilities are never zero except where a
    # boolean/causal mask removes them, so out[i, d] needs v[j, d] kept for an allowed j.
    q, k, v = op.arg(0, "query"), op.arg(1, "key"), op.arg(2, "value")
    if op.kwargs.get("enable_gqa"):
        raise Unsupported("grouped-query attention")
    causal = bool(op.arg(5, "is_causal", False))
    lq, lk = q.shape[-2], k.shape[-2]
    # an attn_mask tensor (additive or boolean) is data: assume every position may attend
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed = torch.tril(allowed)
    scores_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (lq, lk)
    if not causal and q.kept.dim() == k.kept.dim() == v.kept.dim():
        kq, kk, kv, out = attention_masks_unmasked(q.kept, k.kept, v.kept, op.output.kept)
        return OpUpdate(output=out, args={op.slot_of(0, "query"): kq, op.slot_of(1, "key"): kk,
                                          op.slot_of(2, "value"): kv})
    probs = TeSA.from_mask(allowed.expand(scores_shape))
    out, (kp, kv) = multilinear(torch.matmul, [probs, v], op.output)
    # softmax couples a whole row: every score of a row matters if any probability in it does
    rows = any_true(kp & allowed, dim=-1, keepdim=True) & allowed
    scores_out = TeSA.from_mask(rows.expand(scores_shape))
    _, (kq, kk) = multilinear(lambda a, b: torch.matmul(a, b.transpose(-1, -2)), [q, k], scores_out)
    return OpUpdate(output=out, args={op.slot_of(0, "query"): kq, op.slot_of(1, "key"): kk,
                                      op.slot_of(2, "value"): kv})


def attention_masks_unmasked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sdpa_rule`'s product rule in closed form when every query may attend every key.

    With all probabilities possibly non-zero, out[i, d] is kept iff some v[j, d] is, v[j, d]
    matters iff some kept out[i, d] reads it, a query row matters iff its output row has a
    kept element, and then q[i, d] matters iff some k[j, d] is kept (and the reverse for k).
    Reductions over bool masks, no float products (the generic path costs ~25 ms per BERT
    layer). Returns (q kept, k kept, v kept, out kept).

    Example:
        >>> q = k = torch.ones(1, 3, 2, dtype=torch.bool)
        >>> v = torch.tensor([[[True, False]] * 3])
        >>> kq, kk, kv, out = attention_masks_unmasked(q, k, v, torch.ones(1, 3, 2, dtype=torch.bool))
        >>> out[0, 0].tolist(), kv[0, :, 1].tolist()
        ([True, False], [False, False, False])
    """
    out = allowed & any_true(v, dim=-2, keepdim=True)
    rows = any_true(out, dim=-1, keepdim=True)  # query rows whose probabilities matter
    kq = rows & any_true(k, dim=-2, keepdim=True)
    kk = any_true(q & rows, dim=-2, keepdim=True)
    kv = any_true(out, dim=-2, keepdim=True)
    return _fit(kq, q.shape), _fit(kk, k.shape), _fit(kv, v.shape), out


def _fit(mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Broadcast `mask` against `shape`, then or-reduce the dims `shape` broadcasts over."""
    full = torch.broadcast_shapes(mask.shape, shape)
    return any_to(torch.broadcast_to(mask, full), shape).expand(shape)
