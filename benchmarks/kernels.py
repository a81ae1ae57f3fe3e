"""Sparse linear kernels vs dense MKL, MKL CSR and torch dynamic int8, measured in one run.

Shapes: BERT-base 768->3072, 3072->768, 768->768 at M = 4096 and 128; dense, then sparsity 50/75/90/95%;
patterns 32x32 blocks, 1x32 blocks, unstructured. Every time is the median of `--repeats`
runs after a warm-up, baseline and candidate interleaved; results are dropped after each
call, as in a model, so our kernels reuse their output memory (kernels/output_pool.py) while
torch's ops allocate theirs. Prints ratios over dense fp32 and effective GFLOP/s.
Ours fp32 uses the measured tile search (`tile="auto"`, cached); ours int8 quantizes
activations per row and weights per output row (exact int32 accumulation); w4 is the same
kernel on a 4-bit weight grid (the calibrated default), with the variant it picked;
`i8path` is the instruction path ours int8 ran (a VNNI mode where the CPU has one) and
`avx2_8_x` the same int8 kernel forced to the AVX2 path (`dot=None`), side by side.
Run: `python benchmarks/kernels.py [--quick] [--repeats 5] [--reuse-memory]`.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.kernels import Int8SparseLinear, SparseLinear, cpu_flags, vector_width


def pattern_mask(n: int, k: int, pattern: str, sparsity: float, g: torch.Generator) -> tuple[torch.Tensor, int]:
    block = {"dense": (32, 32), "32x32": (32, 32), "1x32": (1, 32), "unstructured": (1, 1)}[pattern]
    grid = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=g) >= sparsity
    return grid.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:n, :k], block[0]


WARM_SECONDS = 0.25  # each callable runs this long before it is timed: a short call's first few run cold


def warm(fn, seconds: float = WARM_SECONDS, calls: int = 3) -> float:
    """Call `fn` at least `calls` times and for at least `seconds` (at M = 128 the first five calls of a fused FFN
    took 1.05-1.5x the steady time, and a median of 9 after one warm-up call moved 0.29-0.38 ms between runs).
    Returns the mean seconds of a call."""
    start, done = time.perf_counter(), 0
    while done < calls or time.perf_counter() - start < seconds:
        fn()
        done += 1
    return (time.perf_counter() - start) / done


def medians(fns: list, repeats: int) -> list[float]:
    for fn in fns:
        warm(fn)
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):  # interleaved: machine noise hits every candidate alike
            start = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def tile_name(cfg) -> str:
    """rows x vectors / single-row vectors, P when K is processed in L1 panels, S for the segment layout."""
    suffix = "S" if cfg.layout == "segments" else "P" if cfg.panel else ""
    return f"{cfg.rows}x{cfg.vectors}/{cfg.single_vectors}{suffix}"


def candidates(x, masked, b, ours, csr, q, ours8, ours4, avx2_8) -> list:
    """dense fp32 (MKL), ours fp32, MKL CSR, torch dynamic int8, ours int8, ours int8 on a 4-bit weight grid,
    ours int8 on the AVX2 path."""
    return [lambda: F.linear(x, masked, b), lambda: ours(x), lambda: (csr @ x.t()).t() + b, lambda: q(x),
            lambda: ours8(x), lambda: ours4(x), lambda: avx2_8(x)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="only 90% and 50%, M=4096 and 128, FFN shapes")
    parser.add_argument("--reuse-memory", action="store_true",
                        help="kernels.allocator.keep_freed_memory() first (applies to every candidate alike)")
    args = parser.parse_args()
    if args.reuse_memory:
        from sparta_explore.kernels.allocator import keep_freed_memory

        print(f"keep_freed_memory: {keep_freed_memory()}")
    warnings.simplefilter("ignore")
    flags = cpu_flags()
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"
    print(f"cpu={platform.processor() or platform.machine()} isa={isa} vnni={'avx512_vnni' in flags} "
          f"avx_vnni={'avx_vnni' in flags} "
          f"lanes={vector_width()} threads={torch.get_num_threads()} torch={torch.__version__}")
    shapes = [(768, 3072), (3072, 768)] + ([] if args.quick else [(768, 768)])
    sparsities = (0.5, 0.9) if args.quick else (0.5, 0.75, 0.9, 0.95)
    print(f"{'K->N':11s} {'M':>5s} {'pattern':>12s} {'sparsity':>8s} {'dense_ms':>9s} {'ours_ms':>8s} {'x_dense':>7s} "
          f"{'GF/s_eff':>8s} {'csr_x':>6s} {'int8dyn_x':>9s} {'ours8_x':>7s} {'avx2_8_x':>8s} {'i8path':>12s} "
          f"{'w4_x':>7s} {'w4var':>5s} {'tile':>7s}")
    g = torch.Generator().manual_seed(0)
    for k, n in shapes:
        w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        for m in (4096, 128):
            x = torch.randn(m, k, generator=g)
            cases = [("dense", 0.0)] + [(p, s) for p in ("32x32", "1x32", "unstructured") for s in sparsities]
            for pattern, sparsity in cases:
                kept, rows = pattern_mask(n, k, pattern, sparsity, g)
                masked = w * kept
                ours = SparseLinear(w, b, kept, block_rows=rows, tile="auto", expected_m=m)
                ours8 = Int8SparseLinear(w, b, kept, block_rows=rows, expected_m=m)
                ours4 = Int8SparseLinear(w, b, kept, block_rows=rows, weight_bits=4, expected_m=m)
                avx2_8 = Int8SparseLinear(w, b, kept, block_rows=rows, dot=None, expected_m=m)
                csr = masked.to_sparse_csr()
                lin = nn.Linear(k, n)
                with torch.no_grad():
                    lin.weight.copy_(masked)
                    lin.bias.copy_(b)
                q = torch.ao.quantization.quantize_dynamic(nn.Sequential(lin), {nn.Linear}, dtype=torch.qint8)
                with torch.no_grad():
                    t_dense, t_ours, t_csr, t_q, t_8, t_4, t_a8 = medians(
                        candidates(x, masked, b, ours, csr, q, ours8, ours4, avx2_8), args.repeats)
                flops = 2.0 * m * k * n * float(kept.float().mean())
                state = "" if ours.fallback_reason is None else " (fallback)"
                print(f"{k:4d}->{n:<5d} {m:5d} {pattern:>12s} {sparsity:8.2f} {t_dense * 1e3:9.2f} "
                      f"{t_ours * 1e3:8.2f} {t_dense / t_ours:7.2f} {flops / t_ours / 1e9:8.0f} "
                      f"{t_dense / t_csr:6.2f} {t_dense / t_q:9.2f} {t_dense / t_8:7.2f} {t_dense / t_a8:8.2f} "
                      f"{ours8.dot_path:>12s} {t_dense / t_4:7.2f} {ours4.variant:>5s} {tile_name(ours.tile)}{state}",
                      flush=True)


if __name__ == "__main__":
    main()
