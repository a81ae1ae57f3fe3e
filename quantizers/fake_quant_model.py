"""The model that calibration measures: every weighted op computes what its compiled kernel computes.

The contract with the compiler (sparta_explore.plan / compile), modelled op by op:

* `nn.Linear` whose kept weights are all at <= 8 bits and whose input activation is at <= 8 bits
  runs the int8 kernel: weights on a symmetric grid per output row at the weight's bits,
  activations on a symmetric grid per row (per token) at the activation's bits, scales taken
  dynamically from the values (`fake_quant.quantized_linear`).
* `nn.Linear` with weights at <= 8 bits and an activation above 8 bits: the fp32 kernel on
  `fake_quantize_rows(weight)`; the activation is not quantized.
* `nn.Conv1d/2d/3d`: weights fake-quantized per output channel (rows of ``weight.reshape(out, -1)``),
  run in fp32. There is no integer conv kernel, so conv inputs are never quantized.
* Anything above 8 bits, 16 included, is plain fp32: the plan rounds 16 up to 32, so a 16-bit
  tensor is modelled as exact (not as a 16-bit grid). Biases are always fp32.

The weight an op uses is its *effective* weight: masked by the TeSA (pruned stays zero), then
clipped per row to ``clip * max|row|``. The kernels take the scale from the values (max|row| /
qmax), so a clipped weight stored back into the model reproduces the learned scale exactly.

Example:
    >>> g = capture(nn.Sequential(nn.Linear(4, 3)), torch.randn(2, 4))
    >>> gm, ops = fake_quant_model(g, {"0.weight": TeSA.dense((3, 4), bits=8), "input_1": TeSA.dense((1, 4), bits=8)})
    >>> ops["_0"].runs_int8
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from sparta_explore.errors import ConfigError
from sparta_explore.fake_quant import INT_BITS, fake_quantize_rows, quantized_linear
from sparta_explore.graph import Graph, capture  # noqa: F401  (capture: used by the docstring examples)
from sparta_explore.masking import masked_copy
from sparta_explore.tesa import MAX_BITS, TeSA
from sparta_explore.tracing.copying import deep_copy

WEIGHTED_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def is_int_bits(bits: int) -> bool:
    """True if the int8 kernels run `bits` exactly (2..8); wider widths run in fp32.

    Example:
        >>> is_int_bits(4), is_int_bits(16)
        (True, False)
    """
    return bits in INT_BITS


def tensor_bits(tesa: TeSA | None) -> int:
    """The width a kernel runs a tensor at: its widest kept element (32 if absent or all pruned).

    Example:
        >>> tensor_bits(TeSA(torch.tensor([0, 4, 8]))), tensor_bits(None)
        (8, 32)
    """
    if tesa is None or tesa.group:  # per-group grids: the weight holds its de-quantized values, run as they are
        return MAX_BITS
    return max(tesa.kept_bits(), default=MAX_BITS)


@dataclass(frozen=True)
class WeightedOp:
    """One call of a weighted module in the graph: what calibration visits.

    `node` is the fx node name, `module` the submodule FQN, `weight` / `bias` the parameter
    FQNs (bias None if absent), `input` the table name of the tensor flowing in, and
    `linear` whether the int8 kernel can run it.
    """

    node: str
    module: str
    weight: str
    bias: str | None
    input: str | None
    linear: bool


def weighted_ops(graph: Graph) -> list[WeightedOp]:
    """The weighted ops of `graph` in topological order (Linear and Conv1d/2d/3d modules).

    A module called more than once is left out: its one weight would need one grid for
    calls whose inputs differ, which calibration does not model.

    Example:
        >>> [op.module for op in weighted_ops(capture(nn.Sequential(nn.Linear(4, 3)), torch.randn(2, 4)))]
        ['0']
    """
    calls: dict[str, int] = {}
    found = []
    for node in graph.nodes():
        if node.op != "call_module":
            continue
        mod = graph.module.get_submodule(node.target)
        if not isinstance(mod, WEIGHTED_TYPES):
            continue
        calls[node.target] = calls.get(node.target, 0) + 1
        params = graph.params_of(node)
        first = node.args[0] if node.args else None
        found.append(WeightedOp(node=node.name, module=node.target, weight=params["weight"],
                                bias=params.get("bias") if mod.bias is not None else None,
                                input=graph.tensor_name(first) if isinstance(first, fx.Node) else None,
                                linear=isinstance(mod, nn.Linear)))
    return [op for op in found if calls[op.module] == 1]


def _check_bits(bits: int, what: str) -> int:
    if not (is_int_bits(bits) or 8 < bits <= MAX_BITS):
        raise ConfigError(f"{what} is at {bits} bits; the kernels run 2..8 (int) or 9..32 (fp32)")
    return bits


class FakeQuantOp(nn.Module):
    """A weighted module computing what its compiled kernel computes at the given bits.

    Holds the wrapped module (its weight masked in place), the weight's kept mask, a
    per-row clip ratio in (0, 1] and the weight and activation bit widths; all are
    mutable so calibration can try a setting and restore it.

    Example:
        >>> op = FakeQuantOp(nn.Linear(8, 4), torch.ones(4, 8, dtype=torch.bool), weight_bits=4, act_bits=32)
        >>> op(torch.randn(2, 8)).shape, op.runs_int8
        (torch.Size([2, 4]), False)
    """

    def __init__(self, module: nn.Module, weight_kept: torch.Tensor, bias_kept: torch.Tensor | None = None, *,
                 weight_bits: int = MAX_BITS, act_bits: int = MAX_BITS, name: str = "op") -> None:
        super().__init__()
        if not isinstance(module, WEIGHTED_TYPES):
            raise ConfigError(f"{name}: FakeQuantOp wraps {[t.__name__ for t in WEIGHTED_TYPES]}, "
                              f"got {type(module).__name__}")
        self.inner = module
        self.name = name
        weight = module.weight
        self.register_buffer("weight_kept", weight_kept.to(torch.bool).expand(weight.shape).clone())
        has_bias = getattr(module, "bias", None) is not None
        self.register_buffer("bias_kept", None if not has_bias else (
            torch.ones_like(module.bias, dtype=torch.bool) if bias_kept is None
            else bias_kept.to(torch.bool).expand(module.bias.shape).clone()))
        self.register_buffer("clip", torch.ones(weight.shape[0]))
        self.weight_bits = _check_bits(weight_bits, f"{name} weight")
        self.act_bits = _check_bits(act_bits, f"{name} input")
        with torch.no_grad():  # pruned stays pruned, whatever tuning does later
            weight.mul_(self.weight_kept)
            if has_bias:
                module.bias.mul_(self.bias_kept)

    @property
    def linear(self) -> bool:
        """True for nn.Linear, the only op with an integer kernel."""
        return isinstance(self.inner, nn.Linear)

    @property
    def runs_int8(self) -> bool:
        """True when the compiled model runs this op in the int8 kernel (weights and input <= 8 bits)."""
        return self.linear and is_int_bits(self.weight_bits) and is_int_bits(self.act_bits)

    def effective_weight(self, weight: torch.Tensor | None = None, clip: torch.Tensor | None = None) -> torch.Tensor:
        """The masked weight clipped per output row to ``clip * max|row|`` (differentiable in both).

        These are the values to store in the model: the kernel's scale max|row| / qmax then
        equals the clipped range.

        Example:
            >>> op = FakeQuantOp(nn.Linear(2, 1), torch.ones(1, 2, dtype=torch.bool))
            >>> with torch.no_grad():
            ...     _ = op.inner.weight.copy_(torch.tensor([[1.0, -4.0]]))
            >>> op.effective_weight(clip=torch.tensor([0.5])).tolist()
            [[1.0, -2.0]]
        """
        w = (self.inner.weight if weight is None else weight) * self.weight_kept
        c = self.clip if clip is None else clip
        rows = w.reshape(w.shape[0], -1)
        bound = rows.detach().abs().amax(dim=1, keepdim=True) * c.unsqueeze(1)
        return torch.minimum(torch.maximum(rows, -bound), bound).reshape(w.shape)

    def effective_bias(self, bias: torch.Tensor | None = None) -> torch.Tensor | None:
        """The bias masked by its TeSA (None if the module has none).

        Example:
            >>> op = FakeQuantOp(nn.Linear(2, 2), torch.ones(2, 2, dtype=torch.bool), torch.tensor([True, False]))
            >>> op.effective_bias()[1].item() == 0
            True
        """
        b = self.inner.bias if bias is None else bias
        return None if b is None else b * self.bias_kept

    def call_with(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The wrapped module's own op with `weight` (and `bias`) swapped in: the fp32 path.

        Example:
            >>> op = FakeQuantOp(nn.Linear(3, 2), torch.ones(2, 3, dtype=torch.bool))
            >>> op.call_with(torch.ones(1, 3), torch.zeros(2, 3), torch.ones(2)).tolist()
            [[1.0, 1.0]]
        """
        params = {"weight": weight}
        if bias is not None:
            params["bias"] = bias
        return functional_call(self.inner, params, (x,))

    def quantized_weight(self) -> torch.Tensor:
        """The weight as the kernel holds it: the effective weight on its per-row grid (if <= 8 bits).

        Example:
            >>> op = FakeQuantOp(nn.Linear(8, 2), torch.ones(2, 8, dtype=torch.bool), weight_bits=2)
            >>> len(op.quantized_weight()[0].abs().unique()) <= 2  # a 2-bit row holds 0 and +-scale only
            True
        """
        w = self.effective_weight()
        if not is_int_bits(self.weight_bits):
            return w
        return fake_quantize_rows(w.reshape(w.shape[0], -1), self.weight_bits).reshape(w.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.effective_bias()
        if self.runs_int8:
            return quantized_linear(x, self.effective_weight(), bias, weight_bits=self.weight_bits,
                                    act_bits=self.act_bits)
        return self.call_with(x, self.quantized_weight(), bias)

    def extra_repr(self) -> str:
        clip = float(self.clip.min())
        return (f"weight_bits={self.weight_bits}, act_bits={self.act_bits}, int8_kernel={self.runs_int8}, "
                f"min_clip={clip:.3f}")


def op_mse(op: nn.Module, x: torch.Tensor, target: torch.Tensor) -> float:
    """Mean squared error between `op(x)` and `target` (no gradient).

    Example:
        >>> op_mse(nn.Identity(), torch.ones(2), torch.zeros(2))
        1.0
    """
    with torch.no_grad():
        return float(F.mse_loss(op(x), target))


def reference_model(graph: Graph, model: nn.Module, table: Mapping[str, TeSA]) -> fx.GraphModule:
    """The fp32 model with the table's pruning applied, as a GraphModule (a copy; `model` untouched).

    Example:
        >>> g = capture(nn.Sequential(nn.Linear(2, 2)), torch.randn(1, 2))
        >>> ref = reference_model(g, g.root, {"0.weight": TeSA.from_mask(torch.eye(2))})
        >>> ref.get_submodule("0").weight.count_nonzero()
        tensor(2)
    """
    gm = fx.GraphModule(masked_copy(model, table), deep_copy(graph.fx_graph))
    return gm.eval()


def fake_quant_model(graph: Graph, table: Mapping[str, TeSA], model: nn.Module | None = None,
                     ops: list[WeightedOp] | None = None) -> tuple[fx.GraphModule, dict[str, FakeQuantOp]]:
    """A copy of `model` (default: the graph's root) whose weighted ops compute what the kernels compute.

    Bits come from `table` (the widest kept element of each tensor; 32 where absent).
    Returns the GraphModule and its `FakeQuantOp`s by fx node name.

    Example:
        >>> g = capture(nn.Sequential(nn.Linear(4, 3)), torch.randn(2, 4))
        >>> gm, ops = fake_quant_model(g, {"0.weight": TeSA.dense((3, 4), bits=4)})
        >>> ops["_0"].weight_bits, ops["_0"].act_bits
        (4, 32)
    """
    gm = reference_model(graph, graph.root if model is None else model, table)
    wrappers: dict[str, FakeQuantOp] = {}
    for op in weighted_ops(graph) if ops is None else ops:
        mod = gm.get_submodule(op.module)
        weight_tesa, bias_tesa = table.get(op.weight), table.get(op.bias) if op.bias else None
        wrapper = FakeQuantOp(mod, weight_tesa.kept if weight_tesa is not None else torch.ones((), dtype=torch.bool),
                              bias_tesa.kept if bias_tesa is not None else None,
                              weight_bits=tensor_bits(weight_tesa),
                              act_bits=tensor_bits(table.get(op.input)) if op.input else MAX_BITS, name=op.module)
        parent, _, child = op.module.rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, child, wrapper)
        wrappers[op.node] = wrapper
    return gm.eval(), wrappers
