"""Sparse convolution (implicit GEMM over the sparse linear kernels) vs PyTorch's dense convolution.

ResNet-style shapes, batch 8, fp32, 2 threads: 1x1 256->64 at 28x28, 3x3 128->128 at 28x28,
3x3 256->256 at 14x14; patterns 32x32 blocks, 1x32 blocks and unstructured over the weight
viewed as (C_out, C_in x kh x kw), at 50/75/90%. Printed per row: dense ms (torch conv2d on
the masked weight), ours ms (`SparseConv2d` with the measured tile search), x dense, and the
im2col share (ms of the unfold alone, which bounds kxk convs from below). Medians of
`--repeats` interleaved calls after a warm-up, all in one run.

    python benchmarks/conv.py [--quick] [--repeats 7]
"""

from __future__ import annotations

import argparse
import platform

import torch
import torch.nn.functional as F
from torch import nn

from kernels import medians, pattern_mask  # benchmarks/kernels.py: this script's folder is on sys.path
from sparta_explore.kernels import SparseLinear, cpu_flags
from sparta_explore.kernels.sparse_conv import SparseConv2d

SHAPES = [(256, 64, 1, 28), (128, 128, 3, 28), (256, 256, 3, 14)]  # c_in, c_out, kernel, spatial


def time_row(conv: nn.Conv2d, x: torch.Tensor, kept: torch.Tensor, rows: int, repeats: int) -> list[float]:
    """[dense conv, ours, unfold alone] medians in seconds, interleaved."""
    k, c_out = conv.kernel_size[0], conv.out_channels
    w2d = conv.weight.detach().reshape(c_out, -1) * kept
    ours = SparseConv2d(conv, SparseLinear(w2d, conv.bias.detach(), kept, block_rows=rows, tile="auto",
                                           expected_m=x.shape[0] * x.shape[2] * x.shape[3]))
    masked = w2d.reshape(conv.weight.shape)
    fns = [lambda: F.conv2d(x, masked, conv.bias, 1, k // 2), lambda: ours(x)]
    if k > 1:
        fns.append(lambda: F.unfold(x, k, 1, k // 2, 1))
    with torch.no_grad():
        ts = medians(fns, repeats)
    return ts + [0.0] * (3 - len(ts))


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
    print(f"{'conv':>22} {'pattern':>12} {'sparsity':>8} {'dense_ms':>9} {'ours_ms':>8} {'x_dense':>8} "
          f"{'im2col_ms':>9}")
    g = torch.Generator().manual_seed(0)
    for c_in, c_out, k, s in SHAPES:
        conv = nn.Conv2d(c_in, c_out, k, padding=k // 2)
        x = torch.randn(args.batch, c_in, s, s, generator=g)
        for pattern in ("32x32", "1x32", "unstructured"):
            for sparsity in ((0.9,) if args.quick else (0.5, 0.75, 0.9)):
                kept, rows = pattern_mask(c_out, c_in * k * k, pattern, sparsity, g)
                ts = time_row(conv, x, kept, rows, args.repeats)
                name = f"{c_in}->{c_out} {k}x{k} @{s}x{s}"
                print(f"{name:>22} {pattern:>12} {sparsity:>8.2f} {ts[0] * 1e3:>9.2f} {ts[1] * 1e3:>8.2f} "
                      f"{ts[0] / ts[1]:>8.2f} {ts[2] * 1e3:>9.2f}")


if __name__ == "__main__":
    main()
