"""CompiledOp: what every compiled op promises about its input, its dtype and its gradients.

Compiled kernels read raw memory through ctypes, so a tensor they cannot read (meta, on
another device, integer, the wrong feature size) would crash the process or compute
garbage. Every op checks its input first and refuses it with one `KernelInputError` that
names the op and what is wrong, before anything reaches C.

Two more promises, the same for every op:

* **dtype in = dtype out.** float32 runs the fast path; float64, float16 and bfloat16 run
  the op's PyTorch reference in the caller's dtype (int8 ops quantize the float32 value of
  the input: quantization fixes the precision anyway) and return that dtype.
* **Gradients are never silently missing.** The kernels have no backward. With grad mode on
  and an input that requires grad, fp32 ops run their reference, so autograd sees the exact
  op; an integer op raises `KernelGradError` (rounding has no gradient worth trusting).
  Weights are buffers: a compiled model is for inference, train the original.

Example:
    >>> op = DenseLinear(torch.eye(3), None)                       # doctest: +SKIP
    >>> op(torch.ones(2, 3, dtype=torch.float64)).dtype            # doctest: +SKIP
    torch.float64
"""

from __future__ import annotations

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from sparta_explore.errors import SpartaError
from sparta_explore.fake_quant import INT_BITS, fake_quantize_rows

FAST_DTYPE = torch.float32
FP32_BITS = 32


class KernelInputError(SpartaError, ValueError):
    """A compiled op was given a tensor it cannot run on; the message names the op and the problem."""


class KernelGradError(SpartaError, RuntimeError):
    """Gradients were required through an op that has no faithful backward (an integer kernel)."""


def describe(x: torch.Tensor) -> str:
    """A short description of a tensor for error messages.

    Example:
        >>> describe(torch.zeros(2, 3))
        'float32 tensor of shape (2, 3) on cpu'
    """
    return f"{str(x.dtype).replace('torch.', '')} tensor of shape {tuple(x.shape)} on {x.device}"


def check_input(op: str, x: object, features: int, dim: int = -1, ndim: tuple[int, ...] | None = None) -> None:
    """Refuse, with one clear error, any input the compiled op `op` cannot read.

    `features` is the size dimension `dim` must have; `ndim`, when given, the allowed ranks.

    Example:
        >>> check_input("fc1", torch.zeros(4, 8, device="meta"), 8)
        Traceback (most recent call last):
        ...
        sparta_explore.kernels.compiled_op.KernelInputError: fc1: compiled ops run on CPU tensors with data; ...on meta
    """
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"{op}: expected a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cpu":
        raise KernelInputError(f"{op}: compiled ops run on CPU tensors with data; got {describe(x)}")
    if not x.is_floating_point():
        raise KernelInputError(f"{op}: expected a floating-point input (float32 runs the kernel), got {describe(x)}")
    if x.is_complex() or x.is_quantized or x.is_sparse:
        raise KernelInputError(f"{op}: expected a dense real tensor, got {describe(x)}")
    if ndim is not None and x.dim() not in ndim:
        raise KernelInputError(f"{op}: expected a {' or '.join(map(str, ndim))}-D input, got {describe(x)}")
    if x.dim() == 0 or x.shape[dim] != features:
        raise KernelInputError(f"{op}: expected {features} features in dimension {dim}, got {describe(x)}")


def _without_data(x: torch.Tensor) -> bool:
    """A meta or fake tensor (shape propagation): no memory a kernel could read, so the reference runs."""
    return x.device.type == "meta" or isinstance(x, FakeTensor)


class CompiledOp(nn.Module):
    """Base of compiled ops: input check, dtype and autograd policy around `_fast(x)` and `reference(x)`.

    Subclasses set `in_features` (and `feature_dim` / `input_ndim` when not linear-like)
    and implement `_fast(x)` (float32, contiguous enough, no grad) and `reference(x)` (any
    float dtype, differentiable). `exact_grad = False` marks ops whose reference rounds.

    Example:
        >>> class Twice(CompiledOp):
        ...     in_features = 2
        ...     def _fast(self, x): return 2 * x
        ...     def reference(self, x): return 2 * x
        >>> Twice()(torch.ones(1, 2)).tolist()
        [[2.0, 2.0]]
    """

    in_features: int
    feature_dim: int = -1
    input_ndim: tuple[int, ...] | None = None
    exact_grad: bool = True

    label: str | None = None  # set by compile to the graph op it replaces

    def op_name(self) -> str:
        """How errors name this op: its graph op when compiled, else its class and shape."""
        if self.label:
            return f"op {self.label!r} ({type(self).__name__})"
        out = getattr(self, "out_features", None)
        return f"{type(self).__name__} {self.in_features}->{out}" if out is not None else type(self).__name__

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(self.op_name(), x, self.in_features, self.feature_dim, self.input_ndim)
        if torch.is_grad_enabled() and x.requires_grad:
            if not self.exact_grad:
                raise KernelGradError(f"{self.op_name()}: an integer kernel has no gradient; run the compiled "
                                      "model under torch.no_grad() / torch.inference_mode(), or train the "
                                      "original model")
            return self.reference(x)
        if x.dtype != FAST_DTYPE or _without_data(x):
            return self.reference(x)
        return self._fast(x)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement _fast")

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement reference")


def float_inputs_only(op: CompiledOp) -> None:
    """A ValueError naming `op` if it rounds its inputs (`act_bits` < 32): its `as_linear` is not what it computes.

    Example:
        >>> float_inputs_only(CompiledOp())
    """
    bits = getattr(op, "act_bits", FP32_BITS)
    if bits != FP32_BITS:
        raise ValueError(f"{op.op_name()} rounds its inputs to {bits} bits per row")


def check_act_bits(bits: int) -> int:
    """`bits` if it is 32 (float input) or a grid the int8 kernels run (2..8), else a ValueError.

    Example:
        >>> check_act_bits(8), check_act_bits(32)
        (8, 32)
    """
    if bits != FP32_BITS and bits not in INT_BITS:
        raise ValueError(f"act_bits must be 32 or 2..8, got {bits}")
    return int(bits)


def quantized_images(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Each image of the batch `x` (N, ...) on its own symmetric `bits` grid, as the int8 conv kernels
    quantize a conv's input; 32 leaves it.

    Example:
        >>> quantized_images(torch.tensor([[[1.0, 0.3]], [[0.2, 0.0]]]), 2).flatten().tolist()
        [1.0, 0.0, 0.20000000298023224, 0.0]
    """
    if bits == FP32_BITS:
        return x
    return fake_quantize_rows(x.reshape(x.shape[0], -1), bits).reshape(x.shape)


def quantized_input(x: torch.Tensor, bits: int) -> torch.Tensor:
    """`x`'s rows on their symmetric `bits` grid (what the int8 kernels do to their input); 32 leaves it.

    Example:
        >>> quantized_input(torch.tensor([[1.0, 0.3]]), 2).tolist()
        [[1.0, 0.0]]
    """
    return x if bits == FP32_BITS else fake_quantize_rows(x, bits)
