"""Sparse convolution (implicit GEMM over the sparse linear kernels) vs PyTorch's dense convolution.

ResNet-style shapes, batch 8, fp32, 2 threads: 1x1 256->64 at 28x28, 3x3 64->64 at 56x56,
3x3 128->128 at 28x28, 3x3 256->256 at 14x14, 3x3 stride 2 128->256 at 28x28, and the
digits CNN's 3x3 16->32 at 8x8; patterns 32x32 blocks, 1x32 blocks and unstructured over
the weight viewed as (C_out, C_in x kh x kw), at 50/75/90%. Printed per row: dense ms
(torch conv2d on the masked weight), ours ms (`ImplicitConvLinear`: the kernel gathers its
tiles from NCHW; shifted windows for stride 1), x dense, the old route (the same pattern
as a row-major kernel over `F.unfold` rows) with its ratio to ours, ours int8
(`Int8ConvLinear`, stride 1: each image on one 8-bit grid, 8-bit weights) with its ratio to
dense, and the paths that ran. Medians of `--repeats` interleaved calls after a warm-up,
all in one run.

    python benchmarks/conv.py [--quick] [--repeats 7]
"""

from __future__ import annotations

import argparse
import math
import platform

import torch
import torch.nn.functional as F
from torch import nn

from kernels import medians, pattern_mask  # benchmarks/kernels.py: this script's folder is on sys.path
from sparta_explore.kernels import SparseLinear, cpu_flags
from sparta_explore.kernels.conv_geometry import ConvGeometry
from sparta_explore.kernels.sparse_conv import ImplicitConvLinear, Int8ConvLinear, SparseConv2d

SHAPES = [(256, 64, 1, 1, 28), (64, 64, 3, 1, 56), (128, 128, 3, 1, 28), (256, 256, 3, 1, 14), (128, 256, 3, 2, 28),
          (16, 32, 3, 1, 8)]  # c_in, c_out, kernel, stride, spatial


def time_row(conv: nn.Conv2d, x: torch.Tensor, kept: torch.Tensor, rows: int, repeats: int) -> tuple[list, str]:
    """[dense conv, implicit GEMM, unfold route, int8 implicit GEMM (nan: stride > 1)] medians in seconds,
    interleaved; and the kernels' paths."""
    c_out, m = conv.out_channels, x.shape[0] * x.shape[2] * x.shape[3]
    w2d = conv.weight.detach().reshape(c_out, -1) * kept
    bias = conv.bias.detach()
    geometry = ConvGeometry.of(conv, x.shape[2:])
    implicit = SparseConv2d(conv, ImplicitConvLinear(w2d, bias, kept, geometry, block_rows=rows, tile="auto",
                                                     expected_m=m))
    unfold = SparseConv2d(conv, SparseLinear(w2d, bias, kept, block_rows=rows, tile="auto", expected_m=m))
    masked = w2d.reshape(conv.weight.shape)
    fns = [lambda: F.conv2d(x, masked, conv.bias, conv.stride, conv.padding), lambda: implicit(x), lambda: unfold(x)]
    int8 = None
    if conv.stride == (1, 1):
        int8 = SparseConv2d(conv, Int8ConvLinear(w2d, bias, kept, geometry, block_rows=rows, expected_m=m))
        fns.append(lambda: int8(x))
    with torch.no_grad():
        ts = medians(fns, repeats) + [math.nan] * (4 - len(fns))
        err = float((implicit(x) - F.conv2d(x, masked, conv.bias, conv.stride, conv.padding)).abs().max())
        err8 = math.nan if int8 is None else float((int8(x) - int8.reference(x)).abs().max())
    path = "windows" if geometry.windowed else "pixels" if geometry.flat else "gather"
    path8 = "-" if int8 is None else int8.linear.dot_path
    return ts, f"{path} err={err:.0e} | int8 {path8} err={err8:.0e}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="90%% only")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(2)
    flags = cpu_flags()
    print(f"cpu={platform.machine()} avx512={'avx512f' in flags} threads=2 torch={torch.__version__} "
          f"batch={args.batch}")
    print(f"{'conv':>24} {'pattern':>12} {'sparsity':>8} {'dense_ms':>9} {'ours_ms':>8} {'x_dense':>8} "
          f"{'unfold_ms':>9} {'x_unfold':>8} {'int8_ms':>8} {'x_dense':>8}  paths")
    g = torch.Generator().manual_seed(0)
    for c_in, c_out, k, stride, s in SHAPES:
        conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2)
        x = torch.randn(args.batch, c_in, s, s, generator=g)
        for pattern in ("32x32", "1x32", "unstructured"):
            for sparsity in ((0.9,) if args.quick else (0.5, 0.75, 0.9)):
                kept, rows = pattern_mask(c_out, c_in * k * k, pattern, sparsity, g)
                ts, path = time_row(conv, x, kept, rows, args.repeats)
                name = f"{c_in}->{c_out} {k}x{k}/{stride} @{s}x{s}"
                print(f"{name:>24} {pattern:>12} {sparsity:>8.2f} {ts[0] * 1e3:>9.2f} {ts[1] * 1e3:>8.2f} "
                      f"{ts[0] / ts[1]:>8.2f} {ts[2] * 1e3:>9.2f} {ts[2] / ts[1]:>8.2f} {ts[3] * 1e3:>8.2f} "
                      f"{ts[0] / ts[3]:>8.2f}  {path}", flush=True)


if __name__ == "__main__":
    main()
