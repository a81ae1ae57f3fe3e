"""Tensor scrambling: the rule for ops nobody wrote a rule for.

Run the op many times on random values with the pruned input positions zeroed (and, for a
module, random parameters with pruned positions zeroed): output positions that stay
exactly zero in every trial are pruned. Backward the same way with autograd, random
gradients on the kept outputs: input positions whose gradient is always exactly zero
do not matter. Sound with high probability (random values hit a cancellation with
probability zero), exact only in the limit; used only where no rule exists.
"""

from __future__ import annotations

import torch

from sparta_explore.propagation.registry import OpUpdate, OpView, Unsupported


def _random_like(shape: tuple[int, ...], kept: torch.Tensor, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    return (torch.randn(shape, generator=g) * kept).to(dtype)


def scramble(op: OpView, trials: int = 16, seed: int = 0) -> OpUpdate:
    """Derive forward and backward kept masks of an opaque op from `trials` random runs.

    Example:
        >>> update = scramble(view, trials=8)  # doctest: +SKIP
    """
    slots = op.tensor_slots()
    for slot, _ in slots:
        dtype = op.dtypes.get(slot, torch.float32)
        if not dtype.is_floating_point:
            raise Unsupported(f"scrambling needs float inputs; argument {slot!r} is {dtype}")
    g = torch.Generator().manual_seed(seed)
    # every parameter the module reads, its children's included (a leaf such as nn.MultiheadAttention)
    module_params = dict(op.module.named_parameters(remove_duplicate=False)) if op.module is not None else {}
    outputs = op.output if isinstance(op.output, tuple) else (op.output,)
    out_seen = [torch.zeros(o.shape, dtype=torch.bool) for o in outputs]
    in_seen = {slot: torch.zeros(t.shape, dtype=torch.bool) for slot, t in slots}
    param_seen = {n: torch.zeros(t.shape, dtype=torch.bool) for n, t in op.params.items() if n in module_params}
    for _ in range(trials):
        with torch.enable_grad():
            values = {slot: _random_like(t.shape, t.kept, op.dtypes.get(slot, torch.float32), g).requires_grad_(True)
                      for slot, t in slots}
            params = {n: _random_like(t.shape, t.kept, module_params[n].dtype, g).requires_grad_(True)
                      for n, t in op.params.items() if n in module_params}
            result = op.replay(values, params if op.module is not None else None)
            results = result if isinstance(result, (tuple, list)) else (result,)
            if len(results) != len(outputs):
                raise Unsupported("op returned a different number of tensors than at capture")
            grads_out = []
            for i, (r, o) in enumerate(zip(results, outputs)):
                out_seen[i] |= r.detach() != 0
                grads_out.append(torch.randn(r.shape, generator=g).to(r.dtype) * o.kept)
            leaves = list(values.values()) + list(params.values())
            differentiable = [r for r in results if r.requires_grad]
            if differentiable:
                grads = torch.autograd.grad(differentiable, leaves,
                                            grad_outputs=[go for r, go in zip(results, grads_out) if r.requires_grad],
                                            allow_unused=True)
            else:
                grads = [None] * len(leaves)
        for (slot, _), grad in zip(slots, grads[:len(slots)]):
            if grad is not None:
                in_seen[slot] |= grad != 0
        for name, grad in zip(params, grads[len(slots):]):
            if grad is not None:
                param_seen[name] |= grad != 0
    output = tuple(out_seen) if isinstance(op.output, tuple) else out_seen[0]
    return OpUpdate(output=output, args=in_seen, params=param_seen)
