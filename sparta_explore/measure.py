"""measure(): the real latency of a model on this machine, with FLOPs beside it (never instead).

Latency is wall time of whole forward calls under `torch.inference_mode()`, after warm-up,
summarized as median and p10/p90. Peak memory is the growth of the process's resident set
during the timed runs (Linux resets the high-water mark through /proc/self/clear_refs).

Example:
    >>> m = measure(nn.Linear(64, 64), (torch.randn(32, 64),), runs=5)
    >>> m.median_ms > 0 and m.dense_flops == 2 * 32 * 64 * 64
    True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from sparta_explore.callable_module import make_callable
from sparta_explore.timing import interleaved_ms
from sparta_explore.tracing.inputs import as_call, set_mode


@dataclass(frozen=True)
class Measurement:
    """One model's measured latency (ms), memory and FLOPs on this machine.

    Example:
        >>> measure(nn.Linear(8, 8), (torch.randn(2, 8),), runs=3).runs
        3
    """

    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int
    threads: int
    peak_memory_mb: float | None
    weight_bytes: int
    dense_flops: int
    effective_flops: int

    def as_dict(self) -> dict[str, float | int | None]:
        """A flat dict (one results-table row fragment).

        Example:
            >>> sorted(measure(nn.Linear(8, 8), (torch.randn(2, 8),), runs=3).as_dict())[:2]
            ['dense_flops', 'effective_flops']
        """
        return asdict(self)


def _nonzero_fraction(t) -> float:
    if callable(t):  # torch's quantized modules expose weight() as a method
        t = t()
    if isinstance(t, torch.Tensor) and t.is_quantized:
        t = t.dequantize()
    if t is None or t.numel() == 0:
        return 1.0
    return float((t != 0).sum()) / t.numel()


def _linear_flops(module: nn.Module, out: torch.Tensor, features: tuple[int, int] | None = None) -> tuple[int, float]:
    n_in, n_out = features or (module.in_features, module.out_features)
    rows = out.numel() // n_out
    dense = 2 * rows * n_in * n_out
    density = getattr(module, "density", None)
    return dense, density if density is not None else _nonzero_fraction(module.weight)


def _conv_flops(module: nn.Module, out: torch.Tensor) -> tuple[int, float]:
    per_output = 2 * (module.in_channels // module.groups) * math.prod(module.kernel_size)
    dense = out.numel() * per_output
    density = getattr(module, "density", None)
    return dense, density if density is not None else _nonzero_fraction(module.weight)


def _flops_of(module: nn.Module, out: object) -> tuple[int, float] | None:
    """(dense FLOPs, fraction of them the module really does) for weighted ops, else None.

    Duck-typed so compiled ops count too: linear-like modules expose in/out_features,
    conv-like ones in/out_channels + kernel_size + groups, Hugging Face's Conv1D `nf`; `density` overrides the
    nonzero fraction of `weight`.
    """
    if not isinstance(out, torch.Tensor):
        return None
    if hasattr(module, "in_features") and hasattr(module, "out_features"):
        return _linear_flops(module, out)
    if hasattr(module, "in_channels") and hasattr(module, "kernel_size") and hasattr(module, "groups"):
        return _conv_flops(module, out)
    weight = getattr(module, "weight", None)
    if hasattr(module, "nf") and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return _linear_flops(module, out, (weight.shape[0], weight.shape[1]))  # HF Conv1D: weight (in, out)
    return None


def call_of(inputs: Any) -> tuple[tuple, dict]:
    """(args, kwargs) for calling a model on `inputs`: a tensor, a tuple, a dict of keyword inputs, or a `Graph`.

    Example:
        >>> call_of({"input_ids": 1})
        ((), {'input_ids': 1})
    """
    from sparta_explore.graph import Graph

    if isinstance(inputs, Graph):
        return tuple(inputs.call_args), dict(inputs.call_kwargs)
    return as_call(inputs)


def count_flops(model: nn.Module, example_inputs: Any) -> tuple[int, int]:
    """(dense, effective) multiply-add FLOPs (2 per MAC) of the weighted ops in one forward.

    Effective FLOPs scale each op by the fraction of its weights that are nonzero (or the
    `density` a compiled op reports): what a perfect sparse kernel would compute.

    Example:
        >>> lin = nn.Linear(4, 4); lin.weight.data[:2] = 0
        >>> count_flops(lin, (torch.randn(3, 4),))
        (96, 48)
    """
    totals = [0, 0.0]
    claimed: set[int] = set()  # submodules of a weighted op already counted by their owner

    def claim(module: nn.Module, args: tuple) -> None:
        # pre-hooks fire outer-first: a weighted op claims its children before they run
        if id(module) not in claimed and any(hasattr(module, a) for a in ("in_features", "in_channels", "nf")):
            claimed.update(id(m) for m in module.modules() if m is not module)

    def count(module: nn.Module, args: tuple, out: object) -> None:
        flops = None if id(module) in claimed else _flops_of(module, out)
        if flops is not None:
            totals[0] += flops[0]
            totals[1] += flops[0] * flops[1]

    args, kwargs = call_of(example_inputs)
    handles = [h for m in model.modules()
               for h in (m.register_forward_pre_hook(claim), m.register_forward_hook(count))]
    try:
        with torch.inference_mode():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return int(totals[0]), int(round(totals[1]))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of all parameters and buffers (each tensor once), i.e. what the model keeps in memory.

    Example:
        >>> weight_bytes(nn.Linear(4, 2))
        40
    """
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def _rss_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(model: nn.Module, example_inputs: Any, *, runs: int = 30, warmup: int = 3,
            count: bool = True) -> Measurement:
    """Time `runs` forward calls of `model` on `example_inputs` after `warmup` untimed ones.

    `example_inputs` is a tuple of positional inputs, a dict of keyword inputs, or a
    `Graph` (called the way it was captured). `count=False` skips the FLOP count (one
    extra forward with hooks).

    Example:
        >>> m = measure(model, (x,), runs=20)  # doctest: +SKIP
        >>> print(f"{m.median_ms:.2f} ms (p10 {m.p10_ms:.2f}, p90 {m.p90_ms:.2f})")  # doctest: +SKIP
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    args, kwargs = call_of(example_inputs)
    was_training = set_mode(model, False)
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                model(*args, **kwargs)
            rss0 = _rss_kib("VmRSS")
            tracked = _reset_peak_rss() and rss0 is not None
            (times,) = interleaved_ms([model], runs, args, kwargs)
            peak = _rss_kib("VmHWM") if tracked else None
        dense, effective = count_flops(model, example_inputs) if count else (0, 0)
    finally:
        set_mode(model, was_training)
    p10, median, p90 = np.percentile(times, [10, 50, 90])
    return Measurement(
        median_ms=float(median), p10_ms=float(p10), p90_ms=float(p90), runs=runs, threads=torch.get_num_threads(),
        peak_memory_mb=None if peak is None else max(0.0, (peak - rss0) / 1024.0),
        weight_bytes=weight_bytes(model), dense_flops=dense, effective_flops=effective)


make_callable(__name__, "measure")
