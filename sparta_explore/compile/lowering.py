"""Lowering: a planned candidate becomes an nn.Module of kernels (one builder per kernel family).

Builders are registered per (kernel family, op kind). A candidate with one sub-operator
gets the bias and activation fused into its kernel; several sub-operators are wrapped in
`SummedParts` (bias and activation once, after the sum). Weights run at fewer than 8 bits
in fp32 kernels are fake-quantized first (sparta_explore.fake_quant), so every family
computes the numbers the TeSA asked for.

Example:
    >>> op = lower(candidate, LowerContext(module, "relu", m=4096, cache_dir=None, tune=False))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from sparta_explore.compact import kept_only
from sparta_explore.fake_quant import fake_quantize_rows
from sparta_explore.kernels.bsr_codegen import TileConfig
from sparta_explore.kernels.conv_geometry import ConvGeometry
from sparta_explore.kernels.dense import DenseConv2d, DenseLinear, ShrunkConv2d, SummedParts
from sparta_explore.kernels.groups import shared_rows
from sparta_explore.kernels.permute_int8 import int8_kernel_for
from sparta_explore.kernels.shrink import ShrunkLinear
from sparta_explore.kernels.sparse_conv import ImplicitConvLinear, Int8ConvLinear, SparseConv2d
from sparta_explore.kernels.sparse_linear import SparseLinear
from sparta_explore.kernels.tuning import default_tile, searched
from sparta_explore.plan.execution_plan import FP32, Candidate, SubOp
from sparta_explore.registry import Registry


@dataclass(frozen=True)
class LowerContext:
    """What every builder needs besides the sub-operator: the original module, fusion, rows, cache.

    `in_shape` is the shape of the op's input in the captured run, when known: convolutions
    bake their input size into an implicit-GEMM kernel. `tune` runs the tile search (cached per
    pattern class); `searched_tiles` takes the tiling a search already found for the class, if
    any, and times nothing (a later layer or trial of the class is built tuned the first time);
    `tile_for` builds one candidate in a given tiling (the op it fuses with: `pair_tiles.py`).
    """

    module: nn.Module
    activation: str
    m: int
    cache_dir: str | os.PathLike | None
    tune: bool
    in_shape: tuple[int, ...] | None = None
    searched_tiles: bool = False
    tile_for: tuple[str, TileConfig] | None = None  # (candidate name, tiling): that candidate is built so tiled
    tile: TileConfig | None = None  # set by `lower` from `tile_for` for the candidate it names
    masked: bool = False  # `module`'s weight is zero wherever the op's TeSA prunes (compile's working copy)
    whole: bool = False  # set by `lower`: the candidate is one part (its mask is the op's whole kept mask)
    few_rows: bool = False  # linears also get one-row kernels for 1-8 rows where those measure faster


def _tile(mask: torch.Tensor, block_rows: int, activation: str, ctx: LowerContext) -> dict:
    """The tiling keywords of one sparse sub-operator: the one given (`ctx.tile`: the tiling of the op it will
    fuse with), "auto" (search now), the class's search result, or the default tiling."""
    if ctx.tile is not None:
        return {"tile": ctx.tile, "tile_searched": True}
    if ctx.tune:
        return {"tile": "auto"}
    kept = mask.cpu().numpy().astype(bool)
    found = searched(kept, block_rows, activation, ctx.m, ctx.cache_dir) if ctx.searched_tiles else None
    if found is not None:
        return {"tile": found, "tile_searched": True}
    return {"tile": default_tile(kept, block_rows, ctx.m)}


Builder = Callable[[SubOp, torch.Tensor | None, str, LowerContext], nn.Module]
BUILDERS: Registry = Registry("kernel builder")


def register_builder(kernel: str, kind: str) -> Callable[[Builder], Builder]:
    """Register how to build sub-operators of family `kernel` for ops of `kind`."""
    def add(fn: Builder) -> Builder:
        BUILDERS.add(f"{kernel}:{kind}", fn)
        return fn
    return add


def part_weight(module: nn.Module, sub: SubOp) -> torch.Tensor:
    """The module's weight masked to `sub`'s part, fake-quantized to its grid when run in fp32 below 8 bits.

    Example:
        >>> part_weight(nn.Linear(4, 2), sub).shape  # doctest: +SKIP
        torch.Size([2, 4])
    """
    w = module.weight.detach().float()
    flat = kept_only(w.reshape(w.shape[0], -1), sub.mask)
    if sub.kernel != "int8" and sub.weight_bits < FP32:
        flat = fake_quantize_rows(flat, sub.weight_bits)
    return flat.reshape(w.shape)


def _linear_kind(module: nn.Module) -> str:
    return "conv" if isinstance(module, nn.Conv2d) else "linear"


def lower(candidate: Candidate, ctx: LowerContext) -> nn.Module:
    """Build the modules of `candidate` for `ctx.module`, fused and summed as planned.

    Example:
        >>> lower(plan_.ops["fc1"].candidate("sparse"), LowerContext(fc1, "relu", 128, None, False))  # doctest: +SKIP
    """
    kind = _linear_kind(ctx.module)
    tile = ctx.tile_for[1] if ctx.tile_for is not None and ctx.tile_for[0] == candidate.name else None
    ctx = dataclasses.replace(ctx, tile=tile, tile_for=None, whole=len(candidate.parts) == 1)
    bias = None if ctx.module.bias is None else ctx.module.bias.detach().float()
    if len(candidate.parts) == 1:
        sub = candidate.parts[0]
        return BUILDERS.get(f"{sub.kernel}:{kind}")(sub, bias, ctx.activation, ctx)
    if kind != "linear":
        raise ValueError(f"candidate {candidate.name!r}: only linear ops decompose into summed parts")
    parts = [BUILDERS.get(f"{sub.kernel}:{kind}")(sub, None, "none", ctx) for sub in candidate.parts]
    return SummedParts(parts, bias, ctx.activation)


@register_builder("dense", "linear")
def _dense_linear(sub: SubOp, bias, activation: str, ctx: LowerContext) -> nn.Module:
    return DenseLinear(part_weight(ctx.module, sub), bias, activation, act_bits=sub.act_bits)


@register_builder("shrink", "linear")
def _shrink_linear(sub: SubOp, bias, activation: str, ctx: LowerContext) -> nn.Module:
    return ShrunkLinear(part_weight(ctx.module, sub), bias, sub.mask, activation, act_bits=sub.act_bits)


def _block_rows(mask: torch.Tensor, sub: SubOp) -> int:
    # the rows the pattern's blocks really span, whatever block shape the planner covered it with (groups.py)
    return shared_rows(mask.cpu().numpy(), sub.block[0])


@register_builder("sparse", "linear")
def _sparse_linear(sub: SubOp, bias, activation: str, ctx: LowerContext) -> nn.Module:
    rows = _block_rows(sub.mask, sub)
    # the working copy's weight, masked already, held by the kernel as it is: no two 9 MB copies per BERT FFN op
    zeroed = ctx.masked and ctx.whole and sub.weight_bits >= FP32
    weight = ctx.module.weight.detach() if zeroed else part_weight(ctx.module, sub)
    return SparseLinear(weight, bias, sub.mask, block_rows=rows, activation=activation, cache_dir=ctx.cache_dir,
                        expected_m=ctx.m, zeroed=zeroed, few_rows=ctx.few_rows,
                        **_tile(sub.mask, rows, activation, ctx))


@register_builder("int8", "linear")
def _int8_linear(sub: SubOp, bias, activation: str, ctx: LowerContext) -> nn.Module:
    # scattered patterns: the permute kernel where the CPU has it and the pattern says it wins (kernels/permute_int8.py)
    kind = int8_kernel_for(sub.mask.cpu().numpy())
    # masked already either way (the working copy's weight, or part_weight's copy): the kernel holds it as it is,
    # not a third copy (two 9 MB copies of fresh pages per BERT FFN op before)
    weight = ctx.module.weight.detach() if ctx.masked and ctx.whole else part_weight(ctx.module, sub)
    return kind(weight, bias, sub.mask, block_rows=sub.block[0], activation=activation, cache_dir=ctx.cache_dir,
                weight_bits=sub.weight_bits, act_bits=sub.act_bits, expected_m=ctx.m, zeroed=True,
                few_rows=ctx.few_rows)


@register_builder("dense", "conv")
def _dense_conv(sub: SubOp, bias, activation: str, ctx: LowerContext) -> nn.Module:
    return DenseConv2d(ctx.module, part_weight(ctx.module, sub), sub.mask.reshape(ctx.module.weight.shape),
                       act_bits=sub.act_bits)


@register_builder("shrink", "conv")
def _shrink_conv(sub: SubOp, bias, activation: str, ctx: LowerContext) -> nn.Module:
    return ShrunkConv2d(ctx.module, part_weight(ctx.module, sub), sub.mask.reshape(ctx.module.weight.shape),
                        act_bits=sub.act_bits)


@register_builder("sparse", "conv")
def _sparse_conv(sub: SubOp, bias, activation: str, ctx: LowerContext) -> nn.Module:
    # the pattern-specialized linear kernel over im2col rows (C_out x C_in*kh*kw); with the input size known,
    # the kernel gathers those rows itself (implicit GEMM), else they come from F.unfold
    conv = ctx.module
    weight = part_weight(conv, sub).reshape(conv.out_channels, -1)
    mask = sub.mask.reshape(conv.out_channels, -1)
    rows = _block_rows(mask, sub)
    options = dict(block_rows=rows, activation=activation, cache_dir=ctx.cache_dir, expected_m=ctx.m,
                   **_tile(mask, rows, activation, ctx))
    if ctx.in_shape is not None and len(ctx.in_shape) == 4:
        geometry = ConvGeometry.of(conv, ctx.in_shape[2:])
        return SparseConv2d(conv, ImplicitConvLinear(weight, bias, mask, geometry, **options))
    return SparseConv2d(conv, SparseLinear(weight, bias, mask, **options))


@register_builder("int8", "conv")
def _int8_conv(sub: SubOp, bias, activation: str, ctx: LowerContext) -> nn.Module:
    # int8 implicit GEMM over shifted windows: stride-1 convs whose input size is known (else a build error,
    # which compile reports and skips)
    conv = ctx.module
    if ctx.in_shape is None or len(ctx.in_shape) != 4:
        raise ValueError("int8 conv kernels need the input size (compile records it from the example input)")
    geometry = ConvGeometry.of(conv, ctx.in_shape[2:])
    weight = part_weight(conv, sub).reshape(conv.out_channels, -1)
    linear = Int8ConvLinear(weight, bias, sub.mask.reshape(conv.out_channels, -1), geometry,
                            block_rows=sub.block[0], activation=activation, cache_dir=ctx.cache_dir,
                            weight_bits=sub.weight_bits, act_bits=sub.act_bits, expected_m=ctx.m)
    return SparseConv2d(conv, linear)
