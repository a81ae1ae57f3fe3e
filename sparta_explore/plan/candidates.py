"""Candidate generators, one per op kind, registered by decorator.

Each generator turns what the planner knows about an op (`OpInfo`) into the candidate
decompositions the device can run, each with a predicted time. Dense is always a
candidate, and dense-shrink whenever whole rows or columns are pruned, so a measured
choice is never slower than dense.

Example:
    >>> @register_candidates("my_kind")
    ... def mine(info, device):
    ...     return [dense_candidate(info, device)]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sparta_explore.compact import any_true
from sparta_explore.device import INT8, DeviceProfile
from sparta_explore.plan.bit_rounding import BitOption, bit_options
from sparta_explore.plan.block_cover import Cover, single_shape_cover, tile_counts, weighted_block_cover
from sparta_explore.plan.execution_plan import FP32, Candidate, SubOp
from sparta_explore.registry import Registry

# index_select of the kept columns and scatter into the full output, relative to a dense op of that size
SHRINK_COPY_SHARE = 0.05


@dataclass(frozen=True)
class OpInfo:
    """One weighted op as the planner sees it: 2-D kept mask and bits (out x in view), rows, activation bits."""

    name: str
    kind: str
    kept: torch.Tensor = field(hash=False, compare=False)
    bits: torch.Tensor = field(hash=False, compare=False)
    m: int
    act_bits: int
    groups: int = 1
    int8_kernels: bool = True  # whether an int8 kernel can run the op (int8 convs: stride 1 only)
    span: tuple[int, int] | None = None  # (narrowest, widest) kept bits when known (the TeSA's histogram)

    @property
    def out_features(self) -> int:
        return self.kept.shape[0]

    @property
    def in_features(self) -> int:
        return self.kept.shape[1]


Generator = Callable[[OpInfo, DeviceProfile], list[Candidate]]
CANDIDATES: Registry = Registry("candidate generator")


def register_candidates(kind: str) -> Callable[[Generator], Generator]:
    """Register the candidate generator for ops of `kind` ("linear", "conv", ...)."""
    def add(fn: Generator) -> Generator:
        CANDIDATES.add(kind, fn)
        return fn
    return add


def _fp32_grid(option: BitOption, width: int) -> int:
    """Weights asked for <= 8 bits but run in fp32 are fake-quantized to their grid (exactly as asked)."""
    grid = option.grid[width]
    return grid if grid <= INT8 else FP32


def _dense_grids(info: OpInfo) -> tuple[int, int]:
    """(weight grid, activation grid) of a dense op computing what the TeSAs ask: an op whose weights and
    input are both at <= 8 bits quantizes its input too (a linear per row, a conv per image), as the int8
    kernels do."""
    top = int(info.bits.max()) if info.bits.numel() else FP32
    grid = top if 0 < top <= INT8 else FP32
    act = info.act_bits if grid <= INT8 and info.act_bits <= INT8 else FP32
    return grid, act


def dense_candidate(info: OpInfo, device: DeviceProfile) -> Candidate:
    """The unchanged dense op (masked weights; fake-quantized when asked for <= 8 bits)."""
    grid, act = _dense_grids(info)
    ms = device.dense_ms(out_features=info.out_features, in_features=info.in_features, bits=FP32, m=info.m)
    return Candidate("dense", (SubOp("dense", tuple(info.kept.shape), grid, act, 1, info.kept),), ms)


def shrink_candidate(info: OpInfo, device: DeviceProfile) -> Candidate | None:
    """Dense over the kept rows and columns only; None when no row or column is fully pruned."""
    rows, cols = int(any_true(info.kept, dim=1).sum()), int(any_true(info.kept, dim=0).sum())
    if rows == info.out_features and cols == info.in_features:
        return None
    dense = dense_candidate(info, device)
    share = rows * cols / max(1, info.out_features * info.in_features)
    ms = dense.predicted_ms * (share + SHRINK_COPY_SHARE)
    part = dense.parts[0]
    return Candidate("shrink", (SubOp("shrink", (rows, cols), part.weight_bits, part.act_bits, 1, info.kept),), ms)


# A cover is offered only when predicted this much faster than the best single block shape: each extra part
# packs the input again, which the per-block costs leave out (BERT-base at 90% unstructured, int8: a cover
# predicted 1% faster measured 1.5-1.8x slower, in every op)
COVER_GAIN = 0.85


def _cover_costs(device: DeviceProfile, bits: int) -> dict[tuple[int, int], float]:
    return {b: device.block_ns(bits, b) for b in device.blocks}


def _best_single(mask: torch.Tensor, costs: dict[tuple[int, int], float], counts: dict) -> Cover:
    return min((single_shape_cover(mask, b, c, counts.get(b)) for b, c in costs.items()), key=lambda cv: cv.cost)


def _sub_ops(cover: Cover, kernel: str, weight_bits: int, act_bits: int) -> list[SubOp]:
    return [SubOp(kernel, p.block, weight_bits, act_bits, p.n_blocks, p.mask) for p in cover.parts]


def sparse_candidates(info: OpInfo, device: DeviceProfile) -> list[Candidate]:
    """Per bit option: one kernel with the best single block shape, and the weighted block cover.

    None when the device runs no block kernels (no compiler on this machine).
    """
    out: list[Candidate] = []
    if not device.blocks:
        return out
    overhead = device.op_overhead_us / 1e3
    int8_ok = INT8 in device.bits and info.act_bits <= INT8 and info.int8_kernels
    for option in bit_options(info.bits, device.bits, kept=info.kept.contiguous(), span=info.span):
        if option.name == "split" and not int8_ok:
            continue  # without int8 activations every part runs in fp32: splitting only adds a pass
        single, covered = [], []
        cost_single = cost_cover = 0.0
        for width, mask in option.parts.items():
            run_int8 = width <= INT8 and int8_ok
            kernel, w_grid = ("int8", option.grid[width]) if run_int8 else ("sparse", _fp32_grid(option, width))
            a_grid = info.act_bits if run_int8 else FP32
            costs = _cover_costs(device, INT8 if run_int8 else FP32)
            counts = {b: tile_counts(mask, b) for b in costs if b != (1, 1)}  # both covers count each shape first
            best = _best_single(mask, costs, counts)
            cover = weighted_block_cover(mask, costs, counts=counts)
            single += _sub_ops(best, kernel, w_grid, a_grid)
            covered += _sub_ops(cover, kernel, w_grid, a_grid)
            cost_single += best.cost
            cost_cover += cover.cost
        prefix = "" if option.name == "uniform" else "split-"
        ms = lambda ns, parts: ns * info.m / 1e6 + overhead * max(1, len(parts))  # noqa: E731
        out.append(Candidate(f"{prefix}sparse", tuple(single), ms(cost_single, single)))
        worth_it = ms(cost_cover, covered) < COVER_GAIN * ms(cost_single, single)
        if worth_it and [(p.block, p.n_blocks) for p in covered] != [(p.block, p.n_blocks) for p in single]:
            out.append(Candidate(f"{prefix}cover", tuple(covered), ms(cost_cover, covered)))
    return out


@register_candidates("linear")
def linear_candidates(info: OpInfo, device: DeviceProfile) -> list[Candidate]:
    """Dense, dense-shrink, sparse kernels (fp32 / int8, single shape or block cover, uniform or split bits)."""
    found = [dense_candidate(info, device), shrink_candidate(info, device)]
    if bool(any_true(info.kept)):
        found += sparse_candidates(info, device)
    return [c for c in found if c is not None]


@register_candidates("conv")
def conv_candidates(info: OpInfo, device: DeviceProfile) -> list[Candidate]:
    """Dense, channel-shrunk and sparse convolutions (any kernel, stride, padding); low bits fake-quantized in fp32.

    Sparse convs run the sparse linear kernels as implicit GEMM: the kernel gathers its
    im2col tiles from the NCHW input itself (`kernels/conv_geometry.py`), one block shape per
    conv (no summed parts). fp32 for any geometry; int8 (weights and input both at <= 8 bits,
    each input image on one grid) for stride-1 convs, where it reads shifted windows of one
    quantized copy of the input; other strides get the fp32 kernel on the weights' grid, as
    linears do where the machine has no int8 kernels. The
    predicted time counts the products, not the packing, so measured choice is what keeps a
    slower kernel out. Grouped convolutions (depthwise) only run dense: dropping channels
    would break the grouping.
    """
    if info.groups != 1:
        return [dense_candidate(info, device)]
    found = [dense_candidate(info, device), shrink_candidate(info, device)]
    if bool(any_true(info.kept)):
        found += [c for c in sparse_candidates(info, device) if len(c.parts) == 1]
    return [c for c in found if c is not None]
